"""``benchmarks/gpu_check.sh``: it refuses clearly without a CUDA GPU, and its figures are the run
folder's own (the GPU runs themselves need a GPU: not run here)."""

import importlib.util
import json
import math
import shutil
import statistics
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="checks the refusal on a host without a GPU")
def test_gpu_check_refuses_without_cuda_before_setting_anything_up():
    p = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert "no CUDA GPU on this machine" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert "setup" not in p.stdout  # refused before bootstrap / setup-vllm


def test_figures_are_the_runs_timing_and_agreement(tiny_model_dir, tmp_path, monkeypatch):
    from tasks.config import RunConfig
    from tasks.train.stage import run_train
    from tests.train.test_arms import BASE, _store

    cfg = RunConfig.model_validate({**BASE, "policy": {"model": str(tiny_model_dir)},
                                    "train": {"ppo_epochs": 2, "lora": {"r": 4, "alpha": 8}}})
    store, refs = _store(tmp_path, cfg)
    run_train(store, cfg, refs)
    (tmp_path / ".harnessrl").mkdir()
    (tmp_path / ".harnessrl" / "rollout.json").write_text(json.dumps({"state": "Completed", "seconds": 4.0}))
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("gpu_check_bench", ROOT / "benchmarks" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    f = mod.figures(str(tmp_path))
    steps = store.rows(store.ref("train", "train_steps"))
    timing = store.manifest("train", "train_steps")["extra"]["timing"]
    eps = store.rows(refs["episodes"])
    assert f["train_steps"] == len(steps) == 2
    assert f["sample_tokens_per_s"] == pytest.approx(sum(e["output_tokens"] for e in eps) / 4.0)
    assert f["train_s_per_step"] == pytest.approx(statistics.mean(t["seconds"] for t in timing))
    assert f["logp_mismatch_max"] == max(r["logp_mismatch_max"] for r in steps) > 0  # sampler logp -2.0: far off
    assert math.isnan(f["sync_max_abs_logp_diff"])  # frozen: no weight sync
    assert mod.figures(str(tmp_path / "nothing")) is None
