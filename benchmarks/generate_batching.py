"""Length-bucketed generation batches against batches in arrival order, on the same prompts.

``HFPolicy.generate`` left-pads each batch to its longest prompt, so one long prompt among short
ones makes every row pay for its length, in prefill and in every decode step's attention.
:func:`tasks.rollout.engines.hf.plan_batches` sorts the prompts by length and cuts them where the
padded tokens saved outweigh one more batch (``policy.batch_overhead_tokens``). This script
measures, on one set of prompt lengths:

1. ``arrival``: batches of ``--batch-size`` in the callers' order (what ``generate`` did before
   the planner), and ``plan@K`` for each ``--overhead`` K: seconds, batches, padded prompt tokens
   and the speed-up over ``arrival``. Every arm samples the same prompts with the same settings.
2. The calibration behind the default K: the seconds of one batch's decode loop (one 8-token
   prompt), and the seconds per padded prompt token (the slope between two batches of
   ``--batch-size`` rows at two widths); ``overhead_tokens_measured`` = the first over the second.

The default lengths are the react-python turn-1 and turn-2 prompts of one default run (27 each;
the longest holds a 600-character observation), generated as random token ids of those lengths.

    .venv/bin/python benchmarks/generate_batching.py                 # SmolLM2-135M, 64 new tokens
    .venv/bin/python benchmarks/generate_batching.py --smoke         # tiny model, seconds

Prints the figures and appends one JSON row to ``benchmarks/results/generate_batching.jsonl``.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._results import report, tiny_model  # noqa: E402

#: react-python prompt lengths (tokens) at turns 1 and 2 of `harnessrl run` on configs/default.yaml as it
#: was until 2026-12-06 (arithmetic and GSM8K-style problems): a fixed workload, kept for comparable rows
DEFAULT_LENGTHS = [
    109, 109, 110, 112, 114, 116, 116, 118, 118, 124, 135, 148, 150, 151, 153, 153, 164, 167, 167, 168,
    178, 179, 230, 243, 259, 259, 764,
    150, 150, 164, 168, 171, 174, 195, 206, 212, 213, 227, 233, 235, 236, 241, 241, 255, 257, 263, 277,
    278, 291, 291, 314, 339, 349, 838,
]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="packaged model name or folder")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--overhead", type=int, action="append", help="batch_overhead_tokens arms (repeatable)")
    ap.add_argument("--lengths", help="comma-separated prompt lengths; turns split by ';'")
    ap.add_argument("--smoke", action="store_true", help="tiny model, 6 short prompts, 4 new tokens")
    args = ap.parse_args(argv)

    import torch

    from tasks.config import PolicyConfig
    from tasks.harnesses.spec import SamplingSpec
    from tasks.rollout.models import resolve_model
    from tasks.rollout.engines.hf import HFPolicy, plan_batches

    torch.manual_seed(0)
    if args.smoke:
        model_dir = tiny_model(tempfile.mkdtemp(prefix="bench-batching-"))
        turns, max_new, batch_size, overheads = [[5, 6, 7, 8, 9, 40]], 4, 4, [0, 16]
        calib_widths = (8, 16)
    else:
        model_dir = resolve_model(args.model)
        if args.lengths:
            turns = [[int(x) for x in t.split(",")] for t in args.lengths.split(";")]
        else:
            turns = [DEFAULT_LENGTHS[:27], DEFAULT_LENGTHS[27:]]
        max_new, batch_size, overheads = args.max_new_tokens, args.batch_size, args.overhead or [0, 512, 1536, 4096]
        calib_widths = (16, 256)
    cfg = PolicyConfig(model=str(model_dir), batch_size=batch_size)
    policy = HFPolicy(model_dir, cfg, base_model_id="bench")
    vocab = len(policy.tokenizer)
    rng = random.Random(0)
    prompts = [[[rng.randrange(3, vocab) for _ in range(n)] for n in t] for t in turns]
    sampling = SamplingSpec(temperature=0.7, top_p=1.0, top_k=0, max_new_tokens=max_new)
    policy.generate([p[:4] for p in prompts[0][:2]], sampling, 0)  # warm-up

    def timed(plan_of) -> tuple[float, int, int]:
        seconds, batches, padded = 0.0, 0, 0
        for t, ps in enumerate(prompts):
            plan = plan_of([len(p) for p in ps])
            t0 = time.perf_counter()
            for b, rows in enumerate(plan):
                policy._generate_batch([ps[i] for i in rows], sampling, 100 * t + b)
            seconds += time.perf_counter() - t0
            batches += len(plan)
            padded += sum(len(rows) * max(len(ps[i]) for i in rows) for rows in plan)
        return seconds, batches, padded

    row: dict = {"smoke": args.smoke, "model": "tiny" if args.smoke else args.model, "batch_size": batch_size,
                 "max_new_tokens": max_new, "prompts": [len(t) for t in turns],
                 "real_prompt_tokens": sum(sum(t) for t in turns)}
    arrival = timed(lambda ls: [list(range(i, min(i + batch_size, len(ls)))) for i in range(0, len(ls), batch_size)])
    row.update(arrival_s=round(arrival[0], 3), arrival_batches=arrival[1], arrival_padded_tokens=arrival[2])
    for k in overheads:
        s, b, pad = timed(lambda ls: plan_batches(ls, batch_size, k))
        row.update({f"plan@{k}_s": round(s, 3), f"plan@{k}_batches": b, f"plan@{k}_padded_tokens": pad,
                    f"plan@{k}_speedup": round(arrival[0] / s, 3)})

    def one(rows: int, width: int) -> float:
        ps = [[rng.randrange(3, vocab) for _ in range(width)] for _ in range(rows)]
        t0 = time.perf_counter()
        policy._generate_batch(ps, sampling, 7)
        return time.perf_counter() - t0

    fixed = min(one(1, 8) for _ in range(2))
    narrow, wide = (min(one(batch_size, w) for _ in range(2)) for w in calib_widths)
    per_token = (wide - narrow) / (batch_size * (calib_widths[1] - calib_widths[0]))
    row.update(batch_loop_s=round(fixed, 3), padded_token_ms=round(1000 * per_token, 4),
               overhead_tokens_measured=(round(fixed / per_token) if per_token > 0
                                         else "n/a: the wider batch was not slower than the narrow one"))
    report("generate_batching", row)


if __name__ == "__main__":
    main()
