"""P2's sealed measurement end to end on a scripted policy whose sampler noise is its request seed,
so common random numbers, decisions, gains and the seal can be checked value for value."""

import re

import pyarrow.parquet as pq
import pytest

from schemas import ArtifactStore
from tasks.bipa.config import BipaRunConfig
from tasks.bipa.optimizer import PROPOSER_SYSTEM
from tasks.evaluate.seal import SealError
from tasks.hashing import sha256_text
from tasks.rollout.generation import Generation

GOOD = "1. GOOD: compute the expression exactly.\n2. Reply with Answer: <number>."
PLACEBO = "1. Work out the expression in one python block.\n2. Then answer with the line Answer: <number>."
REWRITES = ["1. GOOD rewrite: compute it.\n2. Answer: <number>.", "1. plain rewrite, same as before."]


class NoisyPolicy:
    """Proposer: REWRITES in order. Agent: right when the skill says GOOD, wrong when it says BAD,
    else right iff its request seed is even (the sampler's noise); records every request seed."""

    policy_id = "noisy"
    request_seeds_supported = True

    def __init__(self, tokenizer):
        self.tokenizer, self.proposals, self.calls = tokenizer, list(REWRITES), []

    def generate(self, prompts, sampling, seed, request_seeds=None):
        out = []
        for i, p in enumerate(prompts):
            text = self.tokenizer.decode(p)
            if PROPOSER_SYSTEM[:30] in text:
                reply = self.proposals.pop(0)
            else:
                expr = re.search(r"Calculate (.+?)\.", text).group(1)
                value = int(eval(expr, {"__builtins__": {}}))  # a trusted, test-made arithmetic string
                rs = request_seeds[i]
                self.calls.append((text.split("## Skill")[1].strip()[:40], expr, rs))
                ok = "GOOD" in text or ("BAD" not in text and rs % 2 == 0)
                reply = f"Answer: {value if ok else 987654}"
            ids = self.tokenizer.encode(reply, add_special_tokens=False) + [self.tokenizer.eos_token_id]
            out.append(Generation(ids, [-0.1] * len(ids), "stop", reply))
        return out


def _cfg(model_dir, **find):
    f = {"edits": [{"name": "good", "text": GOOD}, {"name": "bad", "text": "1. BAD: guess.\n2. Answer: 0."}],
         "placebo": {"name": "placebo", "text": PLACEBO}, "rewrite_seeds": [0, 1], "rewrite_rounds": 1,
         "alpha": 0.1, "bootstrap_resamples": 200,
         "rules": [{"name": "lms", "headline": "h", "measure": "learned_minus_seed", "arm": "rewrite",
                    "claim": "no_increase", "margin": 0.05},
                   {"name": "eff", "headline": "h", "measure": "selection_effect", "arm": "all", "score_set": "fresh",
                    "claim": "increase"},
                   {"name": "tok", "headline": "h", "measure": "input_tokens", "arm": "pool", "claim": "increase"}]}
    f.update(find)
    return BipaRunConfig.model_validate({
        "name": "bipa-sealed", "seed": 3,
        "suites": [{"name": "basic_arithmetic", "size": 16, "seed": 1, "reward": "exact",
                    "params": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}}],
        "split": {"test_fraction": 0.4, "disjoint": True}, "harnesses": ["react-python-skill"],
        "policy": {"model": str(model_dir), "engine": "vllm"}, "rollout": {"task_runner": "serial"},
        "bipa": {"selection_tasks": 4, "test_tasks": 4, "samples": 2, "findings": f},
    })


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture()
def run(tiny_model_dir, tok, tmp_path, monkeypatch):
    from tasks.bipa.sealed_run import run_sealed
    from tasks.records.stage import run_freeze

    monkeypatch.setenv("HARNESSRL_SIGNING_KEY", str(tmp_path / "key.pem"))

    def go(folder="run", policy=None, cfg=None):
        cfg = cfg or _cfg(tiny_model_dir)
        store = ArtifactStore(tmp_path / folder)
        pol = policy or NoisyPolicy(tok)
        refs = run_sealed(store, cfg, run_freeze(store, cfg, {}), pol)
        return store, refs, pol

    return go


