"""Policy engines side by side: start time (s) and sampling throughput (completion tokens/s) of
the ``hf`` and ``vllm`` engines on one model, same prompts and sampling settings.

    python benchmarks/engines.py [--model tiny|smollm2-135m-instruct|DIR] [--prompts 16] [--tokens 64]
                                [--lora R] [--prompt-words W]

``tiny`` builds the tests' tiny model in a temp folder. Throughput is measured on the second of
two identical calls (the first warms up). ``--lora R`` adds the ``vllm`` engine with a random
(non-zero) rank-R LoRA adapter applied both ways (``policy.vllm.lora``: ``adapter``, vLLM's LoRA
layers; ``merged``, merged into the weights), so the three vLLM rows compare side by side in one
run; ``--prompt-words`` pads each prompt (multi-turn episodes carry long prompts). Needs
.venv-vllm (scripts/setup-vllm.sh). ``--smoke``: the tiny model, 2 prompts x 8 tokens, the ``hf``
engine only (vLLM's start alone takes longer than a smoke may; the row says it was skipped).
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
    ap.add_argument("--lora", type=int, default=0, help="rank of a random LoRA adapter to compare (0: none)")
    ap.add_argument("--prompt-words", type=int, default=0, help="words of filler added to every prompt")
    ap.add_argument("--smoke", action="store_true", help="tiny model, 2 prompts x 8 tokens, hf only (seconds)")
    args = ap.parse_args()
    if args.smoke:
        args.model, args.prompts, args.tokens, args.lora, args.dtype = "tiny", 2, 8, 0, "float32"

    from tasks.config import PolicyConfig
    from tasks.harnesses.spec import SamplingSpec
    from tasks.rollout.engines import make_policy
    from benchmarks._results import tiny_model
    from tasks.rollout.models import model_id, resolve_model

    if args.model == "tiny":
        path = tiny_model(Path(tempfile.mkdtemp()) / "tiny")
    else:
        path = resolve_model(args.model)
    sampling = SamplingSpec(temperature=1.0, max_new_tokens=args.tokens)
    row = {"model": args.model, "prompts": args.prompts, "max_new_tokens": args.tokens, "dtype": args.dtype,
           "lora_rank": args.lora, "prompt_words": args.prompt_words, "smoke": args.smoke}
    runs = [("hf", "hf", None), ("vllm", "vllm", None)]
    if args.smoke:
        runs = runs[:1]
        row["skipped"] = "vllm (engine start takes longer than a smoke run)"
    adapter = None
    if args.lora:
        adapter = _random_adapter(path, Path(tempfile.mkdtemp()) / "adapter", args.lora)
        runs += [("vllm_adapter", "vllm", "adapter"), ("vllm_merged", "vllm", "merged")]
    filler = " ".join(["context"] * args.prompt_words)
    for engine, kind, lora in runs:
        cfg = PolicyConfig(model=str(path), engine=kind, rollout_dtype=args.dtype, batch_size=args.prompts,
                           vllm={"lora": lora or "auto"})
        t0 = time.monotonic()
        pol = make_policy(path, cfg, base_model_id=model_id(path), adapter_dir=adapter if lora else None)
        row[f"{engine}_start_s"] = round(time.monotonic() - t0, 2)
        prompts = [pol.tokenizer.encode(f"{filler} Question {i}: what is {i} + {2 * i}? Think step by step.")
                   for i in range(args.prompts)]
        pol.generate(prompts, sampling, seed=0)
        t0 = time.monotonic()
        gens = pol.generate(prompts, sampling, seed=1)
        dt = time.monotonic() - t0
        n = sum(len(g.token_ids) for g in gens)
        row[f"{engine}_tokens"] = n
        row[f"{engine}_tokens_per_s"] = round(n / dt, 1)
        if hasattr(pol, "close"):
            pol.close()
    if args.lora:
        row["adapter_over_merged_time"] = round(row["vllm_merged_tokens_per_s"] / row["vllm_adapter_tokens_per_s"], 2)
    report("engines", row)


def _random_adapter(model_dir: Path, out: Path, r: int) -> Path:
    """A peft LoRA adapter of rank ``r`` on every projection with random (non-zero) A and B."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    get_peft_model(model, LoraConfig(r=r, lora_alpha=2 * r, init_lora_weights=False, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])).save_pretrained(out)
    return out


if __name__ == "__main__":
    main()
