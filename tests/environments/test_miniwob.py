"""MiniWoB++ in headless Chromium: the suite loader, scripted policies that read the text rendering
and act through the session API, the verifier, process clean-up and reproducibility.

Browser starts are the cost (~1-2 s each): one loader run (3 browsers) and one session per solved
env (3 browsers), each reused for the wrong-action episode via ``reset``.
"""

from __future__ import annotations

import re

import psutil
import pytest

from tasks.config import SuiteConfig
from tasks.records.suites.base import load_suite
from tasks.records.suites.miniwob import env_list, instance_seed
from tasks.records.verifiers import VerifierError, grade
from tasks.environments.browser import BrowserError, open_browser
from tasks.environments.browser.miniwob import ENDED_MESSAGE, MiniWoBSession, _running
from tests.facilities import require_chromium

ENVS = "click-button,enter-text,click-checkboxes"
LINE = re.compile(r'^\s*\[(\d+)\] (\S+)(?: "((?:[^"\\]|\\.)*)")?(.*)$')


class Ctx:
    def __init__(self, browser):
        self.browser = browser

    def sandbox(self):
        raise AssertionError("miniwob grading must not need a sandbox")


def parse(text: str) -> list[tuple[int | None, str, str]]:
    """Rendering -> [(ref or None for a text fragment, tag, text)] in page order."""
    out = []
    for line in text.splitlines()[1:]:
        m = LINE.match(line)
        if m:
            out.append((int(m.group(1)), m.group(2), m.group(3) or ""))
        else:
            out.append((None, "t", line.strip().strip('"')))
    return out


def ref_of(els, tag_prefix: str, text: str | None = None) -> int:
    for ref, tag, t in els:
        if ref is not None and tag.startswith(tag_prefix) and (text is None or t == text):
            return ref
    raise AssertionError(f"no {tag_prefix} {text!r} in {els}")


def solve(sess: MiniWoBSession, env: str, right: bool | str) -> None:
    """A scripted policy for ``env`` that reads only ``observe()``; ``right=False`` makes every
    choice wrong, ``"partial"`` (click-checkboxes) all but one right."""
    text = sess.observe()
    utter = text.splitlines()[0]
    els = parse(text)
    if env == "click-button":
        want = re.search(r'Click on the "(.*)" button', utter).group(1)
        if right:
            sess.click(str(ref_of(els, "button", want)))
        else:
            wrong = next(r for r, tag, t in els if tag.startswith("button") and t != want)
            sess.click(f"[{wrong}]")
    elif env == "enter-text":
        want = re.search(r'Enter "(.*)" into', utter).group(1)
        after = sess.type(str(ref_of(els, "input_text")), want if right else want + "x")
        assert f'value="{want if right else want + "x"}" focused' in after
        sess.click(str(ref_of(els, "button", "Submit")))
    elif env == "click-checkboxes":
        m = re.search(r"Select (.*) and click Submit", utter).group(1)
        targets = set() if m == "nothing" else {w.strip() for w in m.split(",")}
        label_of, last = {}, None
        for ref, tag, t in els:
            if ref is not None and tag.startswith("input_checkbox"):
                last = ref
            elif ref is None and last is not None:
                label_of[t], last = last, None
        assert targets <= set(label_of), (targets, label_of)
        if right == "partial":  # flip the first box: one of n wrong
            first = sorted(label_of)[0]
            chosen = targets ^ {first}
        else:
            chosen = targets if right else set(label_of) - targets
        for word in sorted(chosen):
            after = sess.click(str(label_of[word]))
            assert re.search(rf"\[{label_of[word]}\] input_checkbox\S* checked", after)
        sess.click(str(ref_of(els, "button", "Submit")))
    else:
        raise AssertionError(env)


def live_pids(sess: MiniWoBSession) -> list[psutil.Process]:
    root = psutil.Process(sess._env.instance.driver.service.process.pid)
    return [root, *root.children(recursive=True)]


@pytest.fixture(scope="module")
def tasks():
    require_chromium()
    return load_suite(SuiteConfig(source="miniwob", name=ENVS, size=6, seed=11))


def test_loader_rows(tasks):
    assert [t.task_id for t in tasks] == [
        "miniwob/click-button/s11/0", "miniwob/click-button/s11/1", "miniwob/enter-text/s11/0",
        "miniwob/enter-text/s11/1", "miniwob/click-checkboxes/s11/0", "miniwob/click-checkboxes/s11/1"]
    for t in tasks:
        assert t.environment == "browser" and t.verifier_kind == "miniwob" and t.workspace == {}
        env, k = t.metadata["env"], t.metadata["instance"]
        assert t.verifier_spec == {"env": env, "seed": instance_seed(11, env, k)}
        assert t.suite == f"miniwob/{env}"
    assert re.fullmatch(r'Click on the ".+" button\.', tasks[0].instruction)
    assert re.fullmatch(r'Enter ".+" into the text field and press Submit\.', tasks[2].instruction)
    assert tasks[0].instruction != tasks[1].instruction or tasks[0].task_hash != tasks[1].task_hash


def test_instance_seeds_are_stable_and_independent():
    # the formula, pinned: a change would silently re-seed every frozen MiniWoB task
    assert instance_seed(0, "click-button", 0) == int.from_bytes(
        __import__("hashlib").sha256(b"miniwob/0/click-button/0").digest()[:4], "big") & 0x7FFFFFFF
    assert len({instance_seed(0, "click-button", k) for k in range(100)}) == 100
    assert instance_seed(1, "click-button", 0) != instance_seed(0, "click-button", 0)


