"""Policy engines side by side: start time (s) and sampling throughput (completion tokens/s) of
the ``hf`` and ``vllm`` engines on one model, same prompts and sampling settings.

    python benchmarks/engines.py [--model tiny|smollm2-135m-instruct|DIR] [--prompts 16] [--tokens 64]

``tiny`` builds the tests' tiny model in a temp folder. Throughput is measured on the second of
two identical calls (the first warms up). Needs .venv-vllm (scripts/setup-vllm.sh).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._results import report  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()

    from tasks.config import PolicyConfig
    from tasks.harnesses.spec import SamplingSpec
    from tasks.rollout.engines import make_policy
    from tasks.rollout.models import build_tiny_model, model_id, resolve_model

    if args.model == "tiny":
        path = build_tiny_model(Path(tempfile.mkdtemp()) / "tiny", seed=0)
    else:
        path = resolve_model(args.model)
    sampling = SamplingSpec(temperature=1.0, max_new_tokens=args.tokens)
    row = {"model": args.model, "prompts": args.prompts, "max_new_tokens": args.tokens, "dtype": args.dtype}
    for engine in ("hf", "vllm"):
        cfg = PolicyConfig(model=str(path), engine=engine, rollout_dtype=args.dtype, batch_size=args.prompts)
        t0 = time.monotonic()
        pol = make_policy(path, cfg, base_model_id=model_id(path))
        row[f"{engine}_start_s"] = round(time.monotonic() - t0, 2)
        prompts = [pol.tokenizer.encode(f"Question {i}: what is {i} + {2 * i}? Think step by step.") for i in range(args.prompts)]
        pol.generate(prompts, sampling, seed=0)
        t0 = time.monotonic()
        gens = pol.generate(prompts, sampling, seed=1)
        dt = time.monotonic() - t0
        n = sum(len(g.token_ids) for g in gens)
        row[f"{engine}_tokens"] = n
        row[f"{engine}_tokens_per_s"] = round(n / dt, 1)
        if hasattr(pol, "close"):
            pol.close()
    report("engines", row)


if __name__ == "__main__":
    main()
