"""Training seeds in the findings statistics (issue 50): ``train.seeds`` expands an arm into seed
checkpoints, a contrast over an arm resamples its seeds and then the tasks, the control carries its
interval, verdict rule 2 decides with it, and a recipe comparison of single seeds is never
reproduced. Runs without seeds, and runs sealed before rule 2, keep their numbers."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from schemas import ArtifactStore
from tasks.config import ConfigError, RunConfig, load_config
from tasks.evaluate.prereg import differences, write_preregistration
from tasks.evaluate.findings import FINDINGS_RULE, decide, finding_table, verdict, verdict_rule2
from tasks.evaluate.scripted import ScriptedRunner
from tasks.evaluate.stage import run_evaluate
from tasks.evaluate.stats import cell_table, contrast_table, paired_bootstrap, seed_task_bootstrap
from tasks.evaluate.verify import verify_run
from tasks.hashing import sha256_dir
from tasks.records.freeze import freeze_tables
from tests.evaluate.test_stage import _episode
from tests.evaluate.test_stats import _contrast_rows

def _diff(g):
    return float((g[0] - g[1]).mean())


# ---- the hierarchical bootstrap ------------------------------------------------------------------

def _arm_and_base(t=60):
    rng = np.random.default_rng(1)
    base = rng.integers(0, 3, t) / 2
    return np.clip(base + rng.normal(0.1, 0.3, t), 0, 1), base


def test_the_interval_widens_as_the_seeds_disagree_more():
    arm, base = _arm_and_base()
    widths = []
    for k in (0.0, 0.05, 0.1, 0.2):  # seed s's rates shifted by k * (-1, 0, +1): the same mean, more spread
        seeds = np.stack([np.clip(arm + k * o, 0, 1) for o in (-1, 0, 1)])
        est, lo, hi, _ = seed_task_bootstrap([seeds, base[None]], _diff, 2000, 5, 0.95)
        assert lo <= est <= hi
        widths.append(hi - lo)
    assert widths == sorted(widths) and widths[-1] > 2.5 * widths[0]


def test_seeds_share_the_task_draw_so_identical_seeds_keep_the_task_variance():
    # three copies of one training run carry no seed variance: the interval is the task bootstrap's.
    # Drawing tasks anew for each seed would shrink it by about sqrt(3), as if the seeds' shared
    # tasks were independent
    arm, base = _arm_and_base()
    _, lo1, hi1, _ = paired_bootstrap(arm, base, 4000, 5, 0.95)
    _, lo3, hi3, _ = seed_task_bootstrap([np.stack([arm] * 3), base[None]], _diff, 4000, 5, 0.95)
    assert (hi3 - lo3) == pytest.approx(hi1 - lo1, rel=0.1)


def test_one_seed_per_side_draws_what_the_task_bootstrap_draws():
    arm, base = _arm_and_base()
    est, lo, hi, boot = seed_task_bootstrap([arm[None], base[None]], _diff, 1000, 9, 0.9)
    # one group of one seed draws no seed: the task indices are the rng's first draws, row by row
    rng = np.random.default_rng(9)
    want = [float((arm - base)[rng.integers(0, 60, 60)].mean()) for _ in range(1000)]
    assert np.allclose(boot, want) and est == pytest.approx(float((arm - base).mean()))


def test_bad_groups_are_refused():
    with pytest.raises(ValueError, match="same non-empty tasks"):
        seed_task_bootstrap([np.zeros((2, 3)), np.zeros((1, 4))], _diff, 10, 0, 0.9)
    with pytest.raises(ValueError, match="resamples=0"):
        seed_task_bootstrap([np.zeros((2, 3)), np.zeros((1, 3))], _diff, 0, 0, 0.9)


# ---- contrast_table over seed checkpoints --------------------------------------------------------

def _seed_plan(n, contrasts, arm_seeds):
    cks = [{"name": "base", "path": ""}] + [{"name": c, "path": f"train/{c}"} for cs in arm_seeds.values() for c in cs]
    return {"records": [{"record_id": f"t{i}|h", "task_id": f"t{i}", "harness_name": "h"} for i in range(n)],
            "checkpoints": cks, "harnesses": ["h"], "held_out": [], "attempts": 2, "seed": 99,
            "contrasts": contrasts, "arm_seeds": arm_seeds}


def test_a_contrast_over_an_arm_is_the_mean_over_its_seeds_with_the_seed_task_interval():
    # 4 tasks x 2 attempts; seeds of "a": [2,2,1,2], [2,1,1,2], [1,2,1,2] -> per task means
    # [5/6, 5/6, 1/2, 1]; base [0, 1, 1, 0] -> [0, .5, .5, 0]; a - base = [5/6, 1/3, 0, 1], mean 13/24
    rows = _contrast_rows({("a@s0", "h"): [2, 2, 1, 2], ("a@s1", "h"): [2, 1, 1, 2], ("a@s2", "h"): [1, 2, 1, 2],
                           ("base", "h"): [0, 1, 1, 0]})
    con = [{"name": "a-vs-base", "a": {"checkpoint": "a", "harness": "h"}, "b": {"checkpoint": "base", "harness": "h"}},
           {"name": "s0-vs-base", "a": {"checkpoint": "a@s0", "harness": "h"},
            "b": {"checkpoint": "base", "harness": "h"}}]
    plan = _seed_plan(4, con, {"a": ["a@s0", "a@s1", "a@s2"]})
    arm, one = contrast_table(rows, plan, cell_table(rows, plan, 0.95), alpha=0.05, resamples=500, power=0.8)
    assert arm["estimate"] == pytest.approx(13 / 24) and arm["a_mean"] == pytest.approx(19 / 24)
    assert (arm["a_seeds"], arm["b_seeds"], arm["interval"], arm["mdd"]) == (3, 0, "seed-task", None)
    assert arm["ci_low"] <= arm["estimate"] <= arm["ci_high"]
    # one seed checkpoint named on its own: the task bootstrap, exactly as before seeds existed
    d = np.array([1, 0.5, 0, 1.0])
    est, lo, hi, p = paired_bootstrap(d + 0, np.zeros(4), 500, one["seed"], 1 - 0.05 / 2)
    assert (one["estimate"], one["ci_low"], one["ci_high"]) == (est, lo, hi)
    assert (one["a_seeds"], one["interval"]) == (1, "task") and one["mdd"] is not None


def test_a_seed_checkpoint_below_the_coverage_rule_leaves_the_arm_uncounted():
    rows = _contrast_rows({("a@s0", "h"): [2, 2], ("a@s1", "h"): [2, 1], ("base", "h"): [0, 1]})
    rows = [r for r in rows if not (r["checkpoint"] == "a@s1" and r["task_id"] == "t1")]  # a@s1 lost half its tasks
    con = [{"name": "c", "a": {"checkpoint": "a", "harness": "h"}, "b": {"checkpoint": "base", "harness": "h"}}]
    plan = _seed_plan(2, con, {"a": ["a@s0", "a@s1"]})
    (c,) = contrast_table(rows, plan, cell_table(rows, plan, 0.95), alpha=0.05, resamples=100, power=0.8)
    assert c["status"] == "cell_not_counted" and c["estimate"] is None


# ---- verdict rule 2 ------------------------------------------------------------------------------

@pytest.mark.parametrize("control,single,want,why", [
    (None, False, "reproduced", "above 0"),
    ((0.01, -0.03, 0.05), False, "reproduced", "contains 0"),              # the control did not move
    ((0.03, 0.01, 0.05), False, "reproduced", "lies below it"),            # moved, but clearly below: 0.05 < 0.06
    ((0.04, 0.01, 0.07), False, "inconclusive", "reaches this interval"),  # moved, overlapping [0.06, ..]
    ((0.12, -0.01, 0.25), False, "inconclusive", "moved as much"),         # rule 1's check still holds
    ((None, None, None), False, "inconclusive", "no estimate or interval"),
    ((0.03, None, None), False, "inconclusive", "no estimate or interval"),
    (None, True, "inconclusive", "single training seed"),
])
def test_rule_2_needs_the_controls_interval_to_hold_0_or_lie_clearly_below(control, single, want, why):
    got, reason = verdict_rule2("increase", 0.10, 0.06, 0.14, 0.05, control, single)
    assert got == want and why in reason and "\n" not in reason


@pytest.mark.parametrize("claim,lo,hi", [("increase", 0.02, 0.2), ("no_increase", -0.04, 0.03),
                                         ("equivalent", -0.04, 0.04)])
def test_a_single_seed_recipe_comparison_is_never_reproduced(claim, lo, hi):
    assert verdict_rule2(claim, (lo + hi) / 2, lo, hi, 0.05)[0] == "reproduced"
    got, reason = verdict_rule2(claim, (lo + hi) / 2, lo, hi, 0.05, single_seed=True)
    assert got == "inconclusive" and "single training seed" in reason
    # a verdict other than reproduced is left as it is
    assert verdict_rule2("increase", -0.1, -0.2, -0.05, 0.05, single_seed=True)[0] == "not reproduced"


def test_decide_follows_the_plans_rule():
    row = {"claim": "increase", "estimate": 0.1, "ci_low": 0.06, "ci_high": 0.14, "margin": 0.0, "control": "ctl",
           "control_estimate": 0.04, "control_ci_low": 0.01, "control_ci_high": 0.07, "single_seed": False}
    assert decide(row, 1) == verdict("increase", 0.1, 0.06, 0.14, 0.0, 0.04)  # rule 1: the control's point only
    assert decide(row, 1)[0] == "reproduced" and decide(row, 2)[0] == "inconclusive"
    with pytest.raises(ValueError, match="findings_rule=3"):
        decide(row, 3)


# ---- config: train.seeds, and a findings config needs a disjoint split ----------------------------

BASE = {"name": "seeds", "suites": [{"name": "basic_arithmetic", "size": 40, "seed": 2}],
        "split": {"test_fraction": 0.5, "disjoint": True}, "harnesses": ["direct"]}


def test_seeds_expand_each_arm_into_seed_checkpoints():
    c = RunConfig.model_validate({**BASE, "train": {"seeds": [0, 1, 2]},
                                  "arms": [{"name": "gspo"}, {"name": "grpo", "train": {"seeds": [4, 5]}},
                                           {"name": "solo", "train": {"seeds": None}}]})
    names = [n for n, _ in c.arm_configs()]
    assert names == ["gspo@s0", "gspo@s1", "gspo@s2", "grpo@s4", "grpo@s5", "solo"]
    assert [tc.seed for _, tc in c.arm_configs()] == [0, 1, 2, 4, 5, None]
    assert all(tc.seeds is None for _, tc in c.arm_configs())
    assert c.arm_groups() == {"gspo": ["gspo@s0", "gspo@s1", "gspo@s2"], "grpo": ["grpo@s4", "grpo@s5"],
                              "solo": ["solo"]}
    assert c.checkpoint_names() == ["base", *names]
    # without arms: final@s<seed>
    solo = RunConfig.model_validate({**BASE, "train": {"seeds": [3, 1]}})
    assert [n for n, _ in solo.arm_configs()] == ["final@s3", "final@s1"]


def test_configs_without_seeds_keep_their_hash():
    plain = RunConfig.model_validate(BASE)
    dump = plain.model_dump(mode="json")
    assert "seed" not in dump["train"] and "seeds" not in dump["train"]
    seeded = RunConfig.model_validate({**BASE, "train": {"seeds": [0]}})
    assert seeded.config_hash() != plain.config_hash() and seeded.model_dump(mode="json")["train"]["seeds"] == [0]


@pytest.mark.parametrize("train,needle", [
    ({"seeds": []}, r"train.seeds=\[\]"), ({"seeds": [1, 1]}, r"train.seeds=\[1, 1\]"),
    ({"seeds": [-1]}, r"train.seeds=\[-1\]"), ({"seed": 1, "seeds": [2]}, r"train.seed=1 with train.seeds=\[2\]"),
])
def test_bad_seeds_are_refused(train, needle):
    with pytest.raises(ValueError, match=needle):
        RunConfig.model_validate({**BASE, "train": train})


def test_contrasts_and_findings_may_name_a_seeded_arm():
    c = RunConfig.model_validate({**BASE, "arms": [{"name": "gspo", "train": {"seeds": [0, 1]}}],
                                  "evaluate": {"contrasts": [{"name": "g", "a": {"checkpoint": "gspo", "harness": "direct"},
                                                              "b": {"checkpoint": "base", "harness": "direct"}},
                                                             {"name": "s1", "a": {"checkpoint": "gspo@s1",
                                                                                  "harness": "direct"},
                                                              "b": {"checkpoint": "base", "harness": "direct"}}]}})
    assert [x.name for x in c.evaluate.contrasts] == ["g", "s1"]
    with pytest.raises(ValueError, match=r"checkpoint='gspo@s7' is not a checkpoint of this run"):
        RunConfig.model_validate({**BASE, "arms": [{"name": "gspo", "train": {"seeds": [0, 1]}}],
                                  "evaluate": {"contrasts": [{"name": "g", "a": {"checkpoint": "gspo@s7",
                                                                                 "harness": "direct"},
                                                              "b": {"checkpoint": "base", "harness": "direct"}}]}})


def test_a_findings_config_without_a_disjoint_split_is_refused_at_load_in_one_line(tmp_path):
    import yaml

    data = {**BASE, "split": {"test_fraction": 0.5},
            "evaluate": {"contrasts": [{"name": "c", "a": {"checkpoint": "final", "harness": "direct"},
                                        "b": {"checkpoint": "base", "harness": "direct"}}],
                         "findings": [{"name": "f", "paper": "P1", "headline": "h", "measure": "contrast",
                                       "contrast": "c", "claim": "increase"}]}}
    p = tmp_path / "f.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert "split.disjoint=False" in str(e.value) and len(str(e.value).strip().splitlines()) == 1
    data["split"]["disjoint"] = True
    p.write_text(yaml.safe_dump(data))
    assert load_config(p).split.disjoint
    del data["evaluate"]["findings"]  # no findings: the split is the config's business
    data["split"]["disjoint"] = False
    p.write_text(yaml.safe_dump(data))
    assert not load_config(p).split.disjoint


def test_the_shipped_findings_configs_load_with_a_disjoint_split():
    from pathlib import Path

    from flows.check_commands import config_owner

    root = Path(__file__).resolve().parents[2]
    owners = {}
    for p in sorted(root.glob("configs/*findings*.yaml")):
        app = config_owner(p)  # an application's config (TalkMesh, BiPA) loads through its own loader
        cfg = app.load_config(p, {}, False) if app is not None else load_config(p)
        owners[p.stem] = app.name if app is not None else None
        assert cfg.split.disjoint, p
    assert owners["talkmesh-findings"] == "talkmesh" and owners["p2-findings"] == "bipa" and owners["p4-findings-v2"] is None


# ---- a sealed evaluation over seed checkpoints, end to end ----------------------------------------

def _findings_cfg(seeds):
    con = [{"name": n, "a": {"checkpoint": a, "harness": "direct"}, "b": {"checkpoint": b, "harness": "direct"}}
           for n, a, b in (("gspo-minus-base", "gspo", "base"), ("control-minus-base", "control", "base"),
                           ("gspo-minus-grpo", "gspo", "grpo"))]
    fin = [{"name": "gspo-gain", "paper": "P6", "headline": "GSPO learns.", "measure": "contrast",
            "contrast": "gspo-minus-base", "control": "control-minus-base", "claim": "increase", "margin": 0.05},
           {"name": "gspo-beats-grpo", "paper": "P6", "headline": "GSPO beats GRPO.", "measure": "contrast",
            "contrast": "gspo-minus-grpo", "claim": "increase", "margin": 0.05},
           {"name": "pooled", "paper": "P6", "headline": "GSPO and GRPO beat the control.",
            "measure": "pooled_contrast", "claim": "increase",
            "a_cells": [{"checkpoint": "gspo", "harness": "direct"}, {"checkpoint": "grpo", "harness": "direct"}],
            "b_cells": [{"checkpoint": "control", "harness": "direct"}]},
           {"name": "spread", "paper": "P4", "headline": "The harness moves pass@1 more.",
            "measure": "harness_spread_minus_recipe_spread", "claim": "increase"}]
    return RunConfig.model_validate({
        **BASE, "seed": 3, "train": {"seeds": seeds} if seeds else {},
        "arms": [{"name": "gspo"}, {"name": "grpo"}, {"name": "control", "train": {"reward_control": "shuffle"}}],
        "evaluate": {"attempts": 2, "harnesses": ["direct", "react-python"], "bootstrap_resamples": 400,
                     "contrasts": con, "findings": fin}, "analyze": {"ceiling_k": 2}})


# pass rates per seed checkpoint: GSPO's seeds agree, the control's and GRPO's do not move
RATES = {"base": 0.3, "gspo": 0.8, "grpo": 0.35, "control": 0.3}
SEED_RATES = {"gspo@s0": 0.8, "gspo@s1": 0.75, "gspo@s2": 0.85, "grpo@s0": 0.3, "grpo@s1": 0.4, "grpo@s2": 0.35,
              "control@s0": 0.3, "control@s1": 0.25, "control@s2": 0.35, "base": 0.3}


def _sealed(tmp, cfg, rates):
    tasks, harnesses, records = freeze_tables(cfg)
    store = ArtifactStore(tmp / "run")
    train_rec = next(r for r in records if r["split"] == "train")
    refs = {"tasks": store.write("freeze", "tasks", tasks), "harnesses": store.write("freeze", "harnesses", harnesses),
            "records": store.write("freeze", "records", records),
            "episodes": store.write("rollout", "episodes", [_episode(train_rec)])}
    cks = [{"name": "base", "step": 0, "path": "", "adapter_sha256": "", "base_model_id": "m"}]
    for name in cfg.checkpoint_names()[1:]:
        ad = tmp / "adapters" / name
        ad.mkdir(parents=True)
        (ad / "adapter_model.safetensors").write_bytes(name.encode())
        store.put_dir(f"train/checkpoints/{name}/step-2", ad)
        cks.append({"name": name, "step": 2, "path": f"train/checkpoints/{name}/step-2",
                    "adapter_sha256": sha256_dir(ad), "base_model_id": "m"})
    refs["checkpoints"] = store.write("train", "checkpoints", cks)
    write_preregistration(store, cfg)  # as the freeze stage does
    run_evaluate(store, cfg, refs, episode_runner=ScriptedRunner(p_checkpoint=rates, seed=5))
    return store


@pytest.fixture(scope="module")
def three_seeds(tmp_path_factory):
    return _sealed(tmp_path_factory.mktemp("seeds3"), _findings_cfg([0, 1, 2]), SEED_RATES)


@pytest.fixture(scope="module")
def one_seed(tmp_path_factory):
    return _sealed(tmp_path_factory.mktemp("seeds1"), _findings_cfg(None), RATES)


def test_three_seeds_per_arm_are_sealed_estimated_over_seeds_and_can_reproduce(three_seeds):
    store = three_seeds
    plan = store.read_json("evaluate/plan.json")
    assert plan["findings_rule"] == FINDINGS_RULE == 2
    assert plan["arm_seeds"] == {a: [f"{a}@s{s}" for s in (0, 1, 2)] for a in ("gspo", "grpo", "control")}
    pre = store.read_json("freeze/preregistration.json")
    assert pre["arm_seeds"] == plan["arm_seeds"] and pre["findings_rule"] == 2 and differences(pre, plan) == []
    # a seed added or dropped after freeze, or another verdict rule, is a departure the stage refuses
    assert differences({**pre, "arm_seeds": {**pre["arm_seeds"], "gspo": ["gspo@s0", "gspo@s1"]}}, plan)
    assert differences({**pre, "findings_rule": 1}, plan)
    con = {c["name"]: c for c in store.rows(("evaluate", "eval_contrasts"))}
    assert (con["gspo-minus-grpo"]["a_seeds"], con["gspo-minus-grpo"]["b_seeds"]) == (3, 3)
    assert con["gspo-minus-base"]["interval"] == "seed-task" and con["gspo-minus-base"]["b_seeds"] == 0
    f = {r["name"]: r for r in store.rows(("evaluate", "eval_findings"))}
    gain, beats = f["gspo-gain"], f["gspo-beats-grpo"]
    assert json.loads(gain["seeds"]) == {"control": 3, "gspo": 3} and gain["single_seed"] is False
    ctl = con["control-minus-base"]
    assert (gain["control_estimate"], gain["control_ci_low"], gain["control_ci_high"]) == (
        ctl["estimate"], ctl["ci_low"], ctl["ci_high"])
    assert gain["control_ci_low"] <= 0 <= gain["control_ci_high"] and gain["verdict"] == "reproduced", gain["reason"]
    assert json.loads(beats["seeds"]) == {"gspo": 3, "grpo": 3} and beats["single_seed"] is False
    assert beats["ci_low"] > 0 and beats["verdict"] == "reproduced" and beats["interval"] == "seed-task"
    # the pooled and spread measures resample the seeds too
    assert f["pooled"]["interval"] == "seed-task" and f["spread"]["interval"] == "seed-task"
    assert json.loads(f["spread"]["seeds"]) == {"control": 3, "grpo": 3, "gspo": 3} and f["spread"]["single_seed"] is False
    # the estimate is the mean over the seeds: the pooled finding by hand from the cells
    cells = {(c["checkpoint"], c["harness_name"]): c for c in store.rows(("evaluate", "eval_cells"))
             if c["kind"] == "cell"}
    mean = lambda arm: np.mean([cells[(f"{arm}@s{s}", "direct")]["pass_at_1"] for s in range(3)])  # noqa: E731
    assert f["pooled"]["estimate"] == pytest.approx((mean("gspo") + mean("grpo")) / 2 - mean("control"))
    assert verify_run(store).rows > 0  # harnessrl verify recomputes every table of the seeded run


def test_a_single_seed_recipe_comparison_cannot_reach_reproduced(one_seed):
    f = {r["name"]: r for r in one_seed.rows(("evaluate", "eval_findings"))}
    beats = f["gspo-beats-grpo"]
    assert beats["ci_low"] > 0.05 and json.loads(beats["seeds"]) == {"gspo": 1, "grpo": 1}
    assert beats["single_seed"] is True and beats["verdict"] == "inconclusive"
    assert "single training seed" in beats["reason"] and beats["interval"] == "task"
    # arm minus base is no recipe comparison: its single seed is recorded, and it may reproduce
    gain = f["gspo-gain"]
    assert gain["single_seed"] is False and json.loads(gain["seeds"]) == {"control": 1, "gspo": 1}
    assert gain["verdict"] == "reproduced", gain["reason"]
    assert f["spread"]["single_seed"] is True and f["pooled"]["single_seed"] is True
    # the numbers are those of the task bootstrap, as before seeds (rule 1 on the same row agrees but
    # for the single-seed cap)
    con = {c["name"]: c for c in one_seed.rows(("evaluate", "eval_contrasts"))}
    assert (beats["estimate"], beats["ci_low"], beats["ci_high"]) == (
        con["gspo-minus-grpo"]["estimate"], con["gspo-minus-grpo"]["ci_low"], con["gspo-minus-grpo"]["ci_high"])
    assert decide(beats, 1)[0] == "reproduced"


def test_published_rows_carry_seeds_and_the_controls_interval_and_verify_checks_them(three_seeds, tmp_path):
    from flows.published_findings import check_published, finding_rows
    from tasks.evaluate.seal import SealError

    rows = finding_rows(three_seeds, config="c.yaml", config_hash="ab" * 32, commit="c0ffee")
    gain = next(r for r in rows if r["name"] == "gspo-gain")
    assert gain["seeds"] == {"control": 3, "gspo": 3} and gain["single_seed"] is False and gain["rule"] == 2
    assert gain["interval"] == "seed-task" and gain["control_ci_low"] < gain["control_ci_high"]
    f = tmp_path / "findings.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert check_published(three_seeds, f, "abab").compared == len(rows)
    for field, value in (("control_ci_low", gain["control_ci_low"] - 0.01), ("seeds", {"control": 3, "gspo": 5}),
                         ("single_seed", True)):
        f.write_text("".join(json.dumps({**r, field: value} if r["name"] == "gspo-gain" else r) + "\n" for r in rows))
        with pytest.raises(SealError, match=rf"findings.jsonl:1: {field}="):
            check_published(three_seeds, f, "abab")


# ---- runs sealed before rule 2 -------------------------------------------------------------------

def test_a_plan_without_findings_rule_gives_the_v1_rows_and_rule_1(one_seed):
    plan = dict(one_seed.read_json("evaluate/plan.json"))
    rows = one_seed.rows(("evaluate", "evaluations"))
    cells = cell_table(rows, plan, plan["min_graded_fraction"])
    con = contrast_table(rows, plan, cells, alpha=plan["alpha"], resamples=plan["bootstrap_resamples"],
                         power=plan["power"])
    del plan["findings_rule"]
    old = {r["name"]: r for r in finding_table(rows, plan, con)}
    from schemas.contracts import _FINDINGS_V1

    assert set(old["gspo-beats-grpo"]) == {n for n, _ in _FINDINGS_V1}
    assert old["gspo-beats-grpo"]["verdict"] == "reproduced"  # rule 1 knows no seeds


def test_an_eval_findings_file_of_version_1_is_still_read_and_compared_on_its_own_columns(one_seed, tmp_path):
    from schemas.contracts import _FINDINGS_V1
    from tasks.evaluate.verify import as_written, stored_version

    store = ArtifactStore(tmp_path)
    v2 = one_seed.rows(("evaluate", "eval_findings"))
    v1 = [{n: r[n] for n, _ in _FINDINGS_V1} for r in v2]
    ref = store.write("evaluate", "eval_findings", v2)
    table = pa.Table.from_pylist(v1, schema=pa.schema([pa.field(n, t) for n, t in _FINDINGS_V1]).with_metadata(
        {b"harnessrl.contract": b"eval_findings", b"harnessrl.version": b"1"}))
    pq.write_table(table, tmp_path / "evaluate/eval_findings.parquet")
    import hashlib

    m = store.manifest("evaluate", "eval_findings")
    m["sha256"] = hashlib.sha256((tmp_path / "evaluate/eval_findings.parquet").read_bytes()).hexdigest()
    (tmp_path / "evaluate/eval_findings.manifest.json").write_text(json.dumps(m))
    assert store.rows(("evaluate", "eval_findings")) == v1 and ref.name == "eval_findings"
    assert stored_version(store, "evaluate", "eval_findings") == 1
    assert as_written("eval_findings", 1, v2) == v1 and as_written("eval_findings", 2, v2) == v2
