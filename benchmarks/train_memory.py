"""Peak memory (RSS) of one training step on SmolLM2-135M, the path before issue 53 against the
bounded one, each case in a fresh process so that peaks do not mix.

Cases (``configs/p6-findings.yaml``'s train settings: GSPO, sequence-mean-token-mean, LoRA r 32 /
alpha 64 on every linear layer, float32, shared prompt, frozen mode with recomputed old log-probs):

- ``p6-longest``: one step on P6's longest micro-batch, ``micro_batch_size`` (16) sequences of the
  longest length its rollout config allows (:func:`p6_max_len`: the rendered first prompt of the
  longest task, then per turn ``max_new_tokens`` policy tokens and between turns an observation of
  ``observation_max_chars`` characters at one token each, the byte-level tokenizer's bound for
  ASCII; two groups of 8 samples sharing their prompt);
- ``16x8x1024``: one step on 16 groups x 8 samples x 1,024 tokens (a 256-token shared prompt, 768
  policy tokens); ``--groups-1024 G`` runs G of the 16 groups (micro-batches of the same shape,
  fewer of them; the row records G).

Each runs ``old`` (``logprob_chunk_tokens: 0``, the whole ``[N, V]`` logits at once; micro-batches
by the count only, as before), ``new`` (the defaults: chunks of 256 policy tokens, micro-batches
within 1,536 padded tokens, a micro-batch without a shared prompt and over 512 padded tokens
checkpointed automatically), ``new-no-auto`` (``new`` without the automatic checkpointing,
``checkpoint_above_tokens: 0``: what ``new`` measured before that existed), ``unchunked`` (the
token budget with the whole logits at once: what the chunking alone saves and costs; no
automatic checkpointing) and ``new+checkpointing`` (``new`` with ``gradient_checkpointing: true``,
``share_prompt: false``: the decoder's activations recomputed in the backward pass in every
micro-batch; a micro-batch of one sequence has no prompt to share). A case runs in its own
process with ``torch.set_num_threads(2)``; the figure is its ``ru_maxrss`` (resident peak, model
load included), its step's seconds, its micro-batches and how many of their training forwards
the automatic choice checkpointed. ``--limit-gb`` caps each process's address space
(``RLIMIT_AS``) so that an old path that would take the shared machine down fails alone: such a
case reports ``over_limit_gb`` instead of a peak.

    flock /tmp/harnessrl-heavy.lock .venv/bin/python benchmarks/train_memory.py
    .venv/bin/python benchmarks/train_memory.py --smoke   # the tests' tiny model, small shapes, seconds

Prints the figures and appends one JSON row to ``benchmarks/results/train_memory.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import report  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
P6 = ROOT / "configs" / "p6-findings.yaml"
GOAL_MB = 4096


def p6_max_len(cfg, tokenizer) -> dict:
    """The longest sequence (tokens) P6's rollout config allows, from its harness and tasks:
    ``prompt`` (system prompt with the skill, the longest task instruction, chat template) +
    ``max_turns`` x ``max_new_tokens`` + (``max_turns`` - 1) x an observation turn (the template
    around ``observation_max_chars`` output characters, one token per character, plus the chat
    framing of a user turn)."""
    from tasks.harnesses.spec import load_harness
    from tasks.records.freeze import freeze_tables

    (name,) = cfg.harnesses
    spec = load_harness(name)
    tasks, _, _ = freeze_tables(cfg)
    instr = max((t["instruction"] for t in tasks), key=lambda s: len(tokenizer(s)["input_ids"]))
    chat = [{"role": "system", "content": spec.render_system()}, {"role": "user", "content": instr}]

    def n_tokens(messages: list[dict], gen: bool) -> int:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=gen, tokenize=False)
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    prompt = n_tokens(chat, True)
    obs_text = spec.observation_template.replace("{output}", "").replace("{turns_left}", "9")
    reply = [{"role": "assistant", "content": "x"}]
    framing = n_tokens(chat + reply + [{"role": "user", "content": "y"}], True) - n_tokens(chat + reply, False)
    obs = len(tokenizer(obs_text)["input_ids"]) + spec.context.observation_max_chars + framing
    turns, new = spec.max_turns, spec.sampling.max_new_tokens
    return {"prompt": prompt, "turns": turns, "max_new_tokens": new, "observation": obs,
            "total": prompt + turns * new + (turns - 1) * obs}


def sequences(n_groups: int, group: int, prompt: int, turns: list[tuple[int, int]], vocab: int, seed: int) -> list:
    """``n_groups`` x ``group`` synthetic sequences: a shared ``prompt`` per group, then per turn
    (policy tokens, observation tokens after it); random ids, rewards alternating 0 / 1."""
    import torch

    from tasks.train.sequences import TrainSequence

    g = torch.Generator().manual_seed(seed)
    out = []
    for k in range(n_groups):
        p = torch.randint(10, vocab, (prompt,), generator=g).tolist()
        for j in range(group):
            ids, mask = list(p), [0] * prompt
            for pol, obs in turns:
                ids += torch.randint(10, vocab, (pol + obs,), generator=g).tolist()
                mask += [1] * pol + [0] * obs
            out.append(TrainSequence(f"g{k}s{j}", ids, mask, [0.0] * len(ids), float(j % 2), f"t{k}", f"h{k}", "H",
                                     (0.7, 0, 1.0)))
    return out


def run_case(case: dict) -> dict:
    """One step of ``case`` in this process; its peak RSS, seconds and micro-batches."""
    import torch

    from tasks.config import load_config
    from tasks.rollout.models import resolve_model
    from tasks.train.trainer import Trainer

    torch.set_num_threads(case["threads"])
    model_dir = Path(case["model_dir"]) if case["model_dir"] else resolve_model("smollm2-135m-instruct")
    train = {**case["train"], "batch_size": None, "kl": {"beta": 0.0}}
    cfg = load_config(P6, overrides={"policy.model": str(model_dir), **{f"train.{k}": v for k, v in train.items()}})
    cfg = cfg.model_copy(update={"train": dict(cfg.arm_configs())["gspo"]})  # P6's GSPO arm
    tr = Trainer(cfg, model_dir, log=lambda m: None)
    vocab = tr.model.get_base_model().get_output_embeddings().weight.shape[0]
    seqs = sequences(case["groups"], case["group"], case["prompt"], [tuple(t) for t in case["turns"]], vocab, 0)
    mbs = tr._micro_batches(seqs)
    t0 = time.perf_counter()
    b = tr.new_batch(seqs)
    row, _ = tr.step(b, list(range(len(seqs))))
    dt = time.perf_counter() - t0
    return {"peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024), "step_s": round(dt, 2),
            "micro_batches": len(mbs), "largest_micro_batch_tokens": max(len(m) * max(len(seqs[i].ids) for i in m)
                                                                          for m in mbs),
            "sequences": len(seqs), "seq_len": len(seqs[0].ids), "policy_tokens": int(row["tokens"]),
            "grad_norm": row["grad_norm"], "auto_checkpointed_forwards": tr.checkpointed_forwards}


def spawn(case: dict, limit_gb: float | None) -> dict:
    """``case`` in a fresh process (``RLIMIT_AS`` ``limit_gb``); its result, or why it failed."""
    def limit() -> None:
        if limit_gb:
            cap = int(limit_gb * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false"}
    res = subprocess.run([sys.executable, __file__, "--case", json.dumps(case)], capture_output=True, text=True,
                         env=env, preexec_fn=limit)
    if res.returncode == 0:
        return json.loads(res.stdout.strip().splitlines()[-1])
    tail = res.stderr[-3000:]
    if limit_gb and ("MemoryError" in tail or "alloc" in tail.lower() or res.returncode < 0):
        return {"over_limit_gb": limit_gb, "error": tail.strip().splitlines()[-1][:200] if tail.strip() else ""}
    raise RuntimeError(f"case {case['name']}/{case['path']} failed:\n{tail}")


def main(argv: list[str] | None = None) -> dict | None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", help=argparse.SUPPRESS)
    ap.add_argument("--smoke", action="store_true", help="the tests' tiny model, small shapes, seconds")
    ap.add_argument("--threads", type=int, default=2, help="torch threads per case (default 2)")
    ap.add_argument("--limit-gb", type=float, default=12.0,
                    help="address-space cap per case process, GiB (0: none; default 12)")
    ap.add_argument("--only", choices=["p6-longest", "16x8x1024"], help="run one of the shapes")
    ap.add_argument("--paths", help="comma-separated paths to run (default: all of old, new, unchunked, "
                    "new+checkpointing)")
    ap.add_argument("--groups-1024", type=int, default=16, help="groups of the 16x8x1024 step to run (default 16)")
    a = ap.parse_args(argv)
    if a.case:
        print(json.dumps(run_case(json.loads(a.case))), flush=True)
        return None
    from tasks.config import load_config
    from tasks.config.train import (
        DEFAULT_CHECKPOINT_ABOVE_TOKENS,
        DEFAULT_LOGPROB_CHUNK_TOKENS,
        DEFAULT_MICRO_BATCH_TOKENS,
    )
    from tasks.rollout.models import resolve_model

    cfg = load_config(P6)
    micro = cfg.train.micro_batch_size
    with tempfile.TemporaryDirectory() as tmp:
        if a.smoke:
            from _results import tiny_model

            model_dir = str(tiny_model(Path(tmp) / "tiny"))
            shapes = {"p6-longest": dict(groups=2, group=2, prompt=12, turns=[(8, 6), (8, 0)])}
            paths = {"old": {"logprob_chunk_tokens": 0, "micro_batch_tokens": 10**9, "checkpoint_above_tokens": 0},
                     "new": {"logprob_chunk_tokens": 8, "micro_batch_tokens": 64, "checkpoint_above_tokens": 32}}
            bound = None
        else:
            from transformers import AutoTokenizer

            model_dir = ""
            bound = p6_max_len(cfg, AutoTokenizer.from_pretrained(resolve_model(cfg.policy.model)))
            obs, new = bound["observation"], bound["max_new_tokens"]
            turns = [(new, obs)] * (bound["turns"] - 1) + [(new, 0)]
            shapes = {"p6-longest": dict(groups=micro // 8, group=8, prompt=bound["prompt"], turns=turns),
                      "16x8x1024": dict(groups=a.groups_1024, group=8, prompt=256, turns=[(768, 0)])}
            defaults = {"logprob_chunk_tokens": DEFAULT_LOGPROB_CHUNK_TOKENS,
                        "micro_batch_tokens": DEFAULT_MICRO_BATCH_TOKENS,
                        "checkpoint_above_tokens": DEFAULT_CHECKPOINT_ABOVE_TOKENS}
            paths = {"old": {"logprob_chunk_tokens": 0, "micro_batch_tokens": 10**9, "checkpoint_above_tokens": 0},
                     "new": defaults,
                     "new-no-auto": {**defaults, "checkpoint_above_tokens": 0},
                     "unchunked": {"logprob_chunk_tokens": 0, "micro_batch_tokens": DEFAULT_MICRO_BATCH_TOKENS,
                                   "checkpoint_above_tokens": 0},
                     "new+checkpointing": {"logprob_chunk_tokens": DEFAULT_LOGPROB_CHUNK_TOKENS,
                                           "micro_batch_tokens": DEFAULT_MICRO_BATCH_TOKENS,
                                           "gradient_checkpointing": True, "share_prompt": False}}
        if a.only:
            shapes = {a.only: shapes[a.only]}
        if a.paths:
            unknown = sorted(set(a.paths.split(",")) - set(paths))
            if unknown:
                ap.error(f"--paths: {unknown} not among {sorted(paths)}")
            paths = {k: v for k, v in paths.items() if k in a.paths.split(",")}
        cases = {}
        for shape, dims in shapes.items():
            for path, opts in paths.items():
                case = {"name": shape, "path": path, "model_dir": model_dir, "threads": a.threads, **dims,
                        "train": {"micro_batch_size": micro, **opts}}
                t0 = time.perf_counter()
                res = spawn(case, a.limit_gb or None)
                cases[f"{shape}/{path}"] = {**res, "wall_s": round(time.perf_counter() - t0, 1)}
                print(f"{shape}/{path}: {cases[f'{shape}/{path}']}", flush=True)
    row = {"benchmark": "train_memory", "python": platform.python_version(), "smoke": a.smoke,
           "model": "tiny-2x128-v1024" if a.smoke else "smollm2-135m-instruct", "config": "p6-findings.yaml",
           "threads": a.threads, "limit_gb": a.limit_gb, "micro_batch_size": micro, "p6_max_len": bound,
           "groups_1024": None if a.smoke else a.groups_1024, "paths": paths, "cases": cases}
    for path in paths:
        if path == "old":
            continue
        peaks = [c["peak_rss_mb"] for k, c in cases.items() if k.endswith(f"/{path}") and "peak_rss_mb" in c]
        row[f"{path}_max_peak_rss_mb"] = max(peaks) if len(peaks) == len(shapes) else None
    row["goal_mb"] = GOAL_MB
    # the goal, per bounded path that ran: its largest peak at most GOAL_MB (None: smoke, or a case failed)
    row["goal_met"] = {p: None if a.smoke or row[f"{p}_max_peak_rss_mb"] is None
                       else row[f"{p}_max_peak_rss_mb"] <= GOAL_MB for p in paths if p != "old"}
    report("train_memory", row)
    return row


if __name__ == "__main__":
    main()