def test_common_random_numbers_are_shared(run):
    store, refs, pol = run()
    seeds = {}
    for skill, expr, rs in pol.calls:
        seeds.setdefault(skill, []).append((expr, rs))
    seed_skill = next(k for k in seeds if k.startswith("1. Read the expression"))
    placebo = next(k for k in seeds if k.startswith("1. Work out"))
    # every request of the placebo drew exactly the seed skill's noise on the same task (and set, sample)
    assert sorted(seeds[placebo]) == sorted(seeds[seed_skill]) and len(seeds[seed_skill]) == 3 * 4 * 2
    assert len({rs for _, rs in seeds[seed_skill]}) == 3 * 4 * 2  # but each (set, task, sample) its own
    gains = {g["name"]: g for g in store.rows(refs["bipa_gains"])}
    # so a no-effect edit has no gain at all on any set: its noise cancels against the seed's
    assert [gains["placebo"][f"gain_{s}"] for s in ("selection", "fresh", "test")] == [0.0, 0.0, 0.0]
    assert gains["placebo"]["decision"] == "rejected" and gains["good"]["decision"] == "accepted"
    assert gains["bad"]["decision"] == "rejected" and gains["good"]["gain_test"] > 0


def test_decisions_rewrites_and_findings(run):
    store, refs, _ = run()
    rows = store.rows(refs["bipa_sealed"])
    cands = [r for r in rows if r["kind"] == "candidate"]
    assert [(c["name"], c["parent"]) for c in cands] == [("seed", None), ("good", "seed"), ("bad", "seed"),
                                                         ("placebo", "seed"), ("rewrite-s0-r1", "seed"),
                                                         ("rewrite-s1-r1", "seed")]
    assert cands[3]["skill_sha256"] == sha256_text(PLACEBO)
    f = {r["name"]: r for r in store.rows(refs["bipa_findings"])}
    assert f["lms"]["learned"] == '["rewrite-s0-r1", "seed"]'  # seed 1's plain rewrite was rejected
    assert f["lms"]["optimizer_seeds"] == 2 and f["lms"]["interval"] == "seed-task"
    assert f["eff"]["learned"] == '["good", "rewrite-s0-r1"]' and f["eff"]["control"] == 0.0
    assert f["tok"]["estimate"] is not None and f["tok"]["learned"] == '["good"]'
    assert all(r["level"] == pytest.approx(1 - 0.1 / 3) for r in f.values())


def test_resumes_after_a_kill(run, tok):
    """A run killed in its test step resumes from the saved steps and writes the same tables as a
    run that was never killed; the resumed steps are not sampled again."""
    store, refs, pol = run("clean")
    test_expr = {e for s, e, _ in pol.calls[-3 * 8:]}
    killer = NoisyPolicy(tok)
    orig = killer.generate

    def dies_in_test(prompts, sampling, seed, request_seeds=None):
        if any(f"Calculate {e}." in tok.decode(p) for p in prompts for e in test_expr):
            raise RuntimeError("killed")
        return orig(prompts, sampling, seed, request_seeds)

    killer.generate = dies_in_test
    with pytest.raises(RuntimeError, match="killed"):
        run("resumed", killer)
    again = NoisyPolicy(tok)
    again.proposals = []  # the round's proposals were saved: asking again would fail
    store2, refs2, pol2 = run("resumed", again)
    assert {n: r.sha256 for n, r in refs2.items()} == {n: r.sha256 for n, r in refs.items()}
    assert len(pol2.calls) == 6 * 4 * 2  # only the test step ran again (6 candidates, 4 tasks, 2 samples)


