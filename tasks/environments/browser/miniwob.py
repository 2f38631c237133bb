"""MiniWoB++ pages in headless Chromium, driven through the ``miniwob`` package's own action API.

One :class:`MiniWoBSession` is one Chromium + chromedriver pair showing one MiniWoB++ task page
(``miniwob/html/miniwob/<env>.html`` from the pinned ``miniwob`` package, loaded as a ``file://``
URL). The page is reset to an *instance* by seeding its JavaScript RNG (``Math.seedrandom(seed)``,
the package's own reset); the task's JavaScript generates the problem, checks the agent's actions
and reports the reward (``WOB_RAW_REWARD_GLOBAL``).

Choices (and why):

* **No wall-clock limit.** MiniWoB++ pages end an episode after 7-30 s with reward -1 and scale a
  success by the time left. An LLM agent on a CPU needs seconds per step, so that clock would
  measure the machine, not the agent, and make rewards irreproducible. Each episode start sets
  ``core.EPISODE_MAX_TIME`` to 2**31-1 ms (the largest ``setTimeout`` delay); the harness's step
  budget bounds the episode instead.
* **Reward.** :meth:`MiniWoBSession.reward` is the task's *raw* reward (without the time scaling)
  ``r`` in [-1, 1], mapped affinely to ``(r + 1) / 2`` in [0, 1] once the task has ended, and 0.0
  while it has not (an unfinished episode is what MiniWoB++ scores as a time-out, -1). For the
  usual +1/-1 tasks this is success 1 / failure 0, so a mean reward is the success rate that the
  MiniWoB++ literature reports; tasks with partial credit keep it on the same scale.
* **Rendering.** The page's DOM as the package reads it (``core.getDOMInfo``: visible elements
  only), one line per element, indented by depth: ``[ref] tag#id.class "text" value="..."``;
  checkboxes and radio buttons show ``checked``/``unchecked``, the focused element ``focused``.
  The refs are the package's own per-episode element refs (stable within an episode). Text
  fragments between elements are quoted lines without a ref (they cannot be acted on). MiniWoB's
  page scaffolding (``body``, ``#wrap``, ``#area``) is left out, its children shown. The first line
  is ``Task: <utterance>``.
* **Actions.** ``click(ref)`` is the package's ``CLICK_ELEMENT`` action (``core.elementClick``:
  click and focus). ``type(ref, text)`` replaces the element's content as a user would: it clicks
  the element, presses Ctrl+A, then types ``text`` key by key (``TYPE_TEXT``); a newline in
  ``text`` presses Enter.
* **One browser per session.** Starting Chromium costs ~1.5 s (2 busy cores), a reset on an open
  page ~0.05 s, a click ~0.02 s, a type ~0.06 s, close ~0.4 s (``benchmarks/miniwob_session.py``).
  Resets on an open page are clean for the deterministic tasks once the focus is dropped (which
  each episode start does: the page keeps some elements, e.g. a focused Submit button, across
  episodes): the same rendering for a seed as a fresh browser (tested), which :func:`tasks.records.suites.miniwob.load` uses to read many
  instances with one browser. Episodes do not share browsers: :meth:`MiniWoBSession.close` quits
  Chromium and chromedriver, so an episode can never see another's page state.
* **No network.** Only ``file://`` pages are loaded; Chromium gets a dead proxy
  (``127.0.0.1:9``), a resolver that resolves nothing, background networking, sync, component
  updates and first-run tasks off, and a fresh profile directory removed on close. It runs with
  ``--no-sandbox`` (needed as root, as in CI): it only ever renders the pinned package's static
  pages, never model-written code.

Chromium and chromedriver are found through ``MINIWOB_CHROME_BINARY`` / ``MINIWOB_CHROMEDRIVER``
(the package's variables) or else ``chromium`` / ``chromedriver`` on ``PATH``
(``scripts/setup-chromium.sh`` installs Debian's). An explicit driver path keeps Selenium from
trying to download one.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
import time
from typing import Any

from tasks.environments.browser import BrowserError, register_browser

# Longest delay setTimeout accepts (ms); larger values overflow and fire at once.
_NO_TIME_LIMIT_MS = 2**31 - 1
# MiniWoB page scaffolding that the rendering leaves out (its children are shown).
_SCAFFOLD_IDS = frozenset({"wrap", "area"})
_CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-domain-reliability",
    "--disable-client-side-phishing-detection",
    "--disable-quic",
    "--metrics-recording-only",
    "--proxy-server=127.0.0.1:9",
    "--host-resolver-rules=MAP * ~NOTFOUND",
)
ENDED_MESSAGE = "The task has ended; no further actions are possible."


def chromium_paths() -> tuple[str, str]:
    """(chromium binary, chromedriver binary) as absolute paths.

    Raises:
        BrowserError: either is missing (the message says how to install them).
    """
    chrome = os.environ.get("MINIWOB_CHROME_BINARY") or shutil.which("chromium")
    driver = os.environ.get("MINIWOB_CHROMEDRIVER") or shutil.which("chromedriver")
    missing = [n for n, p in (("chromium", chrome), ("chromedriver", driver)) if not p or not os.path.exists(p)]
    if missing:
        raise BrowserError(f"MiniWoB++ needs {' and '.join(missing)}: run scripts/setup-chromium.sh (Debian packages "
                           "chromium, chromium-driver) or set MINIWOB_CHROME_BINARY and MINIWOB_CHROMEDRIVER")
    return str(chrome), str(driver)


@functools.cache
def _env_class() -> type:
    """The package's MiniWoBEnvironment with our Chromium start-up and no page clock (built lazily:
    importing selenium and miniwob costs ~0.3 s)."""
    from miniwob.environment import MiniWoBEnvironment
    from miniwob.selenium_instance import SeleniumInstance
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.wait import WebDriverWait

    class _Instance(SeleniumInstance):
        profile_dir: str = ""
        log_path: str = ""

        def create_driver(self) -> None:  # replaces the package's: our flags, paths and profile
            chrome, driver_path = chromium_paths()
            opts = webdriver.ChromeOptions()
            for flag in _CHROMIUM_FLAGS:
                opts.add_argument(flag)
            opts.add_argument(f"--user-data-dir={self.profile_dir}")
            opts.binary_location = chrome
            service = Service(executable_path=driver_path, log_output=self.log_path)
            self.driver = webdriver.Chrome(service=service, options=opts)  # quits itself if it fails
            try:
                self.driver.implicitly_wait(5)
                self.driver.get(self.url)
                WebDriverWait(self.driver, 10).until(EC.element_to_be_clickable((By.ID, self.SYNC_SCREEN_ID)))
                self.inner_width, self.inner_height = self.driver.execute_script(
                    "return [window.innerWidth, window.innerHeight];")
            except BaseException:
                self.driver.quit()
                raise

        def begin_task(self, seed: Any = None) -> None:
            # the focus would otherwise survive into the next episode (on elements the task keeps,
            # e.g. a Submit button), unlike in a freshly loaded page
            self.driver.execute_script(f"core.EPISODE_MAX_TIME = {_NO_TIME_LIMIT_MS};"
                                       "if (document.activeElement) document.activeElement.blur();")
            super().begin_task(seed=seed)

    class _Env(MiniWoBEnvironment):
        def __init__(self, profile_dir: str, log_path: str, **kwargs: Any):
            self.profile_dir, self.log_path = profile_dir, log_path
            super().__init__(**kwargs)

        def _hard_reset_instance(self) -> None:
            if getattr(self, "instance", None) is not None:
                self.instance.close()
            inst = _Instance(index=0, **self.instance_kwargs)
            inst.profile_dir, inst.log_path = self.profile_dir, self.log_path
            self.instance = inst
            inst.start()

    return _Env


def env_names() -> dict[str, bool]:
    """{MiniWoB++ env name: deterministic?} for every task the package registers (``click-button``,
    ...). ``deterministic`` is False where the package marks the env ``nondeterministic`` (the same
    seed can give a different page) or the env needs an HTTP server (``flight.*``)."""
    import gymnasium as gym
    import miniwob  # noqa: F401  (registers the envs)

    out = {}
    for key, spec in gym.registry.items():
        if key.startswith("miniwob/") and key.endswith("-v1"):
            name = key[len("miniwob/"):-len("-v1")]
            out[name] = not spec.nondeterministic and not name.startswith("flight.")
    return out


def check_env_name(name: str) -> None:
    """Raise ValueError unless ``name`` is a deterministic MiniWoB++ env this module can run."""
    known = env_names()
    if name not in known:
        raise ValueError(f"MiniWoB++ env {name!r} is not in the miniwob package; known: {sorted(known)}")
    if not known[name]:
        raise ValueError(f"MiniWoB++ env {name!r} is not reproducible for a seed (the package marks it "
                         "nondeterministic, or it needs an HTTP server): it cannot be a frozen task")


def render(utterance: str, root: Any) -> tuple[str, set[int]]:
    """The text rendering of a page and the refs it shows.

    Args:
        utterance: the task's instruction as the page shows it.
        root: the page's ``miniwob.dom.DOMElement`` tree (``core.getDOMInfo``).

    Returns:
        (text, refs): ``text`` starts with ``Task: <utterance>``, then one line per element (see the
        module docstring for the format); ``refs`` are the element refs shown.
    """
    lines = [f"Task: {utterance}"]
    refs: set[int] = set()

    def walk(el: Any, depth: int) -> None:
        pad = "  " * depth
        if el.tag == "t":  # a text fragment between elements: no ref, cannot be acted on
            if el.text:
                lines.append(pad + json.dumps(el.text, ensure_ascii=False))
            return
        if el.tag == "body" or el.id in _SCAFFOLD_IDS:
            for c in el.children:
                walk(c, depth)
            return
        name = el.tag + (f"#{el.id}" if el.id else "")
        if isinstance(el.classes, str) and el.classes and el.classes != "SVG_CLASS":
            name += "".join(f".{c}" for c in el.classes.split())
        parts = [f"[{el.ref}]", name]
        if el.text:
            parts.append(json.dumps(el.text, ensure_ascii=False))
        if isinstance(el.value, bool):
            parts.append("checked" if el.value else "unchecked")
        elif el.value is not None:
            parts.append("value=" + json.dumps(str(el.value), ensure_ascii=False))
        if el.focused:
            parts.append("focused")
        lines.append(pad + " ".join(parts))
        refs.add(int(el.ref))
        for c in el.children:
            walk(c, depth + 1)

    walk(root, 0)
    return "\n".join(lines), refs


def _parse_ref(ref: Any) -> int | None:
    s = str(ref).strip()
    if s.startswith("[") and s.endswith("]"):
        s = s[1:-1].strip()
    try:
        return int(s)
    except ValueError:
        return None


class MiniWoBSession:
    """One MiniWoB++ task page in its own headless Chromium (a ``BrowserSession``).

    Args:
        env: MiniWoB++ env name (``click-button``); must be deterministic (:func:`check_env_name`).
        seed: instance seed (any int; the page's ``Math.seedrandom`` gets it).

    Raises:
        ValueError: unknown or nondeterministic ``env``.
        BrowserError: Chromium or chromedriver missing, or failing to start or load the page.

    Attributes:
        env, seed: the current instance. ``utterance``: its task text. ``timings``: seconds spent in
        ``start`` (browser start) and the last ``reset``.
    """

    def __init__(self, env: str, seed: int):
        check_env_name(env)
        chromium_paths()
        self.env = env
        self.seed = int(seed)
        self.utterance = ""
        self.timings: dict[str, float] = {}
        self._closed = False
        self._meta: dict[str, Any] = {"done": False, "raw_reward": 0.0}
        self._refs: set[int] = set()
        self._text = ""
        self._tmp = tempfile.mkdtemp(prefix="harnessrl-miniwob-")
        t0 = time.perf_counter()
        try:
            self._env = _env_class()(profile_dir=os.path.join(self._tmp, "profile"),
                                     log_path=os.path.join(self._tmp, "chromedriver.log"),
                                     subdomain=env, action_space_config="all_supported")
        except Exception as e:
            self.close()
            raise BrowserError(f"MiniWoB++ {env}: Chromium failed to start: {type(e).__name__}: {e}"
                               f"{self._log_tail()}") from e
        self.timings["start"] = time.perf_counter() - t0
        self._types = list(self._env.action_space_config.action_types)
        self._keys = list(self._env.action_space_config.allowed_keys)
        self.reset(self.seed)

    # -- episode control ------------------------------------------------------------------------
    def reset(self, seed: int) -> str:
        """Start instance ``seed`` of this env on the open page; returns the new rendering.

        Raises:
            BrowserError: the page failed to reset.
        """
        self._check_open()
        t0 = time.perf_counter()
        try:
            obs, info = self._env.reset(seed=int(seed), options={"record_screenshots": False})
            self._meta = self._env.instance.get_metadata()
        except Exception as e:
            raise BrowserError(f"MiniWoB++ {self.env} seed {seed}: reset failed: {type(e).__name__}: {e}") from e
        self.seed = int(seed)
        self.utterance = str(obs["utterance"])
        self._text, self._refs = render(self.utterance, info["root_dom"])
        self.timings["reset"] = time.perf_counter() - t0
        return self._text

    # -- BrowserSession protocol ----------------------------------------------------------------
    def observe(self) -> str:
        """The page as it is now (re-read from the browser), or :data:`ENDED_MESSAGE` once the task
        has ended."""
        self._check_open()
        if self._meta["done"]:
            return ENDED_MESSAGE
        try:
            self._meta = self._env.instance.get_metadata()
            if self._meta["done"]:
                return ENDED_MESSAGE
            obs, extra = self._env.instance.get_observation(use_cached_fields=True)
        except Exception as e:
            raise BrowserError(f"MiniWoB++ {self.env}: reading the page failed: {type(e).__name__}: {e}") from e
        self._text, self._refs = render(self.utterance, extra["root_dom"])
        return self._text

    def click(self, ref: str) -> str:
        """Click element ``ref`` (``"12"`` or ``"[12]"``); the new rendering, or a message saying why
        nothing happened (unknown ref, task already ended)."""
        r = self._resolve(ref)
        if isinstance(r, str):
            return r
        self._step("CLICK_ELEMENT", ref=r)
        return self._after()

    def type(self, ref: str, text: str) -> str:
        """Replace the content of element ``ref`` with ``text``: click it, Ctrl+A, type ``text``
        (a ``\\n`` presses Enter). The new rendering, or a message saying why nothing happened."""
        r = self._resolve(ref)
        if isinstance(r, str):
            return r
        self._step("CLICK_ELEMENT", ref=r)
        if not self._meta["done"]:
            self._step("PRESS_KEY", key=self._keys.index("C-a"))
        for i, chunk in enumerate(str(text).split("\n")):
            if self._meta["done"]:
                break
            if i:
                self._step("PRESS_KEY", key=self._keys.index("<Enter>"))
            if chunk and not self._meta["done"]:
                self._step("TYPE_TEXT", text=chunk)
        return self._after()

    def done(self) -> bool:
        """True once the task's page has ended the episode (success or failure)."""
        if not self._closed and not self._meta["done"]:
            self._refresh_meta()
        return bool(self._meta["done"])

    def reward(self) -> float:
        """The task's raw reward r in [-1, 1] mapped to (r + 1) / 2 once ended; 0.0 before (a float
        in [0, 1]). Works after :meth:`close` too (the last state read is kept)."""
        if not self.done():
            return 0.0
        r = float(self._meta["raw_reward"])
        return min(1.0, max(0.0, (r + 1.0) / 2.0))

    def raw_reward(self) -> float | None:
        """The task's own raw reward in [-1, 1] once ended, else None (for analysis)."""
        return float(self._meta["raw_reward"]) if self.done() else None

    def close(self) -> None:
        """Quit chromedriver and Chromium (every process they started is gone when this returns)
        and remove the profile directory. Idempotent."""
        if self._closed:
            return
        self._closed = True
        env = getattr(self, "_env", None)
        inst = getattr(env, "instance", None) if env is not None else None
        driver = getattr(inst, "driver", None)
        procs = []
        if driver is not None:
            import psutil

            if not self._meta["done"]:
                try:
                    self._meta = inst.get_metadata()
                except Exception:  # the browser already died: keep the last state read
                    pass
            proc = getattr(getattr(driver, "service", None), "process", None)
            if proc is not None:
                try:
                    root = psutil.Process(proc.pid)
                    procs = [root, *root.children(recursive=True)]
                except psutil.NoSuchProcess:
                    procs = []
            try:
                driver.quit()
            except Exception:  # quitting a crashed browser can fail; the processes are ended below
                pass
            alive = _wait_exited(procs, timeout_s=3.0)
            for p in alive:
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass
            left = _wait_exited(alive, timeout_s=3.0)
            if left:
                raise BrowserError(f"MiniWoB++ {self.env}: processes {[p.pid for p in left]} survived SIGKILL")
        shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> "MiniWoBSession":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- internals ------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise BrowserError(f"MiniWoB++ {self.env}: the session is closed")

    def _refresh_meta(self) -> None:
        try:
            self._meta = self._env.instance.get_metadata()
        except Exception as e:
            raise BrowserError(f"MiniWoB++ {self.env}: reading the page failed: {type(e).__name__}: {e}") from e

    def _resolve(self, ref: Any) -> int | str:
        self._check_open()
        if self.done():
            return ENDED_MESSAGE
        r = _parse_ref(ref)
        if r is None or r not in self._refs:
            shown = ", ".join(str(x) for x in sorted(self._refs))
            return f"No element [{ref}] on the page; the page's references are: {shown}."
        return r

    def _step(self, action_type: str, **fields: Any) -> None:
        action = {"action_type": self._types.index(action_type), **fields}
        try:
            obs, _reward, done, _trunc, info = self._env.step(action)
        except Exception as e:
            raise BrowserError(f"MiniWoB++ {self.env}: {action_type} failed: {type(e).__name__}: {e}") from e
        self._meta = {k: info[k] for k in ("done", "raw_reward", "env_reward", "reason") if k in info}
        if not done:
            self._text, self._refs = render(self.utterance, info["root_dom"])

    def _after(self) -> str:
        return "The task has ended." if self._meta["done"] else self._text

    def _log_tail(self) -> str:
        try:
            with open(os.path.join(self._tmp, "chromedriver.log"), errors="replace") as f:
                tail = f.read()[-1500:]
        except OSError:
            return ""
        return f"\nchromedriver log (tail):\n{tail}" if tail else ""


def _running(p: Any) -> bool:
    """True while process ``p`` runs (a zombie has exited: only its parent's reaping is left)."""
    import psutil

    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_exited(procs: list[Any], timeout_s: float) -> list[Any]:
    """Wait up to ``timeout_s`` seconds for ``procs`` (psutil.Process) to exit; the ones still
    running. (``psutil.wait_procs`` would also wait for zombies whose parent has not reaped them.)"""
    deadline = time.monotonic() + timeout_s
    alive = [p for p in procs if _running(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.02)
        alive = [p for p in alive if _running(p)]
    return alive


@register_browser("miniwob")
def open_session(task: dict[str, Any], seed: int) -> MiniWoBSession:
    """The session for a ``miniwob`` task row: the instance in its ``verifier_spec``
    (``{"env", "seed"}``), checked against the frozen instruction (the utterance).

    ``seed`` (the episode seed) does not change the page: a MiniWoB++ instance is fully determined
    by its instance seed, and the page's later randomness follows from it and the actions.

    Raises:
        BrowserError: the browser cannot start, or the page's utterance differs from the frozen
            instruction (the miniwob package changed version).
    """
    spec = task["verifier_spec"]
    spec = json.loads(spec) if isinstance(spec, str) else spec
    try:
        sess = MiniWoBSession(spec["env"], spec["seed"])
    except ValueError as e:
        raise BrowserError(f"task {task.get('task_id')!r}: {e}") from e
    if sess.utterance != task["instruction"]:
        sess.close()
        raise BrowserError(f"task {task.get('task_id')!r}: MiniWoB++ {spec['env']} seed {spec['seed']} now reads "
                           f"{sess.utterance!r}, frozen as {task['instruction']!r}: the miniwob package changed")
    return sess
