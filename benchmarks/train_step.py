"""One GRPO iteration with our trainer and with TRL's GRPOTrainer, side by side.

An iteration = sample 16 prompts x 8 completions x up to 64 tokens, score them, one optimizer
step on a LoRA adapter (r 16, all linear layers), KL off (beta 0), DAPO-style token-mean loss.
Both sides use the same tiny model (4 layers, hidden 256, vocabulary 1024, built here), the same
prompts, the same reward function (distinct characters / length of the completion text), the same
sampler settings and learning rate. Each side runs in its own process so that peak RSS is its
own. The two processes take turns, one iteration at a time (ours, then TRL's, then ours...), the
other waiting on a pipe, so that a slow spell of a shared machine slows both iterations of a pair
rather than one side's whole run. The first iteration of each is a warm-up and is not timed. The
row has each side's median seconds per iteration (and every timed iteration's), each pair's ratio
(TRL's seconds over ours: the throughput ratio) and their median, ``throughput_ratio_ours_over_trl``.

Also: the two losses on one identical batch (same weights, same tokens, same advantages, old
log-probs = current) for token-mean and sequence-mean aggregation; they must agree.
With ``--smollm2``: seconds per iteration and peak RSS of our trainer on SmolLM2-135M in bf16, at
the trainer's default micro-batch (``train.micro_batch_size``, 8 sequences; ``--smollm2-micro``).
Peak memory is set by the micro-batch (``train.micro_batch_tokens`` bounds it; the output
projection runs in chunks of ``train.logprob_chunk_tokens``): ``benchmarks/train_memory.py``
measures it.

TRL is installed only for the benchmarks, in ``.venv-bench`` layered over ``.venv``, by
``scripts/setup-bench.sh`` (pins in ``benchmarks/requirements-trl.txt``)::

    ./scripts/setup-bench.sh
    .venv-bench/bin/python benchmarks/train_step.py [--iters 6] [--smollm2]

``--smoke`` (the test suite, plain ``.venv``): our side only, on a 2-layer tiny model, 4 prompts x 2
completions x 16 tokens, one timed iteration; TRL's side and the loss comparison need
``.venv-bench`` and are skipped (the row says so).

Prints the figures and appends one JSON row to ``benchmarks/results/train_step.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _results import report

N_PROMPTS, GROUP, MAX_NEW, LR, RANK = 16, 8, 64, 1e-5, 16
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def reward_of(text: str) -> float:
    return len(set(text)) / max(len(text), 1)


def prompts_for(tokenizer) -> list[str]:
    import reasoning_gym

    qs = [e["question"] for e in reasoning_gym.create_dataset("basic_arithmetic", size=N_PROMPTS, seed=0)]
    return [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
            for q in qs]


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# A side process and the parent talk in tagged lines (libraries may print to stdout too): the side
# says READY once set up, then before each iteration waits for a line on stdin, and after it says
# ITER with the iteration's seconds and completion tokens; DONE ends it with its peak RSS.
READY, ITER, DONE = "@@ready", "@@iter", "@@done"


class Gate:
    """The side's half of the protocol: :meth:`wait` before an iteration (READY the first time),
    :meth:`report` after it."""

    def __init__(self) -> None:
        self.ready = False

    def wait(self) -> None:
        if not self.ready:
            print(READY, flush=True)
            self.ready = True
        if not sys.stdin.readline():
            raise SystemExit("train_step: the parent closed the pipe before the last iteration")

    def report(self, seconds: float, completion_tokens: int) -> None:
        print(ITER, json.dumps({"seconds": seconds, "completion_tokens": completion_tokens}), flush=True)


# ---------------------------------------------------------------------------------------------
def side_ours(model_dir: str, iters: int, autocast: str, micro: int = 32) -> dict:
    import torch

    from tasks.config import RunConfig
    from tasks.harnesses.spec import SamplingSpec
    from tasks.rollout.engines.hf import HFPolicy
    from tasks.train.sequences import TrainSequence
    from tasks.train.trainer import Trainer

    torch.set_num_threads(os.cpu_count() or 2)
    cfg = RunConfig.model_validate({
        "name": "bench", "suites": [{"name": "basic_arithmetic", "size": 1}], "harnesses": ["direct"],
        "policy": {"model": model_dir, "batch_size": N_PROMPTS * GROUP, "autocast_dtype": autocast},
        "train": {"mode": "online", "steps": iters, "lr": LR, "micro_batch_size": micro, "clip_low": 0.2, "clip_high": 0.2,
                  "agg": "token_mean", "kl": {"beta": 0.0}, "lora": {"r": RANK, "alpha": 2 * RANK, "target_modules": TARGETS}},
    })
    trainer = Trainer(cfg, Path(model_dir), log=lambda m: None)
    tok = trainer.tokenizer
    prompt_ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts_for(tok)]
    sampling = SamplingSpec(temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=MAX_NEW)
    gate = Gate()
    for it in range(iters):
        gate.wait()
        t0 = time.perf_counter()
        # sample from the merged policy in the run's precision (fp32 for the TRL comparison, which samples in fp32)
        policy = HFPolicy.from_model(trainer.inference_model(autocast), tok, cfg.policy, policy_id="bench")
        batch_prompts = [p for p in prompt_ids for _ in range(GROUP)]
        gens = policy.generate(batch_prompts, sampling, seed=1000 + it)
        seqs = [TrainSequence(episode_id=f"{it}-{i}", ids=p + g.token_ids, mask=[0] * len(p) + [1] * len(g.token_ids),
                              behaviour_logp=[0.0] * len(p) + g.logprobs, reward=reward_of(g.text),
                              task_id=f"q{i // GROUP}", task_hash=f"q{i // GROUP}", harness_id="h",
                              sampling_key=(1.0, 0, 1.0), policy_version=trainer.version)
                for i, (p, g) in enumerate(zip(batch_prompts, gens))]
        batch = trainer.new_batch(seqs)
        trainer.step(batch, list(range(len(seqs))))
        gate.report(time.perf_counter() - t0, sum(len(g.token_ids) for g in gens))
    return {"peak_rss_mb": peak_rss_mb()}


def side_trl(model_dir: str, iters: int, autocast: str) -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(os.cpu_count() or 2)
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    ds = Dataset.from_dict({"prompt": prompts_for(tok) * iters})
    gate = Gate()
    tokens = [0]  # the step's completion tokens, counted by the reward function (called once per step)

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            gate.wait()
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            gate.report(time.perf_counter() - self.t0, tokens[0])

    def reward(prompts, completions, completion_ids=None, **kw):
        tokens[0] = sum(len(c) for c in completion_ids) if completion_ids is not None else 0
        return [reward_of(c) for c in completions]

    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out, per_device_train_batch_size=32, gradient_accumulation_steps=4, num_generations=GROUP,
            max_completion_length=MAX_NEW, temperature=1.0, top_k=0, top_p=1.0, learning_rate=LR, beta=0.0,
            loss_type="dapo", epsilon=0.2, max_steps=iters, logging_steps=1, report_to="none", use_cpu=True,
            bf16=autocast == "bfloat16", save_strategy="no", seed=0, shuffle_dataset=False, num_iterations=1,
            disable_tqdm=True, gradient_checkpointing=False,  # TRL's GRPOConfig defaults it on; ours does not use it
        )
        trainer = GRPOTrainer(model=model_dir, reward_funcs=[reward], args=args, train_dataset=ds, processing_class=tok,
                              peft_config=LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules=TARGETS),
                              callbacks=[Timer()])
        trainer.train()
    return {"peak_rss_mb": peak_rss_mb()}


def side_loss(model_dir: str) -> dict:
    """Both losses on one batch: same weights (LoRA B = 0), tokens, advantages."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from tasks.train.logprobs import token_logprobs
    from tasks.train.losses import policy_loss

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    B, P, C = 8, 12, 20
    prompt_ids = torch.randint(10, 1000, (B, P))
    prompt_mask = torch.ones(B, P, dtype=torch.long)
    prompt_mask[0, :3] = 0  # left padding on one row
    completion_ids = torch.randint(10, 1000, (B, C))
    completion_mask = torch.ones(B, C, dtype=torch.long)
    completion_mask[1, 15:] = 0  # a shorter completion
    completion_mask[2, 5:] = 0
    adv = torch.randn(B)
    out = {}
    for loss_type, agg in (("bnpo", "token_mean"), ("grpo", "seq_mean_token_mean")):
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                               LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules=TARGETS))
        with tempfile.TemporaryDirectory() as d:
            args = GRPOConfig(output_dir=d, per_device_train_batch_size=B, num_generations=B, beta=0.0,
                              loss_type=loss_type, report_to="none", use_cpu=True, max_completion_length=C)
            tr = GRPOTrainer(model=model, reward_funcs=[lambda completions, **k: [0.0] * len(completions)], args=args,
                             train_dataset=Dataset.from_dict({"prompt": ["x"] * B}), processing_class=tok)
            tr.current_gradient_accumulation_steps = 1
            tr.model.eval()
            inputs = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
                      "completion_mask": completion_mask, "advantages": adv,
                      "num_items_in_batch": completion_mask.sum()}
            with torch.no_grad():
                trl_loss = float(tr._compute_loss(tr.model, inputs))
                ids = torch.cat([prompt_ids, completion_ids], 1)
                attn = torch.cat([prompt_mask, completion_mask], 1)
                pos = (attn.cumsum(-1) - 1).clamp_min(0)
                logits = tr.model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, P - 1:-1]
                logp = token_logprobs(logits, completion_ids)
                ours, _ = policy_loss(logp, logp, adv, completion_mask.float(), agg=agg)
        out[agg] = {"trl": trl_loss, "ours": float(ours)}
    return out


