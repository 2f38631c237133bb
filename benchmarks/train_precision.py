"""The trainer under bf16 autocast against float32, on one fixed batch (issue 52, part 3).

Two trainers with the same config, seed and adapter initialisation, one with
``policy.autocast_dtype: float32`` (no autocast: the base weights and every matmul in float32),
one with ``bfloat16`` (the frozen base weights held in bf16, forward passes under autocast; the
LoRA weights, their gradients and AdamW's state stay float32). Both take one GRPO step on the same
batch: 4 groups x 8 sequences of SmolLM2-135M's chat prompt for a product question and a completion
written here (64 tokens at most), rewards 1 for the sequences whose completion holds the right
product. Printed and written to ``benchmarks/results/train_precision.jsonl``:

- the log-probs of the completion tokens before the step: max and mean |bf16 - fp32| (nats);
- the step's loss and gradient norm (pre-clipping) on each side, and their relative differences;
- the update: cosine between the two adapters' changes (all LoRA weights flattened) and the ratio
  of their norms;
- seconds of the step on each side (median of ``--repeats`` fresh steps; the CPU and load are in the
  row's machine block).

    .venv/bin/python benchmarks/train_precision.py [--repeats 3]
    .venv/bin/python benchmarks/train_precision.py --smoke   # the tests' tiny model, seconds
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import report  # noqa: E402


def batch(tokenizer, groups: int, group: int) -> list:
    """``groups`` x ``group`` sequences: a chat prompt per group, completions that state a product,
    right (reward 1) for every other one."""
    from tasks.rollout.generation import ChatFormat
    from tasks.train.sequences import TrainSequence

    seqs = []
    for g in range(groups):
        a, b = 12 + 7 * g, 23 + 5 * g
        prompt = ChatFormat(tokenizer).initial("You are a careful assistant.", f"What is {a} * {b}?")
        for k in range(group):
            right = k % 2 == 0
            answer = a * b if right else a * b + 10 * (k + 1)
            text = f"{a} * {b}: {a} * {b - 3} is {a * (b - 3)}, plus {a} * 3 = {3 * a}, so the answer is {answer}."
            comp = tokenizer.encode(text, add_special_tokens=False)[:64] + [tokenizer.eos_token_id]
            ids = prompt + comp
            seqs.append(TrainSequence(f"g{g}-{k}", ids, [0] * len(prompt) + [1] * len(comp), [0.0] * len(ids),
                                      1.0 if right else 0.0, f"t{g}", f"h{g}", "H", (1.0, 0, 1.0)))
    return seqs


def one_side(model: str, dtype: str, repeats: int, groups: int, group: int) -> dict:
    import torch

    from tasks.config import RunConfig
    from tasks.rollout.models import resolve_model
    from tasks.train.trainer import Trainer

    cfg = RunConfig.model_validate({
        "name": f"precision-{dtype}", "seed": 0, "suites": [{"name": "basic_arithmetic", "size": 2}],
        "harnesses": ["direct"],
        "policy": {"model": model, "rollout_dtype": dtype, "autocast_dtype": dtype},
        "train": {"lr": 1e-5, "micro_batch_size": 8, "kl": {"beta": 0.0}, "lora": {"r": 16, "alpha": 32}},
    })
    model_dir = resolve_model(model)
    out: dict = {"autocast_dtype": dtype, "step_s": []}
    for rep in range(repeats):
        tr = Trainer(cfg, model_dir, log=lambda m: None)
        seqs = batch(tr.tokenizer, groups, group)
        before = {k: v.detach().clone() for k, v in tr.model.named_parameters() if ".lora_" in k}
        lps = tr.passes(seqs, list(range(len(seqs))), "policy")
        b = tr.new_batch(seqs)
        t0 = time.perf_counter()
        row, _ = tr.step(b, list(range(len(seqs))))
        out["step_s"].append(time.perf_counter() - t0)
        if rep == 0:
            out["loss"], out["grad_norm"] = float(row["loss"]), float(row["grad_norm"])
            out["logprobs"] = [lps[i][torch.tensor(s.mask[1:], dtype=torch.bool)] for i, s in enumerate(seqs)]
            out["update"] = torch.cat([(p.detach() - before[k]).flatten() for k, p in tr.model.named_parameters()
                                       if ".lora_" in k])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="fresh steps timed per side (the first one is measured)")
    ap.add_argument("--smoke", action="store_true", help="the tests' tiny model, 2 groups x 4, one repeat")
    args = ap.parse_args()
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from _results import tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model, groups, group, repeats = "smollm2-135m-instruct", 4, 8, args.repeats
        if args.smoke:
            model, groups, group, repeats = str(tiny_model(Path(tmp) / "tiny")), 2, 4, 1
        f32 = one_side(model, "float32", repeats, groups, group)
        b16 = one_side(model, "bfloat16", repeats, groups, group)
    d = torch.cat([a - b for a, b in zip(b16["logprobs"], f32["logprobs"])]).abs()
    u32, u16 = f32["update"], b16["update"]
    cos = float(torch.nn.functional.cosine_similarity(u32, u16, dim=0)) if u32.norm() > 0 and u16.norm() > 0 else None
    row = {
        "model": "tiny (smoke)" if args.smoke else model, "sequences": groups * group, "smoke": args.smoke,
        "completion_tokens": int(d.numel()),
        "logprob_abs_diff_max": round(float(d.max()), 4), "logprob_abs_diff_mean": round(float(d.mean()), 4),
        "loss_fp32": f32["loss"], "loss_bf16": b16["loss"],
        "grad_norm_fp32": round(f32["grad_norm"], 5), "grad_norm_bf16": round(b16["grad_norm"], 5),
        "grad_norm_rel_diff": round(abs(b16["grad_norm"] - f32["grad_norm"]) / f32["grad_norm"], 4)
        if f32["grad_norm"] else None,
        "update_cosine": round(cos, 4) if cos is not None else None,
        "update_norm_ratio_bf16_over_fp32": round(float(u16.norm() / u32.norm()), 4) if u32.norm() > 0 else None,
        "step_s_fp32": round(statistics.median(f32["step_s"]), 2), "step_s_bf16": round(statistics.median(b16["step_s"]), 2),
    }
    row["speedup_bf16"] = round(row["step_s_fp32"] / row["step_s_bf16"], 2) if row["step_s_bf16"] else None
    report("train_precision", row)


if __name__ == "__main__":
    main()
