from pathlib import Path

import pytest

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
