"""Experiment configs (P5/P6): a sweep crossing every arm with train values, --quick overrides
from the config's own `quick` section, list-index overrides, and test-only (out-of-domain) suites."""

import pytest

from tasks.config import ConfigError, RunConfig, load_config
from tasks.records.freeze import freeze_tables

BASE = {"name": "sweep", "suites": [{"name": "basic_arithmetic", "size": 6, "seed": 2}],
        "split": {"test_fraction": 0.34}, "harnesses": ["direct"]}


def test_sweep_crosses_every_arm_with_every_value():
    c = RunConfig.model_validate({**BASE, "train": {"kl": {"beta": 0.05}},
                                  "arms": [{"name": "k1-reward"}, {"name": "k3-loss",
                                                                   "train": {"kl": {"estimator": "k3", "placement": "loss"}}}],
                                  "sweep": {"kl.beta": [0.1, 0.3]}})
    arms = dict(c.arm_configs())
    assert list(arms) == ["k1-reward-kl.beta0.1", "k1-reward-kl.beta0.3", "k3-loss-kl.beta0.1", "k3-loss-kl.beta0.3"]
    assert arms["k3-loss-kl.beta0.3"].kl.beta == 0.3 and arms["k3-loss-kl.beta0.3"].kl.estimator == "k3"
    assert arms["k1-reward-kl.beta0.1"].kl.placement == "reward"
    assert c.checkpoint_names() == ["base", *arms]
    # an arm's own value wins over the sweep; `sweep: false` keeps an arm out of it
    c2 = RunConfig.model_validate({**BASE, "arms": [{"name": "kl", "train": {"kl": {"placement": "loss"}}},
                                                    {"name": "nokl", "train": {"kl": {"beta": 0.0}}, "sweep": False}],
                                   "sweep": {"kl.beta": [0.1, 0.3], "kl.placement": ["reward"]}})
    arms2 = dict(c2.arm_configs())
    assert list(arms2) == ["kl-kl.beta0.1-kl.placementreward", "kl-kl.beta0.3-kl.placementreward", "nokl"]
    assert arms2["kl-kl.beta0.3-kl.placementreward"].kl.placement == "loss" and arms2["nokl"].kl.beta == 0.0
    # a sweep without arms sweeps the single arm
    solo = RunConfig.model_validate({**BASE, "sweep": {"lr": [0.001, 0.01]}})
    assert [n for n, _ in solo.arm_configs()] == ["final-lr0.001", "final-lr0.01"]


@pytest.mark.parametrize("sweep, needle", [
    ({"kl.beta": []}, "needs a non-empty list"),
    ({"kl.beta": [0.1, 0.1]}, "distinct values"),
    ({"kl.betta": [0.1]}, "kl.betta"),
    ({"kl.beta": [-1.0]}, "kl.beta=-1.0"),
    ({"grouping": ["within stuff"]}, "grouping"),
])
def test_bad_sweeps_are_refused_naming_the_key(sweep, needle):
    with pytest.raises(ValueError, match="sweep|arms") as e:
        RunConfig.model_validate({**BASE, "sweep": sweep})
    assert needle in str(e.value)


def test_quick_section_and_list_index_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("name: q\nsuites:\n  - {name: basic_arithmetic, size: 20}\n  - {name: gsm_symbolic, size: 8}\n"
                 "harnesses: [direct]\ntrain: {epochs: 10}\nquick: {suites.0.size: 4, train.epochs: 2}\n")
    full = load_config(p)
    assert full.suites[0].size == 20 and full.train.epochs == 10
    quick = load_config(p, quick=True)
    assert quick.suites[0].size == 4 and quick.suites[1].size == 8 and quick.train.epochs == 2
    # --set applies after --quick; a number indexes a list
    both = load_config(p, {"suites.1.size": 3, "train.epochs": 5}, quick=True)
    assert both.suites[1].size == 3 and both.train.epochs == 5 and both.suites[0].size == 4
    assert quick.config_hash() != full.config_hash()
    with pytest.raises(ConfigError, match="'suites.5' is not an index of a list of 2"):
        load_config(p, {"suites.5.size": 3})
    bare = tmp_path / "bare.yaml"
    bare.write_text("name: q\nsuites: [{name: basic_arithmetic, size: 2}]\nharnesses: [direct]\n")
    with pytest.raises(ConfigError, match="--quick needs a 'quick' section"):
        load_config(bare, quick=True)


def test_eval_only_suite_is_all_test():
    c = RunConfig.model_validate({**BASE, "suites": [{"name": "basic_arithmetic", "size": 6, "seed": 2},
                                                     {"name": "gsm_symbolic", "size": 4, "seed": 1, "eval_only": True}]})
    tasks, _, records = freeze_tables(c)
    gsm = [t for t in tasks if t["suite"].startswith("gsm_symbolic") or "gsm" in t["task_id"]]
    assert len(gsm) == 4 and {t["split"] for t in gsm} == {"test"}
    arith = [t for t in tasks if t not in gsm]
    assert {t["split"] for t in arith} == {"train", "test"}
    assert {r["split"] for r in records if r["task_id"] in {t["task_id"] for t in gsm}} == {"test"}
