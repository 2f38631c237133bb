"""One tiny end-to-end BiPA run through its Prefect flow: a scripted proposer/agent on the tiny
model's tokenizer, so every score and decision is known in advance."""

import json
import re

import pytest

from schemas import ArtifactStore
from tasks.bipa.config import BipaRunConfig
from tasks.bipa.graph import read_graphml_text
from tasks.bipa.optimizer import PROPOSER_SYSTEM, clean_proposal
from tasks.hashing import sha256_text
from tasks.rollout.generation import Generation

MAGIC = "1. Use MAGIC: compute the expression.\n2. Reply with Answer: <number>."
PROPOSALS = [f"```\n{MAGIC}\n```", "   ", "Be careful."]


class ScriptedPolicy:
    """Proposer: replies PROPOSALS in order. Agent: the right answer when the prompt holds MAGIC,
    else a wrong one."""

    policy_id = "scripted"

    def __init__(self, tokenizer):
        self.tokenizer, self.proposals = tokenizer, list(PROPOSALS)

    def generate(self, prompts, sampling, seed):
        out = []
        for p in prompts:
            text = self.tokenizer.decode(p)
            if PROPOSER_SYSTEM[:30] in text:
                reply = self.proposals.pop(0)
            else:
                expr = re.search(r"Calculate (.+?)\.", text).group(1)
                value = eval(expr, {"__builtins__": {}})  # a trusted, test-made arithmetic string
                reply = f"Answer: {int(value)}" if "MAGIC" in text else "Answer: 987654"
            ids = self.tokenizer.encode(reply, add_special_tokens=False) + [self.tokenizer.eos_token_id]
            out.append(Generation(ids, [-0.1] * len(ids), "stop", reply))
        return out


def test_clean_proposal():
    assert clean_proposal(PROPOSALS[0], 1000) == MAGIC
    assert clean_proposal("  \n ", 100) == ""
    assert clean_proposal("line one\nline two", 12) == "line one"


def _cfg(model_dir):
    return BipaRunConfig.model_validate({
        "name": "bipa-e2e", "seed": 3,
        "suites": [{"name": "basic_arithmetic", "size": 6, "seed": 1,
                    "params": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}],
        "split": {"test_fraction": 0.34}, "harnesses": ["react-python-skill"],
        "policy": {"model": str(model_dir)}, "rollout": {"task_runner": "serial"},
        "bipa": {"candidates": 3, "selection_tasks": 2, "test_tasks": 2, "samples": 2, "bootstrap": 50},
    })


def test_tiny_bipa_run(tiny_model_dir, prefect_harness, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    import tasks.rollout.engines as engines
    from flows.application import application_flow

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    pol = ScriptedPolicy(tok)
    monkeypatch.setattr(engines, "load_policy", lambda cfg, adapter_dir=None: pol)
    cfg = _cfg(tiny_model_dir)
    out = application_flow("bipa")(cfg, str(tmp_path))
    store = ArtifactStore(tmp_path)
    cands = store.rows(out["bipa"]["bipa_candidates"])
    seed_skill = cands[0]["skill"]
    assert [c["decision"] for c in cands] == ["seed", "accepted", "invalid", "rejected"]
    assert [c["selection_mean"] for c in cands] == [0.0, 1.0, None, 0.0]
    assert [c["parent_idx"] for c in cands] == [-1, 0, 1, 1]
    assert [c["incumbent_after"] for c in cands] == [0, 1, 1, 1]
    assert cands[1]["skill"] == MAGIC and cands[1]["skill_sha256"] == sha256_text(MAGIC)
    assert cands[3]["parent_sha256"] == sha256_text(MAGIC) and cands[1]["parent_sha256"] == sha256_text(seed_skill)
    train = [t["task_id"] for t in store.rows(out["freeze"]["tasks"]) if t["split"] == "train"][:2]
    assert sorted(json.loads(cands[1]["selection_scores"])) == sorted(train)

    replay = store.rows(out["bipa"]["bipa_replay"])
    assert len(replay) == 3 * 3  # seed, 1, 3 on selection, fresh, test
    effect = {e["score_set"]: e for e in store.rows(out["bipa"]["bipa_effect"])}
    for s in ("fresh", "test"):
        assert (effect[s]["n_accepted"], effect[s]["still_accepted"], effect[s]["selection_effect"]) == (1, 1, 0.0)

    m = {(r["arm"], r["score_set"]): r for r in store.rows(out["bipa"]["bipa_graph_metrics"])}
    assert set(m) == {("seed", "fresh"), ("learned", "fresh"), ("seed", "test"), ("learned", "test")}
    n = lambda s: len(tok.encode(s, add_special_tokens=False))  # noqa: E731
    assert m[("learned", "test")]["skill_input_tokens_per_episode"] == n(MAGIC)  # one turn per episode
    assert m[("seed", "fresh")]["skill_input_tokens_per_episode"] == n(seed_skill)
    assert m[("seed", "test")]["episode_skill_coverage"] == 1.0 and m[("seed", "test")]["turns_per_episode"] == 1.0
    edges = store.rows(out["bipa"]["bipa_graph_edges"])
    g = read_graphml_text((tmp_path / "bipa" / "episode_graph.graphml").read_text())
    assert g.number_of_edges() == len(edges) == 4 * 4 * 3  # 4 arm-sets x 4 episodes x (system, skill, instruction)
    report = (tmp_path / "bipa" / "report.md").read_text()
    assert "| learned | 1 | 1.000 | 1.000 | 1.000 |" in report and "| seed (hand-written) | 0 | 0.000 |" in report
    assert "read at turn 0 by construction" in report  # react-python-skill: the skill is in the system prompt


def test_report_says_how_the_skill_is_placed(tiny_model_dir):
    from tasks.bipa.report import report_markdown

    for harness, says, not_says in (("react-python-skill-file", "only by reading it with an action", "by construction"),
                                    ("react-python-skill", "read at turn 0 by construction", "only by reading")):
        cfg = _cfg(tiny_model_dir).model_copy(update={"harnesses": [harness]})
        cfg = type(cfg).model_validate({**cfg.model_dump(), "bipa": {**cfg.bipa.model_dump(), "harness": harness}})
        report = report_markdown(cfg, [], [], [], [], 0)
        assert says in report and not_says not in report


def test_same_config_same_bytes(tiny_model_dir, tmp_path):
    """Two runs of the same config and seed write byte-identical artifacts and report."""
    from transformers import AutoTokenizer

    from tasks.bipa.optimizer import run_bipa
    from tasks.records.stage import run_freeze

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = _cfg(tiny_model_dir)
    shas, reports = [], []
    for k in range(2):
        store = ArtifactStore(tmp_path / str(k))
        refs = run_bipa(store, cfg, run_freeze(store, cfg, {}), ScriptedPolicy(tok))
        shas.append({n: r.sha256 for n, r in refs.items()})
        reports.append((tmp_path / str(k) / "bipa" / "report.md").read_bytes()
                       + (tmp_path / str(k) / "bipa" / "episode_graph.graphml").read_bytes())
    assert shas[0] == shas[1] and reports[0] == reports[1]
