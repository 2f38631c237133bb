"""Throughput of P1's log-odds scoring (tasks/analysis/logodds.py) on SmolLM2-135M-Instruct:
``states`` x ``G`` candidate completions sharing each state's prompt, scored under the adapter
(policy) and with it disabled (reference), float32 on the CPU.

    python -m benchmarks.logodds [--states 16] [--group 4] [--prompt 256] [--completion 64] [--batch 16]
    python -m benchmarks.logodds --smoke    # the tests' tiny model, 2 states x 2, seconds
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--states", type=int, default=16)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--completion", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--smoke", action="store_true", help="the tests' tiny model, 2 states x 2 completions, short")
    a = ap.parse_args()
    from peft import LoraConfig, get_peft_model

    from tasks.analysis.logodds import adapter_scorers
    from benchmarks._results import tiny_model
    from tasks.rollout.models import load_model_and_tokenizer, resolve_model

    if a.smoke:
        a.model = str(tiny_model(Path(tempfile.mkdtemp()) / "tiny"))
        a.states, a.group, a.prompt, a.completion, a.batch = 2, 2, 16, 8, 4
    base, tok = load_model_and_tokenizer(resolve_model(a.model), "cpu", "float32")
    torch.manual_seed(0)
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                            task_type="CAUSAL_LM"))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.01)
    g = torch.Generator().manual_seed(1)
    vocab = len(tok)
    items = []
    for _s in range(a.states):
        prompt = torch.randint(0, vocab, (a.prompt,), generator=g).tolist()
        for _c in range(a.group):
            items.append((prompt, torch.randint(0, vocab, (a.completion,), generator=g).tolist()))
    pol, ref = adapter_scorers(model, tok, batch_size=a.batch)
    t0 = time.perf_counter()
    lp = pol(items, 0.7)
    t1 = time.perf_counter()
    lr = ref(items, 0.7)
    t2 = time.perf_counter()
    from benchmarks._results import report

    report("logodds", {
        "model": "tiny (smoke)" if a.smoke else a.model, "smoke": a.smoke, "threads": torch.get_num_threads(), "cpus": os.cpu_count(), "states": a.states,
        "group": a.group, "prompt_tokens": a.prompt, "completion_tokens": a.completion, "batch": a.batch,
        "sequences": len(items), "policy_s": round(t1 - t0, 3), "reference_s": round(t2 - t1, 3),
        "sequences_per_s": round(2 * len(items) / (t2 - t0), 2),
        "mean_abs_logp_diff": round(sum(abs(x - y) for x, y in zip(lp, lr)) / len(items), 4),
    })


if __name__ == "__main__":
    main()