def run_side(side: str, model_dir: str, iters: int, autocast: str) -> dict:
    """The ``loss`` side: one process, its JSON result on the last stdout line."""
    res = subprocess.run([sys.executable, __file__, "--side", side, "--model-dir", model_dir, "--iters", str(iters),
                          "--autocast", autocast], capture_output=True, text=True, env=SIDE_ENV)
    if res.returncode != 0:
        raise RuntimeError(f"side {side} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


SIDE_ENV = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false"}


def drive(sides: dict[str, list[str]], iters: int) -> dict[str, dict]:
    """Run the side processes (name -> extra arguments) iteration by iteration, in turn: every
    side's iteration i runs while the others wait, so a slow spell of a shared machine slows
    the sides of one pair alike instead of one side's whole run. Returns per side its
    ``seconds`` and ``completion_tokens`` per iteration and its ``peak_rss_mb``."""
    procs, logs = {}, {}
    try:
        for name, extra in sides.items():
            logs[name] = tempfile.TemporaryFile(mode="w+")
            procs[name] = subprocess.Popen([sys.executable, __file__, "--iters", str(iters), *extra],
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=logs[name],
                                           text=True, bufsize=1, env=SIDE_ENV)

        def tagged(name: str, tag: str) -> str:
            for line in procs[name].stdout:
                if line.startswith(tag):
                    return line[len(tag):].strip()
            logs[name].seek(0)
            raise RuntimeError(f"side {name} ended before {tag}:\n{logs[name].read()[-3000:]}")

        for name in procs:  # every side set up before the first timed work
            tagged(name, READY)
        out = {name: {"seconds": [], "completion_tokens": []} for name in procs}
        for _ in range(iters):
            for name in procs:
                procs[name].stdin.write("go\n")
                procs[name].stdin.flush()
                rec = json.loads(tagged(name, ITER))
                out[name]["seconds"].append(rec["seconds"])
                out[name]["completion_tokens"].append(rec["completion_tokens"])
        for name in procs:
            out[name]["peak_rss_mb"] = json.loads(tagged(name, DONE))["peak_rss_mb"]
            procs[name].stdin.close()
            procs[name].wait(timeout=120)
        return out
    finally:
        for name, proc in procs.items():
            if proc.poll() is None:
                proc.kill()
            logs[name].close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--side", choices=["ours", "trl", "loss"])
    ap.add_argument("--model-dir")
    ap.add_argument("--iters", type=int, default=6, help="timed iterations per side (after one warm-up)")
    ap.add_argument("--autocast", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--smollm2", action="store_true", help="also time our trainer on SmolLM2-135M (bf16)")
    ap.add_argument("--micro", type=int, default=32, help="our trainer's micro-batch size (sequences per forward)")
    ap.add_argument("--smollm2-micro", type=int, default=8,
                    help="our trainer's micro-batch size on SmolLM2 (default: the config default, 8)")
    ap.add_argument("--smoke", action="store_true", help="ours only, 2-layer tiny model, 4 prompts x 2 x 16 tokens")
    a = ap.parse_args()
    if a.iters < 1:
        ap.error(f"--iters must be >= 1, got {a.iters}")
    global N_PROMPTS, GROUP, MAX_NEW
    if a.smoke:
        N_PROMPTS, GROUP, MAX_NEW, a.smollm2 = 4, 2, 16, False
        if not a.side:  # a side process gets its iteration count from the parent
            a.iters = 1
    if a.side:
        if a.side == "loss":
            print(json.dumps(side_loss(a.model_dir)))
            return
        res = side_ours(a.model_dir, a.iters, a.autocast, a.micro) if a.side == "ours" else \
            side_trl(a.model_dir, a.iters, a.autocast)
        print(DONE, json.dumps(res), flush=True)
        return
    from _results import tiny_model
    from tasks.rollout.models import build_tiny_model, resolve_model

    with tempfile.TemporaryDirectory() as tmp:
        if a.smoke:  # the tests' tiny model: 2 layers, hidden 128, vocabulary 1024
            model_dir = str(tiny_model(Path(tmp) / "tiny"))
        else:
            model_dir = str(build_tiny_model(Path(tmp) / "tiny", seed=0, layers=4, hidden=256, vocab=1024))
        side = ["--model-dir", model_dir, "--autocast", a.autocast, *(["--smoke"] if a.smoke else [])]
        sides = {"ours": ["--side", "ours", "--micro", str(a.micro), *side]}
        if not a.smoke:
            sides["trl"] = ["--side", "trl", *side]
        runs = drive(sides, a.iters + 1)  # the first iteration of each side is a warm-up
        loss = None if a.smoke else run_side("loss", model_dir, 1, a.autocast)
    samples = N_PROMPTS * GROUP
    row = {"benchmark": "train_step", "python": platform.python_version(), "iters_timed": a.iters,
           "paired": True, "autocast": a.autocast, "model": "tiny-2x128-v1024" if a.smoke else "tiny-4x256-v1024",
           "prompts": N_PROMPTS, "group": GROUP, "max_new_tokens": MAX_NEW, "lora_rank": RANK, "smoke": a.smoke}
    if a.smoke:
        row["skipped"] = "TRL side and the same-batch loss comparison (TRL lives in .venv-bench)"
    timed = {name: r["seconds"][1:] for name, r in runs.items()}
    for name, r in runs.items():
        row[f"{name}_s_per_iter"] = round(statistics.median(timed[name]), 3)
        row[f"{name}_s_per_iter_all"] = [round(x, 3) for x in timed[name]]
        row[f"{name}_samples_per_s"] = round(samples / row[f"{name}_s_per_iter"], 2)
        row[f"{name}_peak_rss_mb"] = round(r["peak_rss_mb"])
        row[f"{name}_completion_tokens"] = r["completion_tokens"][1:]
    if "trl" in runs and loss is not None:
        # pair i: TRL's iteration i over ours, run back to back (samples/s ours over TRL's)
        ratios = [t / o for o, t in zip(timed["ours"], timed["trl"])]
        row["throughput_ratio_per_pair"] = [round(x, 2) for x in ratios]
        row["throughput_ratio_ours_over_trl"] = round(statistics.median(ratios), 2)
        row["loss_same_batch"] = loss
        row["losses_agree"] = all(abs(v["trl"] - v["ours"]) <= 1e-5 * (1 + abs(v["trl"])) for v in loss.values())
    if a.smollm2:
        sm = drive({"ours": ["--side", "ours", "--model-dir", str(resolve_model("smollm2-135m-instruct")),
                             "--autocast", "bfloat16", "--micro", str(a.smollm2_micro)]}, 2)["ours"]
        row["smollm2_bf16_s_per_iter"] = round(sm["seconds"][1], 2)
        row["smollm2_bf16_peak_rss_mb"] = round(sm["peak_rss_mb"])
        row["smollm2_micro_batch_size"] = a.smollm2_micro
    report("train_step", row)


if __name__ == "__main__":
    main()
