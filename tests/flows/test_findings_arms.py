"""The findings page's arm table: each training arm's KL configuration matched to its row of P5's
estimator table, its stability by the pre-registered rule and its sealed pass@1, from the analyze
artifacts of a run."""

from flows.published_findings import arm_rows
from schemas import ArtifactStore
from tasks.analysis.arms import training_stability
from tasks.config import RunConfig


def _kl_row(conf: str, unbiased: bool, rel: float) -> dict:
    est, place, *rest = conf.split("/")
    return {"configuration": conf, "estimator": est, "placement": place, "sampling": rest[0] if rest else "on-policy",
            "vocab": 3, "length": 3, "kl": 0.1, "grad_kl_norm": 0.4, "expected_grad_norm": 0.4, "bias_norm": rel * 0.4,
            "relative_bias": rel, "unbiased": unbiased, "token_level_bias_norm": 0.0, "token_level_unbiased": True,
            "mc_samples": 16, "mc_error_norm": 0.01, "mc_se_norm": 0.01, "paper_unbiased": unbiased,
            "agrees_with_paper": True}


def test_arm_rows_match_each_arm_to_its_kl_configuration_stability_and_pass_rates(tmp_path):
    cfg = RunConfig.model_validate({
        "name": "p5", "suites": [{"name": "basic_arithmetic", "size": 20}], "split": {"test_fraction": 0.5},
        "harnesses": ["direct"], "train": {"mode": "online", "steps": 4, "kl": {"estimator": "k1", "placement": "reward", "beta": 0.3}},
        "arms": [{"name": "k1-reward"},
                 {"name": "off-k3-is", "train": {"max_staleness": 2, "kl": {"estimator": "k3", "placement": "loss",
                                                                             "importance_weighted": True}}},
                 {"name": "nokl", "train": {"kl": {"beta": 0.0}}}]})
    store = ArtifactStore(tmp_path)
    store.write("analyze", "kl_check", [_kl_row("k1/reward", True, 0.0), _kl_row("k3/loss/stale-is", True, 0.0),
                                        _kl_row("k3/loss/stale", False, 1.4)])
    steps = [{"arm": a, "step": i, "loss": 0.1, "kl": 0.01, "grad_norm": 1.0, "reward_mean": r}
             for a, rs in {"k1-reward": [0.2, 0.3, 0.3, 0.4], "off-k3-is": [0.4, 0.4, 0.1, 0.05],
                           "nokl": [0.2, 0.2, 0.2, 0.2]}.items() for i, r in enumerate(rs)]
    store.write("analyze", "training_stability",
                training_stability(steps, 1.0, {"window": 2, "reward_collapse": 0.5, "grad_norm_factor": 10.0}))
    store.write("analyze", "suite_pass_rates", [
        {"checkpoint": ck, "harness_name": "direct", "suite": "reasoning_gym/basic_arithmetic", "n_tasks": 10,
         "graded": 20, "pass_at_1": p, "ci_low": p - 0.1, "ci_high": p + 0.1, "median_turns": 1.0}
        for ck, p in (("base", 0.2), ("k1-reward", 0.4), ("off-k3-is", 0.15), ("nokl", 0.3))])
    rows = {r["arm"]: r for r in arm_rows(store, cfg, "p5-abc")}
    assert list(rows) == ["k1-reward", "off-k3-is", "nokl"]
    k1, off, nokl = rows["k1-reward"], rows["off-k3-is"], rows["nokl"]
    assert (k1["kl_config"], k1["unbiased"], k1["relative_bias"], k1["stable"]) == ("k1/reward", True, 0.0, True)
    assert [p["pass_at_1"] for p in k1["pass_at_1"]] == [0.4]  # its own checkpoint only, not base's
    assert (off["kl_config"], off["unbiased"], off["max_staleness"]) == ("k3/loss/stale-is", True, 2)
    assert off["stable"] is False and "reward collapsed" in off["reason"] and abs(off["late_reward"] - 0.075) < 1e-12
    assert (nokl["kl_config"], nokl["unbiased"], nokl["relative_bias"], nokl["beta"]) == ("", None, None, 0.0)
    assert k1["steps"] == [] and k1["base_steps"] == []  # no analyze/step_failures here
    assert arm_rows(ArtifactStore(tmp_path / "empty"), cfg, "x") == []  # not analysed: no rows


def test_arm_rows_carry_each_arms_and_the_bases_steps(tmp_path):
    from tasks.analysis.steps import step_failures

    cfg = RunConfig.model_validate({
        "name": "p6", "suites": [{"name": "chain_sum", "size": 20}], "split": {"test_fraction": 0.5},
        "harnesses": ["react-python"], "train": {"agg": "seq_mean_token_mean"},
        "arms": [{"name": "gspo", "train": {"algorithm": "gspo"}}, {"name": "grpo"}]})
    store = ArtifactStore(tmp_path)
    store.write("analyze", "training_stability", training_stability(
        [{"arm": a, "step": 0, "loss": 0.1, "kl": float("nan"), "grad_norm": 1.0, "reward_mean": 0.1}
         for a in ("gspo", "grpo")], 1.0))
    ev = [{"eval_id": f"{ck}{i}", "checkpoint": ck, "harness_name": "react-python", "record_id": f"r{i}",
           "task_id": f"t{i}", "attempt": 0, "retry": 0, "status": "resolved" if ok else "unresolved",
           "resolved": ok, "num_turns": n, "final_answer": "1", "answer_parsed": True}
          for ck, outs in (("base", [(False, 3), (True, 3)]), ("gspo", [(True, 1), (True, 2)]))
          for i, (ok, n) in enumerate(outs)]
    store.write("analyze", "step_failures", step_failures(ev, [], {"react-python": 3}, set()))
    rows = {r["arm"]: r for r in arm_rows(store, cfg, "p6-abc")}
    g = rows["gspo"]
    assert [(s["harness"], s["solved"], s["median_turns_solved"], s["mean_turns_solved"]) for s in g["steps"]] == \
        [("react-python", 2, 1.5, 1.5)]
    assert [(s["solved"], s["failed"], s["median_turns_solved"], s["median_turns_failed"]) for s in g["base_steps"]] \
        == [(1, 1, 3.0, 3.0)]
    assert rows["grpo"]["steps"] == [] and rows["grpo"]["base_steps"] == g["base_steps"]