def test_forged_rows_fail_verify(run):
    from tasks.bipa.sealed_run import verify_bipa
    from tasks.evaluate.seal import seal_rows

    store, refs, _ = run()
    rep = verify_bipa(store)
    assert rep.rows == len(store.rows(refs["bipa_sealed"]))
    rows = store.raw_rows("bipa", "bipa_sealed")
    i = next(k for k, r in enumerate(rows) if r["kind"] == "episode" and r["score_set"] == "test" and r["reward"] == 0)
    forged = [dict(r) for r in rows]
    forged[i]["reward"] = 1.0
    pq_path = store.url + "/bipa/bipa_sealed.parquet"
    table = pq.read_table(pq_path)
    pq.write_table(type(table).from_pylist(forged, schema=table.schema), pq_path)
    with pytest.raises(SealError, match=r"seal_hash does not match its contents"):
        verify_bipa(store)
    # re-chained with the product's own function: the chain holds, the signed head does not
    plan_hash = rows[0]["plan_hash"]
    rechained = seal_rows([{k: v for k, v in r.items() if k not in ("seq", "plan_hash", "prev_hash", "seal_hash")}
                           for r in forged], plan_hash)
    pq.write_table(type(table).from_pylist(rechained, schema=table.schema), pq_path)
    with pytest.raises(SealError, match=r"head.sig"):
        verify_bipa(store)


def test_placebo_is_hashed_in_the_plan(run, tiny_model_dir):
    from tasks.bipa.sealed_run import verify_bipa

    store, refs, _ = run()
    plan = store.read_json("bipa/plan.json")
    assert plan["pool"][-1] == {"name": "placebo", "arm": "placebo", "text": PLACEBO, "sha256": sha256_text(PLACEBO)}
    plan["pool"][-1]["text"] = PLACEBO + " "
    store.write_json("bipa/plan.json", plan)
    with pytest.raises(SealError, match=r"the plan was edited"):
        verify_bipa(store)


def test_the_config_refuses_a_lax_measurement(tiny_model_dir):
    cfg = _cfg(tiny_model_dir).model_dump()
    for key, value, msg in (("split", {"test_fraction": 0.4}, "split.disjoint"),
                            ("policy", {"model": str(tiny_model_dir), "engine": "hf"}, "policy.engine"),
                            ("suites", [{**cfg["suites"][0], "reward": "fraction"}], "reward: exact")):
        with pytest.raises(ValueError, match=re.escape(msg)):
            BipaRunConfig.model_validate({**cfg, key: value})


def test_verify_and_findings_commands_reach_bipa_through_the_registry(run, tiny_model_dir, tmp_path, monkeypatch):
    import json
    from pathlib import Path

    import tasks.analysis.plots as plots

    from flows.check_commands import application_findings, config_owner, verify_command
    from tasks.command import CommandError

    store, refs, _ = run()
    said = []

    def say(msg, *a):
        said.append(msg)

    verify_command(Path(store.url), None, False, None, say)
    assert said[-1].startswith("verified: plan ") and "sealed rows" in said[-1]
    yaml_path = tmp_path / "bipa.yaml"
    yaml_path.write_text("bipa: {}\n")
    owner = config_owner(yaml_path)
    assert owner is not None and owner.name == "bipa"
    out = tmp_path / "findings.jsonl"
    drawn, real = [], plots._png  # the gains figure's lines, kept before it is rendered

    def keep(fig):
        drawn.extend((ln.get_color(), ln.get_linestyle(), list(ln.get_ydata())) for ln in fig.axes[0].lines[1:])
        return real(fig)

    monkeypatch.setattr(plots, "_png", keep)
    monkeypatch.chdir(tmp_path)  # the command copies the figure to ./docs/img/findings
    application_findings(owner, _cfg(tiny_model_dir), yaml_path, Path(store.url), False, out, say)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["name"] for r in rows] == ["lms", "eff", "tok"] and all(r["sealed"] and r["paper"] == "P2" for r in rows)
    assert rows[0]["plan_hash"] == store.read_bytes("bipa/plan.sha256").decode().strip()
    assert rows[1]["placebo"] == {"selection": 0.0, "fresh": 0.0, "test": 0.0}
    # the gains figure: one line per scored candidate, the placebo's (black, dashed) at its gains
    gains = store.rows(("bipa", "bipa_gains"))
    assert len(drawn) == len(gains) >= 2
    assert [d[2] for d in drawn if d[0] == "black" and d[1] == "--"] == [[0.0, 0.0, 0.0]]
    fig = next(tmp_path.glob("docs/img/findings/*--gains.png"))
    assert fig.read_bytes() == store.read_bytes("bipa/plots/gains.png") and fig.read_bytes()[:4] == b"\x89PNG"
    assert any(m.startswith("figure for the findings page: docs/img/findings/") for m in said)
    # another config than the run's is refused, and so is a tampered findings table
    with pytest.raises(CommandError, match="NOT THIS RUN"):
        application_findings(owner, _cfg(tiny_model_dir, alpha=0.2), yaml_path, Path(store.url), False, None, say)
    f = store.raw_rows("bipa", "bipa_findings")
    f[0]["estimate"] = 0.5
    path = store.url + "/bipa/bipa_findings.parquet"
    table = pq.read_table(path)
    pq.write_table(type(table).from_pylist(f, schema=table.schema), path)
    with pytest.raises(CommandError, match=r"VERIFY FAILED: .*bipa_findings.parquet row 0: estimate=0.5"):
        verify_command(Path(store.url), None, False, None, say)


