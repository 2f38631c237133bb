import json
from pathlib import Path

import pytest
import yaml

from tasks.config import ConfigError, load_config

REPO = Path(__file__).resolve().parent.parent


def test_default_config_loads_and_hash_is_stable():
    a = load_config(REPO / "configs/default.yaml")
    b = load_config(REPO / "configs/default.yaml")
    assert a.config_hash() == b.config_hash()
    assert a.train.kl.estimator == "k3" and a.train.kl.placement == "loss"  # GRPO's own KL (DeepSeekMath)
    assert set(a.harnesses) == {"direct", "react-python"}
    c = load_config(REPO / "configs/default.yaml", {"train.epochs": 7})
    assert c.train.epochs == 7 and c.config_hash() != a.config_hash()
    assert c.section_hash("suites") == a.section_hash("suites")


@pytest.mark.parametrize("text,needle", [
    ("name: x\nsuites: [{name: basic_arithmetic, size: 2}]\nharnesses: [direct]\ntrian: {}\n", "trian"),
    ("name: x\nsuites: [{name: basic_arithmetic, size: -1}]\nharnesses: [direct]\n", "suites.0.size"),
    ("name: x\nsuites: [{name: basic_arithmetic, size: 2}]\nharnesses: [direct]\ntrain: {epochs: many}\n", "train.epochs"),
    ("name: x\nsuites: [{name: basic_arithmetic, size: 2}]\nharnesses: [direct]\ntrain: {algorithm: gspo, agg: token_mean}\n",
     "not defined for GSPO"),
    ("name: x\nsuites: [{name: basic_arithmetic, size: 2}]\nharnesses: [direct]\ntrain: {kl: {estimator: k4}}\n",
     "train.kl.estimator"),
    ("name: x\nsuites: []\nharnesses: [direct]\n", "suites"),
    ("name: x\nsuites: [{name: basic_arithmetic, size: 2}]\nharnesses: [direct, direct]\n", "duplicates"),
    ("name: x\nsuites: [{name: basic_arithmetic, size: 2}]\nharnesses: [direct]\nevaluate: {attempts: 2}\nanalyze: {ceiling_k: 4}\n",
     "ceiling_k"),
    ("name: [x\n", "not valid YAML"),
    ("- 1\n- 2\n", "mapping"),
])
def test_bad_configs_name_file_key_and_value(tmp_path, text, needle):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert needle in str(e.value) and str(p) in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_unknown_harness_and_missing_model_are_refused_at_load(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("name: x\nsuites: [{name: basic_arithmetic, size: 2}]\nharnesses: [direct, nope]\n")
    with pytest.raises(ConfigError, match="harness 'nope'.*shipped harnesses") as e:
        load_config(p)
    assert "key 'harnesses'" in str(e.value)
    p.write_text(f"name: x\nsuites: [{{name: basic_arithmetic, size: 2}}]\nharnesses: [direct]\npolicy: {{model: {tmp_path / 'none'}}}\n")
    with pytest.raises(ConfigError, match="policy.model=.*none.*config.json"):
        load_config(p)


def test_p6_findings_config_and_its_quick_version_load_as_registered():
    """P6's findings config: GSPO with the paper's clip range, GRPO and a shuffled-reward GSPO
    control on one rank-32 LoRA budget, one epoch over frozen rollouts, held-out harnesses never
    trained on, and every learning finding read against the control."""
    for quick in (False, True):
        cfg = load_config(REPO / "configs/p6-findings.yaml", quick=quick)
        arms = dict(cfg.arm_configs())
        assert list(arms) == ["gspo", "grpo", "control"]
        assert [(a.algorithm, a.clip_low, a.clip_high, a.reward_control) for a in arms.values()] == [
            ("gspo", 3e-4, 4e-4, "none"), ("grpo", 0.2, 0.2, "none"), ("gspo", 3e-4, 4e-4, "shuffle")]
        assert all(a.lora.r == 32 and a.mode == "frozen" and a.num_epochs == 1 and a.kl.beta == 0 and
                   a.agg == "seq_mean_token_mean" for a in arms.values())
        assert len({(a.lr, a.batch_size, a.lora.alpha) for a in arms.values()}) == 1  # the same budget
        assert cfg.split.disjoint and cfg.suites[0].reward == "exact"
        held = set(cfg.evaluate.harnesses) - set(cfg.harnesses)
        assert held == {"react-python", "direct"}
        contrasts = {c.name: c for c in cfg.evaluate.contrasts}
        for f in cfg.evaluate.findings:
            a = contrasts[f.contrast].a
            if a.checkpoint == "gspo" and contrasts[f.contrast].b.checkpoint == "base":
                ctl = contrasts[f.control]
                assert (ctl.a.checkpoint, ctl.a.harness, ctl.b.checkpoint) == ("control", a.harness, "base")
        assert {contrasts[f.contrast].a.harness for f in cfg.evaluate.findings} >= held


def _protocol(harness: str) -> tuple[str, tuple[str, ...]]:
    """A harness spec's answer protocol: how an answer is read (its stop's answer pattern and
    fallback) and the tools it loops over; two harnesses with the same pair share a protocol."""
    spec = yaml.safe_load((REPO / "tasks/harnesses/specs" / f"{harness}.yaml").read_text())
    stop = spec.get("stop") or {}
    return (json.dumps({k: v for k, v in stop.items() if "answer" in k}, sort_keys=True),
            tuple(t["name"] for t in spec.get("tools") or []))


@pytest.mark.parametrize("quick", [False, True])
def test_p4_findings_v2_config(quick):
    """P4 v2 (issue 49 part 4): >= 3 training harnesses with distinct protocols, Within, Cross and a
    random-reward control each under >= 3 training seeds, >= 2 held-out harnesses whose protocols
    no training harness has, exact reward on a disjoint split, and the pre-registered rules: the
    spread over Within and Cross only, Cross - Within on each held-out harness, each gain against
    its control."""
    cfg = load_config(REPO / "configs/p4-findings-v2.yaml", quick=quick)
    assert cfg.split.disjoint and all(s.reward == "exact" for s in cfg.suites)
    assert {s.name for s in cfg.suites} == {"products", "basic_arithmetic"}
    train = list(cfg.harnesses)
    assert len(train) >= 3 and len({_protocol(h) for h in train}) == len(train)
    held = [h for h in cfg.evaluate.harnesses if h not in train]
    assert set(train) <= set(cfg.evaluate.harnesses) and len(held) >= 2
    assert not {_protocol(h) for h in held} & {_protocol(h) for h in train}
    groups = cfg.arm_groups()
    assert set(groups) == {"within", "cross", "control"}
    assert all(len(cks) >= (2 if quick else 3) for cks in groups.values())
    arms = dict(cfg.arm_configs())
    assert {arms[c].grouping for c in groups["within"]} == {"within"} and {arms[c].grouping for c in groups["cross"]} == {"cross"}
    assert {arms[c].reward_control for c in groups["control"]} == {"shuffle"}
    assert len({(a.lr, a.steps, a.prompts_per_step, a.lora.r) for a in arms.values()}) == 1  # one budget
    contrasts = {c.name: c for c in cfg.evaluate.contrasts}
    findings = {f.name: f for f in cfg.evaluate.findings}
    spread = [f for f in findings.values() if f.measure == "harness_spread_minus_recipe_spread"]
    assert len(spread) == 1 and sorted(spread[0].checkpoints) == ["cross", "within"]  # base and control are no recipe
    for h in held:  # Cross - Within on every held-out harness, read as "no better"
        (f,) = [f for f in findings.values() if f.measure == "contrast" and contrasts[f.contrast].a.harness == h
                and (contrasts[f.contrast].a.checkpoint, contrasts[f.contrast].b.checkpoint) == ("cross", "within")]
        assert f.claim == "no_increase" and f.margin == 0.05
    gains = [f for f in findings.values() if f.measure == "contrast" and contrasts[f.contrast].b.checkpoint == "base"
             and contrasts[f.contrast].a.checkpoint == "within"]
    assert {contrasts[f.contrast].a.harness for f in gains} >= set(held)
    for f in gains:
        ctl = contrasts[f.control]
        assert (ctl.a.checkpoint, ctl.a.harness, ctl.b.checkpoint) == ("control", contrasts[f.contrast].a.harness, "base")


@pytest.mark.parametrize("quick", [False, True])
def test_p1_findings_v2_config(quick):
    """P1 v2 (issue 49 part 5): >= 10 (harness, family) cells, each an arm trained under its own
    harness alone on a disjoint, exactly graded split, every arm under >= 2 seeds (no single-seed
    recipe comparison), the same cells for the gain and the return, the gain read against a
    control, and M_step measured on the base."""
    cfg = load_config(REPO / "configs/p1-findings-v2.yaml", quick=quick)
    assert cfg.split.disjoint and all(s.reward == "exact" for s in cfg.suites)
    suites = {f"reasoning_gym/{s.name}" for s in cfg.suites}
    arms = dict(cfg.arm_configs())
    groups = cfg.arm_groups()
    by_target = {f.target: f for f in cfg.evaluate.findings if f.measure == "p1_predictor_gap"}
    assert set(by_target) == {"gain", "return"} and by_target["gain"].cells == by_target["return"].cells
    cells = by_target["gain"].cells
    assert len(cells) >= 10 and len({(c.harness, c.suite) for c in cells}) == len(cells)
    assert {c.suite for c in cells} == suites and len({c.harness for c in cells}) >= 5
    for c in cells:  # each cell: an arm trained under that harness alone, two seeds or more
        assert len(groups[c.checkpoint]) >= (1 if quick else 2)
        assert all(arms[ck].harnesses == [c.harness] and arms[ck].reward_control == "none"
                   for ck in groups[c.checkpoint])
    (gain,) = [f for f in cfg.evaluate.findings if f.measure == "contrast"]
    ctl = {c.name: c for c in cfg.evaluate.contrasts}[gain.control]
    assert {arms[ck].reward_control for ck in groups[ctl.a.checkpoint]} == {"shuffle"}
    assert cfg.analyze.branching.episodes_per_harness > 0 and cfg.analyze.branching.checkpoints == ["base"]
    assert cfg.analyze.ceiling_k == cfg.evaluate.attempts  # C is the pass@K of the sealed attempts
