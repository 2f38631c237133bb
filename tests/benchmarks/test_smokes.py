"""Every script under ``benchmarks/`` has a ``--smoke`` mode (tiny sizes, seconds) that runs here,
in a subprocess as a user would run it, writing its row to a temporary results folder
(``HARNESSRL_BENCH_RESULTS``) rather than the tracked ``benchmarks/results/``. Each test checks
the row's figures, not just the exit status, so a benchmark that silently stops measuring what it
says fails here instead of rotting. The full sizes are measured by running the scripts, not here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from schemas.machine import cpu_facts
from tests.facilities import bwrap_missing, chromium_missing, require

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
#: smokes tested in their own files
ELSEWHERE = {"sealed_eval": "tests/benchmarks/test_sealed_eval_smoke.py"}
# Scripts with no --smoke mode, each with the test that covers what can run without its hardware.
NO_SMOKE = {"gpu_check": "tests/benchmarks/test_gpu_check.py"}  # gpu_check.sh's Python half: needs a CUDA GPU


@pytest.fixture(autouse=True)
def _shared_tiny_model(tiny_model_dir, prefect_harness, monkeypatch):
    """The smokes take the suite's tiny model instead of each building one (benchmarks/_results.py),
    and the suite's Prefect API (conftest) instead of each starting a temporary server."""
    monkeypatch.setenv("HARNESSRL_TINY_MODEL", str(tiny_model_dir))