def test_findings_refuse_a_run_with_an_infra_error(run, tiny_model_dir, tmp_path):
    from pathlib import Path

    from flows.check_commands import application_findings
    from tasks.command import CommandError
    from tasks.registries.applications import application

    store, _, _ = run()
    rows = store.raw_rows("bipa", "bipa_sealed")
    assert application("bipa").findings is not None
    rows[-1]["status"] = "infra_error"  # a lost episode: the seal breaks too, but the count is checked first
    path = store.url + "/bipa/bipa_sealed.parquet"
    table = pq.read_table(path)
    pq.write_table(type(table).from_pylist(rows, schema=table.schema), path)
    with pytest.raises(CommandError, match=r"bipa: 1 infra error\(s\) of 144 episodes"):
        application_findings(application("bipa"), _cfg(tiny_model_dir), tmp_path / "c.yaml", Path(store.url), False,
                             None, lambda *a: None)


def test_a_rewrite_with_another_parent_or_text_fails_verify(run):
    """Rows re-chained and the head re-signed with the run's own key (an insider's forgery) still
    fail where the candidates disagree with the plan or with the decisions the selection rows make."""
    from tasks.bipa.sealed_run import BIPA_SEAL, verify_bipa
    from tasks.evaluate.seal import seal_rows
    from tasks.evaluate.signing import load_or_create_key, sign_head

    store, _, _ = run()
    rows = store.raw_rows("bipa", "bipa_sealed")
    path = store.url + "/bipa/bipa_sealed.parquet"
    table = pq.read_table(path)

    def forge(edit):
        forged = [{k: v for k, v in r.items() if k not in ("seq", "plan_hash", "prev_hash", "seal_hash")} for r in rows]
        edit(forged)
        sealed = seal_rows(forged, rows[0]["plan_hash"])
        pq.write_table(type(table).from_pylist(sealed, schema=table.schema), path)
        sign_head(store, BIPA_SEAL, sealed[-1]["seal_hash"], load_or_create_key())

    def reparent(rs):
        next(r for r in rs if r["name"] == "rewrite-s1-r1")["parent"] = "good"

    forge(reparent)
    with pytest.raises(SealError, match=r"'rewrite-s1-r1': parent 'good', the selection rows make 'seed'"):
        verify_bipa(store)

    def swap_placebo(rs):
        p = next(r for r in rs if r["name"] == "placebo")
        p["skill"], p["skill_sha256"] = GOOD, sha256_text(GOOD)

    forge(swap_placebo)
    with pytest.raises(SealError, match=r"where the plan fixes"):
        verify_bipa(store)
