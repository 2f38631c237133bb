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
