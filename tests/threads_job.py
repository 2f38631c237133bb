"""Run by tests/test_reproducibility.py in a fresh process whose thread settings (or CPU kernels) it chose: freeze,
roll out with the tiny test model, train one step, evaluate, each stage's function called as the
pipeline calls it (no Prefect), then print one JSON line: every artifact's SHA-256, the adapter's
weights file, and the torch / OpenMP / OpenBLAS thread counts this process ran with.

Usage: ``python tests/threads_job.py MODEL_DIR RUN_DIR TORCH_THREADS``. The environment sets
``OMP_NUM_THREADS``, ``MKL_NUM_THREADS`` and ``OPENBLAS_NUM_THREADS`` (they are read when the
libraries load); ``TORCH_THREADS`` goes to ``torch.set_num_threads`` before any stage runs.
"""

import json
import logging
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def config(model_dir: str):
    """The run: 4 arithmetic tasks (2 train, 2 test), the ``direct`` harness, 2 samples per train
    task, one optimizer step over the 4 sequences, 1 attempt per test task and checkpoint."""
    from tasks.config import RunConfig

    return RunConfig.model_validate({
        "name": "threads", "seed": 11,
        "suites": [{"name": "basic_arithmetic", "size": 4, "seed": 1,
                    "params": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}],
        "split": {"test_fraction": 0.5}, "harnesses": ["direct"],
        "policy": {"model": model_dir},
        "rollout": {"samples_per_task": 2, "task_runner": "serial"},  # no Prefect API needed (same rows)
        "train": {"epochs": 1, "batch_size": 4, "micro_batch_size": 2, "lr": 0.01},
        "evaluate": {"attempts": 1, "harnesses": ["direct"], "bootstrap_resamples": 200},
        "analyze": {"ceiling_k": 1},
    })


def main(model_dir: str, run_dir: str, torch_threads: int) -> dict:
    import torch

    torch.set_num_threads(torch_threads)
    from schemas import ArtifactStore
    from schemas.machine import thread_counts
    from tasks.evaluate.prereg import write_preregistration
    from tasks.evaluate.stage import run_evaluate
    from tasks.records.stage import run_freeze
    from tasks.rollout.stage import run_rollout
    from tasks.train.stage import run_train

    cfg = config(model_dir)
    store = ArtifactStore(run_dir)
    frozen = run_freeze(store, cfg, {})
    write_preregistration(store, cfg)  # as flows.stages.freeze_and_preregister does (no Prefect here)
    rolled = run_rollout(store, cfg, frozen)
    trained = run_train(store, cfg, {**frozen, **rolled})
    evaluated = run_evaluate(store, cfg, {**frozen, "episodes": rolled["episodes"],
                                          "checkpoints": trained["checkpoints"]})
    refs = {**frozen, **rolled, **trained, **evaluated}
    final = next(r for r in store.rows(trained["checkpoints"]) if r["name"] == "final")
    return {"artifacts": {f"{r.stage}/{r.name}": r.sha256 for r in refs.values()},
            "adapter_dir": str(Path(run_dir) / final["path"]), "adapter_sha256": final["adapter_sha256"],
            "threads": thread_counts()}


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    out = main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
    print("RESULT " + json.dumps(out), flush=True)
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown of native thread pools (see tests/train/torchrun_job.py)