@pytest.mark.parametrize("env_index", [0, 2, 4], ids=["click-button", "enter-text", "click-checkboxes"])
def test_scripted_policy_solves_and_wrong_action_fails(tasks, env_index):
    task = tasks[env_index]
    row = task.to_row("train")
    env = task.metadata["env"]
    sess = open_browser(row, seed=0)  # a fresh browser: its utterance must match the loader's
    try:
        first = sess.observe()
        assert first.splitlines()[0] == f"Task: {task.instruction}"
        assert not sess.done() and sess.reward() == 0.0
        solve(sess, env, right=True)
        assert sess.done() and sess.raw_reward() == 1.0
        assert grade("miniwob", row["verifier_spec"], None, Ctx(sess)) == 1.0
        assert sess.click("4") == ENDED_MESSAGE and sess.observe() == ENDED_MESSAGE

        # the same instance again on the open page: identical to the fresh browser's, then fail it
        assert sess.reset(task.verifier_spec["seed"]) == first
        solve(sess, env, right=False)
        assert sess.done() and sess.raw_reward() == -1.0
        assert grade("miniwob", row["verifier_spec"], None, Ctx(sess)) == 0.0
        if env == "click-checkboxes":  # partial credit: raw (n-2)/n for one of n boxes wrong
            sess.reset(task.verifier_spec["seed"])
            solve(sess, env, right="partial")
            n = len(re.findall(r"input_checkbox", first))
            assert sess.raw_reward() == pytest.approx((n - 2) / n)
            assert sess.reward() == pytest.approx(((n - 2) / n + 1) / 2)
        last = sess.reward()
    finally:
        sess.close()
    assert sess.reward() == last  # still readable after close


def test_session_messages_network_and_cleanup(tasks):
    task = tasks[2]  # enter-text
    sess = MiniWoBSession(task.verifier_spec["env"], task.verifier_spec["seed"])
    profile = sess._tmp
    try:
        page = sess.observe()
        refs = sorted(int(r) for r in re.findall(r"^\s*\[(\d+)\]", page, re.M))
        for bad in ("999", "abc", "-1", ""):
            msg = sess.click(bad)
            assert msg.startswith(f"No element [{bad}] on the page") and ", ".join(map(str, refs)) in msg
            assert sess.type(bad, "x").startswith("No element")
        assert sess.observe() == page and not sess.done()  # the bad refs changed nothing
        assert sess.timings["start"] > 0 and sess.timings["reset"] > 0
        # no network: any http URL hits the dead proxy at once
        driver = sess._env.instance.driver
        with pytest.raises(Exception, match="ERR_PROXY_CONNECTION_FAILED"):
            driver.get("http://192.0.2.1/")
        procs = live_pids(sess)
        assert any(p.name().startswith("chrom") for p in procs[1:])
    finally:
        sess.close()
    assert [p.pid for p in procs if _running(p)] == []
    leftovers = []
    for p in psutil.process_iter(["cmdline"]):
        if profile in " ".join(p.info["cmdline"] or []) and _running(p):
            leftovers.append(p.pid)
    assert leftovers == []
    with pytest.raises(BrowserError, match="closed"):
        sess.observe()
    sess.close()  # idempotent


def test_verifier_needs_the_matching_browser(tasks):
    spec = tasks[0].verifier_spec
    with pytest.raises(VerifierError, match="no browser"):
        grade("miniwob", spec, "answer", None)
    with pytest.raises(VerifierError, match="no browser"):
        grade("miniwob", spec, "answer", Ctx(None))

    sess = MiniWoBSession.__new__(MiniWoBSession)  # the right kind of session, another instance
    sess.env, sess.seed = spec["env"], spec["seed"] + 1
    with pytest.raises(VerifierError, match="the browser shows"):
        grade("miniwob", spec, None, Ctx(sess))


def test_open_browser_refuses_a_changed_utterance(tasks):
    row = tasks[0].to_row("train")
    row["instruction"] = "Click on the button that was never there."
    with pytest.raises(BrowserError, match="miniwob package changed"):
        open_browser(row, seed=0)


def test_env_list_validation():
    assert env_list("basic") == ["click-button", "click-link", "enter-text", "focus-text", "click-checkboxes"]
    assert env_list(" click-button , enter-text") == ["click-button", "enter-text"]
    with pytest.raises(ValueError, match="not in the miniwob package"):
        env_list("click-button,no-such-task")
    with pytest.raises(ValueError, match="nondeterministic"):
        env_list("choose-date")
    with pytest.raises(ValueError, match="HTTP server"):
        env_list("flight.AA")
    with pytest.raises(ValueError, match="listed twice"):
        env_list("click-button,click-button")
    with pytest.raises(ValueError, match="empty entries"):
        env_list("click-button,,enter-text")
    with pytest.raises(ValueError, match="takes no params"):
        load_suite(SuiteConfig(source="miniwob", name="basic", size=1, params={"x": 1}))


def test_missing_chromium_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("MINIWOB_CHROME_BINARY", str(tmp_path / "no-chromium"))
    monkeypatch.setenv("MINIWOB_CHROMEDRIVER", str(tmp_path / "no-chromedriver"))
    with pytest.raises(BrowserError, match="setup-chromium.sh"):
        MiniWoBSession("click-button", 0)