def run_smoke(name: str, tmp_path: Path, *args: str) -> dict:
    env = {**os.environ, "HARNESSRL_BENCH_RESULTS": str(tmp_path), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_VERBOSITY": "error", "HARNESSRL_PROGRESS": "0", "PREFECT_HOME": str(tmp_path / "prefect")}
    tracked = BENCH / "results" / f"{name}.jsonl"
    before = tracked.read_bytes() if tracked.exists() else None
    res = subprocess.run([sys.executable, str(BENCH / f"{name}.py"), "--smoke", *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"{name} --smoke failed:\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}"
    rows = (tmp_path / f"{name}.jsonl").read_text().splitlines()
    assert len(rows) == 1, rows
    row = json.loads(rows[0])
    # every row says on what code, when and where it was measured
    assert re.fullmatch(r"[0-9a-f]{40}(\+dirty)?", row["commit"]), row["commit"]
    assert row["date"].endswith("+00:00") and row["date"][:2] == "20"
    assert row["machine"]["cpus"] == os.cpu_count() and row["machine"]["platform"]
    # ... on which CPU, and beside how much else (the load when it started and when it reported)
    assert row["machine"]["cpu_model"] == cpu_facts()["model"]
    assert all(isinstance(row["machine"][k], float) and row["machine"][k] >= 0 for k in ("load_start", "load_end"))
    assert row["smoke"] is True
    assert (tracked.read_bytes() if tracked.exists() else None) == before  # the tracked rows are untouched
    return row


def test_every_benchmark_script_has_a_smoke_test():
    scripts = sorted(p.stem for p in BENCH.glob("*.py") if not p.stem.startswith("_"))
    assert scripts
    tested_here = {n[len("test_"):] for n in globals() if n.startswith("test_") and n != "test_every_benchmark_script_has_a_smoke_test"}
    for name in scripts:
        if name in NO_SMOKE:
            assert (ROOT / NO_SMOKE[name]).is_file(), f"no test for {name}"
            continue
        assert '"--smoke"' in (BENCH / f"{name}.py").read_text(), f"benchmarks/{name}.py has no --smoke mode"
        assert name in tested_here or (ROOT / ELSEWHERE.get(name, "-")).is_file(), f"no smoke test for {name}"


def test_artifact_store(tmp_path):
    row = run_smoke("artifact_store", tmp_path)
    assert row["rows"] == 2000 and row["repeats"] == 1
    assert row["machine"]["torch_device"] == "none"  # it never imports torch
    for k in ("store_write_s", "store_read_s", "bare_write_s", "bare_read_s"):
        assert row[k] > 0, k
    # the contracts (schema, expectations, hashing, manifest) cost something over a bare write
    assert row["write_overhead_ratio"] == pytest.approx(row["store_write_s"] / row["bare_write_s"], rel=0.1)
    assert row["write_overhead_ratio"] > 1
    assert row["store_write_rows_per_s"] == pytest.approx(2000 / row["store_write_s"], rel=0.01)


def test_sandbox(tmp_path):
    require("bwrap", bwrap_missing())
    row = run_smoke("sandbox", tmp_path)
    assert row["execs"] == 5 and row["episodes"] == 2
    assert row["bwrap_exec_true_per_s"] > 0 and row["bwrap_exec_python_per_s"] > 0
    assert 0 < row["bwrap_exec_true_wall_s"] < 5 and row["bwrap_episode_s"] > 0
    # docker is measured or says why not, never silently missing
    assert ("docker_exec_true_per_s" in row) != ("docker_unavailable" in row)


def test_sandbox_concurrency(tmp_path):
    require("bwrap", bwrap_missing())
    row = run_smoke("sandbox_concurrency", tmp_path)
    assert row["episodes"] == 8 and row["hold_fds"] == 1100 and row["policy"].startswith("scripted")
    # every episode's sandbox was open at once, its pipes above select()'s 1023, and none was lost
    assert row["peak_sandboxes"] == 8 and row["peak_sandbox_procs"] == 16 and row["peak_fd"] > 1023
    assert row["infra_errors"] == 0 and row["lost"] == 0 and row["status_counts"] == {"ok": 8}
    assert row["observed_ok"] == 8  # each episode's tool call ran in its sandbox and its output came back
    assert row["wall_s"] > 0 and row["host_peak_rss_mib"] > 0 and 0 < row["sandbox_pss_mib_per_sandbox"] < 64


def test_logodds(tmp_path):
    row = run_smoke("logodds", tmp_path)
    assert row["sequences"] == 2 * 2 and row["model"] == "tiny (smoke)"
    assert row["policy_s"] > 0 and row["reference_s"] > 0
    assert row["mean_abs_logp_diff"] > 0  # the random LoRA B moves the policy off the reference
    assert row["machine"]["torch_device"] == "cpu"


def test_engines(tmp_path):
    row = run_smoke("engines", tmp_path)
    assert row["prompts"] == 2 and row["max_new_tokens"] == 8
    assert 0 < row["hf_tokens"] <= 2 * 8 and row["hf_tokens_per_s"] > 0
    assert "vllm_tokens" not in row and "vllm" in row["skipped"]


def test_turn_storage(tmp_path):
    row = run_smoke("turn_storage", tmp_path)
    assert row["harnesses"] == ["react-python"] and row["engine"] == "hf"
    assert row["episodes"] > 0 and row["max_turns_in_an_episode"] > 1  # multi-turn, where the layouts differ
    assert row["v1_rows"] == row["turns"]
    # v1 stores each turn's whole prompt again, v2 only what the turn adds
    assert row["prompt_tokens_stored_v1"] > row["prompt_tokens_stored_v2"] > 0
    assert row["bytes_ratio_v1_over_v2"] == round(row["turns_parquet_bytes_v1"] / row["turns_parquet_bytes_v2"], 2) > 1


def test_base_rewards(tmp_path):
    require("bwrap", bwrap_missing())
    row = run_smoke("base_rewards", tmp_path)
    assert row["tasks_loaded"] == {"arithmetic": 2}
    (cell,) = row["cells"]
    assert row["harnesses"] == ["direct"] and cell["harness"] == "direct" and "direct" in row["skipped"]
    assert cell["episodes"] == row["episodes"] == 2  # 2 tasks (train and test split alike) x 1 sample
    assert cell["mean_turns"] == 1.0 and row["turns"] == 2  # a single-turn harness
    assert 0.0 <= cell["success_rate"] <= cell["mean_reward"] <= 1.0  # success means reward 1
    assert cell["infra_errors"] == 0


def test_rollout(tmp_path):
    require("bwrap", bwrap_missing())
    row = run_smoke("rollout", tmp_path)
    assert row["harnesses"] == "react-python" and "dask" in row["skipped"] and row["parts"] == "engine,sandbox"
    assert row["react-python.episodes"] == 2 and row["react-python.turns"] >= 2
    assert row["react-python.replay_identical"] is True  # the bare engine replays the harness's tokens
    assert row["react-python.harness_s"] > 0 and row["react-python.engine_s"] > 0
    assert row["sandbox.bwrap.warm_execs_per_s"] > 0 and row["sandbox.bwrap.cold_execs_per_s"] > 0
    assert not any(k.startswith("stage.") for k in row) and "sandbox.docker.warm_execs_per_s" not in row


def test_miniwob_session(tmp_path):
    require("chromium", chromium_missing())
    row = run_smoke("miniwob_session", tmp_path)
    assert row["envs"] == ["enter-text"] and row["instances_per_env"] == 1
    assert row["scripted_reward_enter-text"] == 1.0  # the scripted policy solves it through the session API
    assert row["start_s_median"] > 0 and row["click_s"] > 0 and row["type_s"] > 0


def test_train_step(tmp_path):
    row = run_smoke("train_step", tmp_path)
    assert row["prompts"] == 4 and row["group"] == 2 and row["max_new_tokens"] == 16
    assert row["ours_s_per_iter"] > 0 and row["ours_samples_per_s"] == round(8 / row["ours_s_per_iter"], 2)
    assert len(row["ours_completion_tokens"]) == 1 and 0 < row["ours_completion_tokens"][0] <= 4 * 2 * 16
    assert "TRL" in row["skipped"] and "trl_s_per_iter" not in row and "losses_agree" not in row


def test_train_memory(tmp_path):
    row = run_smoke("train_memory", tmp_path)
    assert row["model"] == "tiny-2x128-v1024" and row["config"] == "p6-findings.yaml" and row["micro_batch_size"] == 16
    old, new = row["cases"]["p6-longest/old"], row["cases"]["p6-longest/new"]
    # old: the 4 sequences (34 tokens each) in one micro-batch; new: 64 padded tokens, so one each
    assert old["micro_batches"] == 1 and old["largest_micro_batch_tokens"] == 4 * 34
    assert new["micro_batches"] == 4 and new["largest_micro_batch_tokens"] == 34
    assert old["policy_tokens"] == new["policy_tokens"] == 4 * 16
    # the same step whichever path: the gradient norm agrees to float rounding
    assert new["grad_norm"] == pytest.approx(old["grad_norm"], rel=1e-4) and old["grad_norm"] > 0
    assert all(c["peak_rss_mb"] > 100 and c["step_s"] > 0 for c in (old, new))
    # new: each 34-token micro-batch (one sequence, no prompt to share) over the 32-token threshold
    assert new["auto_checkpointed_forwards"] == 4 and old["auto_checkpointed_forwards"] == 0
    assert row["new_max_peak_rss_mb"] == new["peak_rss_mb"] and row["goal_met"] == {"new": None}  # smoke: no verdict


def test_online_iteration(tmp_path):
    row = run_smoke("online_iteration", tmp_path)
    arm, kl_arm = row["arms"]
    assert kl_arm["arm"] == "hf-kl" and kl_arm["kl_beta"] > 0
    # a KL term trains every sequence (each carries the KL gradient), whatever the advantages; one
    # timed iteration of one step: milliseconds per trained token = its train seconds / its tokens
    assert kl_arm["train_tokens_per_step"] > 0
    assert kl_arm["train_ms_per_token"] == pytest.approx(1000 * kl_arm["train_s"] / kl_arm["train_tokens_per_step"],
                                                         rel=0.01, abs=1000 * 0.005 / kl_arm["train_tokens_per_step"])
    assert arm["engine"] == "hf" and arm["max_staleness"] == 0 and arm["max_staleness_seen"] == 0
    # both figures are rounded to 2 decimals: samples/s = 8 / s_per_iter within that rounding
    s = arm["s_per_iter"]
    assert s > 0 and 8 / (s + 0.005) - 0.005 <= arm["samples_per_s"] <= 8 / max(s - 0.005, 1e-9) + 0.005
    assert "vllm" in row["skipped"] and "speedup_vllm_over_hf" not in row
    assert arm["arm"] == "hf" and arm["sync_bytes"] is None  # rebuilt in process: nothing is sent
    assert 0.0 <= arm["zero_adv_frac"] <= 1.0
    # the tiny model solves nothing: without a KL term no sequence has a signal, none trains
    if arm["zero_adv_frac"] == 1.0:
        assert arm["train_tokens_per_step"] == 0 and arm["train_ms_per_token"] is None
        assert "kl_cost_per_token_hf" not in row
    else:
        assert row["kl_cost_per_token_hf"] == pytest.approx(kl_arm["train_ms_per_token"] / arm["train_ms_per_token"],
                                                            abs=0.01)


def test_train_precision(tmp_path):
    row = run_smoke("train_precision", tmp_path)
    assert row["sequences"] == 8 and row["completion_tokens"] > 8
    # bf16 autocast changes the log-probs a little, not nothing (then the bf16 side ran in float32)
    assert 0.0 < row["logprob_abs_diff_mean"] <= row["logprob_abs_diff_max"] < 0.5
    assert row["grad_norm_fp32"] > 0 and row["grad_norm_bf16"] > 0
    # the same step, up to bf16's rounding: the update points the same way
    assert row["update_cosine"] > 0.9 and 0.5 < row["update_norm_ratio_bf16_over_fp32"] < 2.0


def test_task_difficulty(tmp_path):
    row = run_smoke("task_difficulty", tmp_path)
    assert row["engine"] == "hf" and row["reward"] == "exact"
    # 2 families x 2 harnesses, one row per (family, harness) cell
    assert [(c["family"], c["harness"]) for c in row["cells"]] == [
        ("arith-1d-2t", "direct"), ("arith-1d-2t", "calculator"), ("arith-1d-3t", "direct"), ("arith-1d-3t", "calculator")]
    for c in row["cells"]:
        assert c["problems"] == 4 and c["episodes"] == 8 and c["dataset"] == "basic_arithmetic"
        for k in ("pass_at_1", "parse_rate", "pass_at_k", "signal_groups", "cut_frac"):
            assert 0.0 <= c[k] <= 1.0, (k, c)
        # accuracy given parsed is undefined (None, not 0) where nothing parsed
        assert (c["acc_given_parsed"] is None) == (c["parse_rate"] == 0.0)
        assert c["pass_at_1"] <= c["pass_at_k"]
    assert {c["mean_turns"] for c in row["cells"] if c["harness"] == "direct"} == {1.0}
    assert all(0 < c["mean_tokens"] <= 64 for c in row["cells"])  # both harnesses' max_new_tokens
    assert {c["tool_call_rate"] for c in row["cells"] if c["harness"] == "direct"} == {0.0}  # no tools to call
    for f in ("arith-1d-2t", "arith-1d-3t"):
        p1 = [c["pass_at_1"] for c in row["cells"] if c["family"] == f]
        assert row["spread"][f]["spread"] == round(max(p1) - min(p1), 4)
    assert row["goal"]["reached"] == any(s["spread"] >= 0.3 for s in row["spread"].values())


def test_findings_budget(tmp_path):
    from tasks.config.run import load_config

    row = run_smoke("findings_budget", tmp_path)
    cfg = load_config(ROOT / "configs/p4-findings-v2.yaml", quick=True)
    assert row["kind"] == "estimate" and row["quick"] is True and row["config_name"] == "p4-findings-v2"
    # counted from the config here: 10 + 10 problems, 4 + 4 test; base + 3 arms x 2 seeds; 5 harnesses x 1 attempt
    assert (row["test_tasks"], row["train_tasks"], row["checkpoints"]) == (8, 12, 7)
    assert row["sealed_attempts"] == 7 * len(cfg.evaluate.harnesses) * 8 * cfg.evaluate.attempts
    assert row["train_samples"] == 6 * 1 * 1 * 4 * 3  # arms x steps x prompts x group x training harnesses
    u = row["unit_costs_s"]
    assert row["evaluate_s"] == pytest.approx(row["sealed_attempts"] * u["attempt"], abs=row["sealed_attempts"] * 5e-4 + 0.1)
    assert {"python-demo", "calculator-demo"} <= set(u["tool_harnesses"]) and "direct" not in u["tool_harnesses"]
    assert row["total_s"] == pytest.approx(row["rollout_s"] + row["train_s"] + row["evaluate_s"] + row["branching_s"],
                                           abs=0.2)


def test_learning(tmp_path):
    work = tmp_path / "work"
    row = run_smoke("learning", tmp_path, "--work", str(work))
    assert row["config"] == "learn-arith.yaml" and row["budget_s"] == 20.0 and row["attempts"] == 1
    assert row["compared"].startswith("vLLM-sampled online GRPO vs TRL GRPOTrainer") and row["split"] == "disjoint"
    assert row["seeds"] == [0] and row["order"] == ["ours:0"] and row["snapshots"] == 2
    assert row["target_pass_at_1"] == 0.35 and row["truncated_reward"] == "zero"
    assert set(row["runs"]) == {"ours"} and "TRL" in row["skipped"] and row["same_sampler"]["skipped"] == "smoke mode"
    # no TRL side: no speed-up, and the reason says so; the goal is undecided, not failed
    assert row["speedup"] is None and "no TRL runs" in row["speedup_reason"] and row["goal"]["met"] is None
    (run,) = row["runs"]["ours"]
    # the clock starts at launch and the run goes on to its first iteration end past the budget
    assert run["iterations"] >= 1 and run["stop_s"] >= 20.0 and run["samples_per_s"] > 0
    # the engine's generate calls were timed: past the first iteration, sampling and the rest are both > 0
    if run["iterations"] >= 2:
        assert run["sample_s_per_iteration"] > 0 and run["other_s_per_iteration"] > 0
    else:
        assert run["sample_s_per_iteration"] is None and "model load" in run["split_note"]
    # one snapshot per mark (10 s, 20 s), each the last iteration finished by it (0: the base model)
    snaps = run["snapshots"]
    assert [s["mark_s"] for s in snaps] == [10.0, 20.0]
    assert all(0 <= s["weights_s"] <= s["mark_s"] and 0 <= s["iterations"] <= run["iterations"] for s in snaps)
    assert snaps[0]["iterations"] <= snaps[1]["iterations"]
    assert all((s["iterations"] == 0) == (s["weights_s"] == 0.0) for s in snaps)
    assert all(0.0 <= s["pass_at_1"] <= 1.0 for s in snaps)
    # equal-time pass@1 is the budget's snapshot, with an interval around it (over tasks: one seed)
    assert row["ours_pass_at_1"] == snaps[-1]["pass_at_1"]
    assert row["ours_pass_at_1_ci_low"] <= row["ours_pass_at_1"] <= row["ours_pass_at_1_ci_high"]
    assert "tasks only" in row["ours_pass_at_1_note"] and 0.0 <= row["base_pass_at_1"] <= 1.0
    # resumed: the finished run's training and evaluation are read back, not redone, and give the same row
    stored = {f: f.read_bytes() for f in work.rglob("*.json")}
    again = run_smoke("learning", tmp_path / "again", "--work", str(work))
    assert {f: f.read_bytes() for f in work.rglob("*.json")} == stored
    # (the row's stamp differs: when, on what commit, and the load averages at start and end)
    def unstamped(r: dict) -> dict:
        out = {k: v for k, v in r.items() if k not in ("date", "commit")}
        out["machine"] = {k: v for k, v in r["machine"].items() if k not in ("load_start", "load_end")}
        return out

    assert unstamped(again) == unstamped(row)


def test_generate_batching(tmp_path):
    row = run_smoke("generate_batching", tmp_path)
    assert row["prompts"] == [6] and row["real_prompt_tokens"] == 5 + 6 + 7 + 8 + 9 + 40
    # arrival order: [5, 6, 7, 8] padded to 8, [9, 40] to 40
    assert row["arrival_batches"] == 2 and row["arrival_padded_tokens"] == 4 * 8 + 2 * 40
    # overhead 0: every length alone, no padding; 16: [5, 6] [7, 8, 9] [40], cost 12 + 27 + 40 + 3 x 16
    # = 127, the least (ties [5, 6, 7] [8, 9] [40]: the earlier cut wins)
    assert row["plan@0_batches"] == 6 and row["plan@0_padded_tokens"] == row["real_prompt_tokens"]
    assert row["plan@16_batches"] == 3 and row["plan@16_padded_tokens"] == 2 * 6 + 3 * 9 + 40
    # the speedup is taken from unrounded times; the row's seconds are rounded to ms
    assert row["arrival_s"] > 0
    assert row["plan@16_speedup"] == pytest.approx(row["arrival_s"] / row["plan@16_s"], rel=0.05)
    assert row["batch_loop_s"] > 0


def test_p5_beta_pilot(tmp_path):
    """The pilot's --quick version trains its four k1-in-reward arms on the tiny model, and the rule
    picks one of the candidate betas from the KL each arm measured."""
    row = run_smoke("p5_beta_pilot", tmp_path)
    arms = {a["beta"]: a for a in row["arms"]}
    assert sorted(arms) == [0.001, 0.05, 0.3, 1.0] and row["anchor_beta"] == 0.001
    assert all(a["late_kl"] == a["late_kl"] for a in arms.values())  # measured: no NaN
    assert row["chosen_beta"] in (0.05, 0.3, 1.0)
    assert row["rule_met"] == any(arms[b]["late_kl"] <= 0.5 * arms[0.001]["late_kl"] for b in (0.05, 0.3, 1.0))


def test_cache_check(tmp_path):
    row = run_smoke("cache_check", tmp_path)
    assert row["artifacts"] == 5 and set(row["stages"]) == {"freeze", "rollout", "train", "evaluate", "analyze"}
    assert row["bytes"] == sum(s["bytes"] for s in row["stages"].values()) > 0
    assert row["first_s"] == pytest.approx(sum(s["first_s"] for s in row["stages"].values()), abs=1e-3)
    assert row["warm_s"] > 0 and row["warm_mb_per_s"] == pytest.approx(row["bytes"] / 1e6 / row["warm_s"], rel=0.01)


def test_bipa_budget(tmp_path):
    from tasks.bipa.config import load_bipa_config

    row = run_smoke("bipa_budget", tmp_path)
    cfg = load_bipa_config(ROOT / "configs/p2-findings.yaml", quick=True)
    b, f = cfg.bipa, cfg.bipa.findings
    # counted from the config here: the seed, the pool, the placebo and one rewrite per optimizer seed and round
    candidates = 1 + len(f.edits) + 1 + len(f.rewrite_seeds) * f.rewrite_rounds
    assert row["kind"] == "estimate" and row["quick"] is True and row["config"] == "configs/p2-findings.yaml"
    assert row["candidates"] == candidates
    assert row["episodes"] == candidates * (2 * b.selection_tasks + b.test_tasks) * b.samples
    # the unit is printed rounded to 1 ms and the estimate to 0.1 s
    assert row["estimate_s"] == pytest.approx(row["episodes"] * row["s_per_episode_p6"], abs=0.0005 * row["episodes"] + 0.05)
