"""Does it learn, and how fast against TRL? Our online GRPO (vLLM sampling, weights synced in
place) and TRL's ``GRPOTrainer`` (transformers sampling: TRL's vLLM path needs the GPU build), side
by side on the same machine, each given the same wall-clock budget.

Both sides use the learning config (``configs/learn-arith.yaml``): the same model, the same train
tasks (the config's frozen train split), the same prompt (the ``direct`` harness's chat messages,
tokenized by the same chat template), the same reward (our verifier on the answer the harness's
parser reads), group size G, prompts per step, learning rate, LoRA shape, sampling temperature and
completion length, KL off on both. Each side saves its adapter at fixed wall-clock marks; then every
saved adapter (and the base model) is evaluated by one evaluator on the same held-out test tasks
(the config's test split, ``--attempts`` samples each, the same seeds): the same vLLM engine with
the adapter's merged weights loaded in place.

It prints held-out pass@1 against wall-clock seconds for both, the time each side needs to first
reach the lower of the two final accuracies (and their ratio), and whole-iteration samples/s.

TRL runs in ``.venv-bench`` (built by ``scripts/setup-bench.sh``); this script runs our side and the
evaluation with ``.venv``'s interpreter:

    .venv/bin/python benchmarks/learning.py [--budget-s 900] [--marks 4] [--attempts 4]
    .venv/bin/python benchmarks/learning.py --smoke     # the tests' tiny model, our side only, seconds

Appends one JSON row to ``benchmarks/results/learning.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
BENCH_PY = REPO / ".venv-bench" / "bin" / "python"


def _setup(config: str, overrides: dict[str, Any]) -> tuple[Any, dict, dict, list, list]:
    from tasks.config import load_config
    from tasks.harnesses.spec import HarnessSpec
    from tasks.records.freeze import freeze_tables

    cfg = load_config(config, overrides)
    tasks, harnesses, records = freeze_tables(cfg)
    specs = {h["harness_id"]: HarnessSpec.model_validate(json.loads(h["spec_json"])) for h in harnesses}
    train = [r for r in records if r["split"] == "train" and r["harness_name"] in cfg.harnesses]
    test = [r for r in records if r["split"] == "test" and r["harness_name"] == cfg.harnesses[0]]
    return cfg, {t["task_id"]: t for t in tasks}, specs, train, test


class _Budget(Exception):
    pass


def side_ours(config: str, overrides: dict[str, Any], budget_s: float, marks: int, out: Path) -> dict[str, Any]:
    """Our online trainer for ``budget_s`` seconds; adapters saved at ``marks`` even wall-clock marks."""
    from schemas import ArtifactStore
    from tasks.records.freeze import freeze_tables
    from tasks.rollout.models import model_id, resolve_model
    from tasks.train.loops import train_online
    from tasks.train.stage import _online_sampler

    cfg, _tasks, specs, _train, _test = _setup(config, overrides)
    store = ArtifactStore(out / "store")
    tasks, harnesses, records = freeze_tables(cfg)
    refs = {"tasks": store.write("freeze", "tasks", tasks), "harnesses": store.write("freeze", "harnesses", harnesses),
            "records": store.write("freeze", "records", records)}
    sampling = {hid: (s.sampling.temperature, s.sampling.top_k, s.sampling.top_p) for hid, s in specs.items()}
    model_dir = resolve_model(cfg.policy.model, cfg.policy.cache_dir)
    sampler, release = _online_sampler(store, cfg, refs, specs, sampling, model_id(model_dir))
    t0 = time.perf_counter()
    saved: list[dict[str, Any]] = []
    samples = [0]

    def after(trainer: Any, it: int) -> None:
        elapsed = time.perf_counter() - t0
        samples[0] += cfg.rollout.samples_per_task * len(cfg.harnesses) * (cfg.train.prompts_per_step or 0)
        due = budget_s * (len(saved) + 1) / marks
        if elapsed >= due or elapsed >= budget_s:
            d = trainer.save_adapter(out / f"ours-{len(saved) + 1}")
            saved.append({"seconds": elapsed, "adapter": str(d), "iterations": it + 1})
        if elapsed >= budget_s:
            raise _Budget

    try:
        train_online(cfg.model_copy(update={"train": cfg.train.model_copy(update={"steps": 10_000})}), model_dir,
                     sampler, out / "ours-final", log=lambda m: None, after_iteration=after)
    except _Budget:
        pass
    finally:
        release()
    wall = time.perf_counter() - t0
    iters = saved[-1]["iterations"] if saved else 0
    return {"snapshots": saved, "iterations": iters, "wall_s": wall, "samples_per_s": samples[0] / wall}


def side_trl(config: str, overrides: dict[str, Any], budget_s: float, marks: int, out: Path) -> dict[str, Any]:
    """TRL's GRPOTrainer on the same data, reward and hyper-parameters (runs in .venv-bench)."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from tasks.harnesses.actions import fallback_answer, parse_reply
    from tasks.harnesses.spec import render
    from tasks.records.verifiers import grade
    from tasks.rollout.models import resolve_model

    cfg, tasks, specs, train, _test = _setup(config, overrides)
    spec = next(iter(s for s in specs.values() if s.name == cfg.harnesses[0]))
    tc = cfg.train
    torch.set_num_threads(os.cpu_count() or 2)
    model_dir = str(resolve_model(cfg.policy.model, cfg.policy.cache_dir))
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    rows = [{"prompt": [{"role": "system", "content": spec.render_system()},
                        {"role": "user", "content": render(spec.instance_template, instruction=tasks[r["task_id"]]["instruction"],
                                                           files="", file_list="(empty)", page="")}],
             "task_id": r["task_id"]} for r in train]
    ds = Dataset.from_list(rows * 200)  # more than the budget can use; shuffled by TRL's seeded sampler
    t0 = time.perf_counter()
    saved: list[dict[str, Any]] = []
    samples = [0]

    def reward(prompts: list, completions: list, task_id: list, **kw: Any) -> list[float]:
        out = []
        for c, t in zip(completions, task_id):
            text = c[0]["content"] if isinstance(c, list) else c
            answer = parse_reply(spec, text).answer or fallback_answer(spec, text)
            out.append(grade(tasks[t]["verifier_kind"], tasks[t]["verifier_spec"], answer, None))
        samples[0] += len(out)
        return out

    class Marks(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
            elapsed = time.perf_counter() - t0
            if elapsed >= budget_s * (len(saved) + 1) / marks or elapsed >= budget_s:
                d = out / f"trl-{len(saved) + 1}"
                model.save_pretrained(d)
                saved.append({"seconds": elapsed, "adapter": str(d), "iterations": state.global_step})
            if elapsed >= budget_s:
                control.should_training_stop = True

    p, g = tc.prompts_per_step, cfg.rollout.samples_per_task
    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(
            output_dir=tmp, per_device_train_batch_size=min(32, p * g), gradient_accumulation_steps=max(1, p * g // 32),
            num_generations=g, max_completion_length=spec.sampling.max_new_tokens, temperature=spec.sampling.temperature,
            top_k=spec.sampling.top_k, top_p=spec.sampling.top_p, learning_rate=tc.lr, beta=0.0, loss_type="dapo",
            epsilon=tc.clip_low, epsilon_high=tc.clip_high, max_steps=100_000, logging_steps=1, report_to="none",
            use_cpu=True, bf16=cfg.policy.autocast_dtype == "bfloat16", save_strategy="no", seed=cfg.seed,
            disable_tqdm=True, gradient_checkpointing=False, num_iterations=tc.ppo_epochs)
        trainer = GRPOTrainer(model=model_dir, reward_funcs=[reward], args=args, train_dataset=ds, processing_class=tok,
                              peft_config=LoraConfig(r=tc.lora.r, lora_alpha=tc.lora.alpha,
                                                     target_modules=list(tc.lora.target_modules)),
                              callbacks=[Marks()])
        trainer.train()
    wall = time.perf_counter() - t0
    return {"snapshots": saved, "iterations": saved[-1]["iterations"] if saved else 0, "wall_s": wall,
            "samples_per_s": samples[0] / wall}


def evaluate(config: str, overrides: dict[str, Any], adapters: list[str | None], attempts: int) -> list[float]:
    """Held-out pass@1 of each adapter (None: the base model) on the test split's records under
    the training harness, ``attempts`` samples each, the same seeds for every adapter: with
    ``policy.engine: vllm`` one engine on the base model, each adapter's merged weights loaded in
    place; with ``hf`` a merged copy per adapter."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from tasks.hashing import seed_from
    from tasks.rollout.engines.base import load_tokenizer
    from tasks.rollout.models import resolve_model
    from tasks.rollout.engines import load_policy
    from tasks.rollout.runner import run_records

    cfg, tasks, specs, _train, test = _setup(config, overrides)
    model_dir = resolve_model(cfg.policy.model, cfg.policy.cache_dir)
    dtype = getattr(torch, cfg.policy.rollout_dtype)
    engine = load_policy(cfg) if cfg.policy.engine == "vllm" else None
    out = []
    try:
        for a in adapters:
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
            if a is not None:
                model = PeftModel.from_pretrained(model, a).merge_and_unload()
            if engine is not None:
                engine.load_weights({k: v.to(dtype) for k, v in model.state_dict().items() if k != "lm_head.weight"})
                policy = engine
            else:
                from tasks.rollout.engines.hf import HFPolicy

                policy = HFPolicy.from_model(model.to(dtype).eval(), load_tokenizer(model_dir), cfg.policy,
                                             policy_id=f"eval-{a}")
            eps, _turns = run_records(policy, cfg, specs, tasks, test, attempts, seed_from(cfg.seed, "learning-eval"),
                                      "learning-eval")
            out.append(sum(e["reward"] for e in eps) / len(eps))
    finally:
        if engine is not None:
            engine.close()
    return out


def time_to(curve: list[tuple[float, float]], target: float) -> float | None:
    """The first wall-clock second at which ``curve`` (seconds, pass@1) reaches ``target``."""
    return next((t for t, acc in curve if acc >= target), None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(REPO / "configs/learn-arith.yaml"))
    ap.add_argument("--budget-s", type=float, default=900.0, help="wall-clock seconds of training per side")
    ap.add_argument("--marks", type=int, default=4, help="adapters saved per side, at even wall-clock marks")
    ap.add_argument("--attempts", type=int, default=4, help="samples per held-out task in the evaluation")
    ap.add_argument("--side", choices=["ours", "trl", "evaluate"], help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--adapters", help=argparse.SUPPRESS)
    ap.add_argument("--smoke", action="store_true", help="the tests' tiny model, 8 s, our side only")
    a = ap.parse_args()
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    overrides: dict[str, Any] = json.loads(os.environ.get("HARNESSRL_LEARNING_OVERRIDES", "{}"))
    if a.side:
        fn = {"ours": side_ours, "trl": side_trl}.get(a.side)
        if fn is not None:
            res = fn(a.config, overrides, a.budget_s, a.marks, Path(a.out))
        else:
            res = {"pass_at_1": evaluate(a.config, overrides, json.loads(a.adapters), a.attempts)}
        print(json.dumps(res))
        return

    from _results import report

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if a.smoke:
            from _results import tiny_model

            overrides = {"policy.model": str(tiny_model(root / "tiny")), "policy.engine": "hf",
                         "suites.0.size": 12, "train.prompts_per_step": 2, "rollout.samples_per_task": 2}
            a.budget_s, a.marks, a.attempts = 8.0, 2, 1
        env = {**os.environ, "HARNESSRL_LEARNING_OVERRIDES": json.dumps(overrides)}

        def run(python: Path, side: str, **extra: Any) -> dict[str, Any]:
            cmd = [str(python), __file__, "--side", side, "--config", a.config, "--budget-s", str(a.budget_s),
                   "--marks", str(a.marks), "--attempts", str(a.attempts), "--out", str(root)]
            cmd += [x for k, v in extra.items() for x in (f"--{k}", v)]
            res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
            if res.returncode != 0:
                raise RuntimeError(f"side {side} failed:\n{res.stderr[-4000:]}")
            return json.loads(res.stdout.strip().splitlines()[-1])

        sides = {"ours": run(Path(sys.executable), "ours")}
        if a.smoke or not BENCH_PY.exists():
            print(f"learning: TRL side skipped ({'smoke mode' if a.smoke else f'{BENCH_PY} missing: see benchmarks/train_step.py'})")
        else:
            sides["trl"] = run(BENCH_PY, "trl")
        adapters: list[str | None] = [None] + [s["adapter"] for side in sides.values() for s in side["snapshots"]]
        acc = run(Path(sys.executable), "evaluate", adapters=json.dumps(adapters))["pass_at_1"]
    base, k, curves = acc[0], 1, {}
    for name, side in sides.items():
        pts = [(0.0, base)]
        for s in side["snapshots"]:
            pts.append((round(s["seconds"], 1), acc[k]))
            k += 1
        curves[name] = pts
    print(f"\n{'side':<6} {'iterations':>10} {'samples/s':>10}  pass@1 at seconds")
    for name, side in sides.items():
        print(f"{name:<6} {side['iterations']:>10} {side['samples_per_s']:>10.2f}  "
              + ", ".join(f"{acc_:.3f}@{t:.0f}s" for t, acc_ in curves[name]))
    row: dict[str, Any] = {"config": Path(a.config).name, "budget_s": a.budget_s, "attempts": a.attempts,
                           "smoke": a.smoke, "base_pass_at_1": base, "curves": curves,
                           **{f"{n}_iterations": s["iterations"] for n, s in sides.items()},
                           **{f"{n}_samples_per_s": round(s["samples_per_s"], 2) for n, s in sides.items()}}
    if "trl" not in curves:
        row["skipped"] = "the TRL side (smoke mode)" if a.smoke else f"the TRL side ({BENCH_PY} missing)"
    if "trl" in curves:
        target = min(curves["ours"][-1][1], curves["trl"][-1][1])
        t_ours, t_trl = time_to(curves["ours"], target), time_to(curves["trl"], target)
        row.update(target_pass_at_1=target, ours_time_to_target_s=t_ours, trl_time_to_target_s=t_trl,
                   speedup=round(t_trl / t_ours, 2) if t_ours and t_trl else None)
    report("learning", row)


if __name__ == "__main__":
    main()
