"""The trainer: GRPO / GSPO on a LoRA adapter (transformers + peft), over frozen rollouts.

One loop, with every choice pushed into the pure functions of ``advantages``, ``kl``, ``losses``
and ``logprobs`` and the validated :class:`tasks.config.TrainConfig`:

1. reference log-probs: the starting policy kept frozen (the base model for a fresh adapter, whose
   LoRA B is 0; the starting adapter when ``init_adapter`` is given), or the base model with the
   adapter disabled (``reference: base``);
2. old (behaviour) log-probs: recomputed with the starting policy, or the sampler's own;
3. KL in reward: r' = r - beta * sum_t k_t(old, ref) (detached), before advantages; when old and
   ref are both the starting policy this term is exactly 0;
4. group advantages under one of P4's grouping rules (:func:`advantages.advantages_for`);
5. ``steps`` optimizer steps over the batch; micro-batches accumulate gradients with global
   token / sequence denominators, so the gradient equals the one-big-batch gradient;
6. KL in loss: beta * agg(k_t(theta, ref)), optionally importance-weighted (rho * k), added to
   the policy loss;
7. a resumable state (adapter, AdamW state, RNG, step) every ``checkpoint_every`` steps.

bf16 autocast for forward passes, fp32 master weights (the LoRA parameters and AdamW state).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from tasks.config import RunConfig
from tasks.hashing import seed_from
from tasks.train.sequences import TrainSequence


@dataclass
class TrainResult:
    """``steps``: rows of the ``train_steps`` artifact (deterministic); ``timing``: per step
    ``{"step", "seconds", "tokens_per_s"}`` (wall clock); ``adapter_dir``: the saved adapter."""

    steps: list[dict[str, Any]]
    timing: list[dict[str, float]]
    adapter_dir: Path


def _batches(seqs: list[TrainSequence], micro: int) -> list[list[int]]:
    """Micro-batches of sequence indices: one sampling setting per micro-batch, sequences sorted by
    length so that little padding is computed (the accumulated gradient does not depend on how
    sequences are grouped, since every micro-batch uses the global denominators)."""
    by_key: dict[tuple[float, int, float], list[int]] = {}
    for i, s in enumerate(seqs):
        by_key.setdefault(s.sampling_key, []).append(i)
    out = []
    for key in sorted(by_key):
        idx = sorted(by_key[key], key=lambda i: (len(seqs[i].ids), i))
        out += [idx[j:j + micro] for j in range(0, len(idx), micro)]
    return out


def _pad(seqs: list[TrainSequence], idx: list[int], pad_id: int) -> tuple[Any, Any, Any, Any]:
    import torch

    width = max(len(seqs[i].ids) for i in idx)
    ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(idx), width), dtype=torch.long)
    mask = torch.zeros((len(idx), width), dtype=torch.float32)
    blogp = torch.zeros((len(idx), width), dtype=torch.float32)
    for r, i in enumerate(idx):
        s = seqs[i]
        n = len(s.ids)
        ids[r, :n] = torch.tensor(s.ids)
        attn[r, :n] = 1
        mask[r, :n] = torch.tensor(s.mask, dtype=torch.float32)
        blogp[r, :n] = torch.tensor(s.behaviour_logp, dtype=torch.float32)
    # position p of the targets predicts ids[p + 1]
    return ids, attn, mask[:, 1:], blogp[:, 1:]


def _logp(model: Any, ids: Any, attn: Any, mask: Any, key: tuple[float, int, float],
          autocast_ctx: Callable[[], Any], with_entropy: bool = False) -> tuple[Any, Any]:
    """``[B, T-1]`` log-probs of ``ids[:, 1:]`` (and entropies), computed only where ``mask`` is 1.

    The output projection (hidden -> vocabulary) and the sampler's logit processing run only at
    the masked positions: prompt, observation and padding positions never need logits, and on
    multi-turn episodes they are most of the sequence. Zero elsewhere.
    """
    import torch

    from tasks.train.logprobs import entropy_from_logits, token_logprobs

    temperature, top_k, top_p = key
    sel = mask.bool()  # [B, T-1]
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    with autocast_ctx():
        hidden = inner.get_decoder()(input_ids=ids, attention_mask=attn).last_hidden_state[:, :-1]  # [B, T-1, H]
        logits = inner.get_output_embeddings()(hidden[sel.to(hidden.device)])  # [N, V]
    targets = ids[:, 1:][sel.to(ids.device)]
    lp = token_logprobs(logits, targets, temperature=temperature, top_k=top_k or None,
                       top_p=top_p if top_p < 1.0 else None).cpu()
    logp = torch.zeros(sel.shape, dtype=torch.float32).index_put((sel.nonzero(as_tuple=True)), lp)
    ent = None
    if with_entropy:
        with torch.no_grad():
            e = entropy_from_logits(logits.detach(), temperature=temperature).cpu()
            ent = torch.zeros(sel.shape, dtype=torch.float32).index_put((sel.nonzero(as_tuple=True)), e)
    return logp, ent


def _save_state(path: Path, state: dict[str, Any]) -> None:
    """Atomically write a resumable training state (temp file + rename)."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def train(cfg: RunConfig, model_dir: Path, seqs: list[TrainSequence], out_dir: Path,
          log: Callable[[str], None] = print, *, state_path: Path | None = None, resume_key: str = "",
          stop_after: int | None = None) -> TrainResult:
    """Run ``cfg.train.steps`` GRPO / GSPO / GSPO-token steps on a LoRA adapter over ``seqs`` and
    save the adapter to ``out_dir``.

    Args:
        cfg: the run config (``train`` and ``policy`` sections are read).
        model_dir: the base model folder.
        seqs: the training sequences (one per episode).
        out_dir: where the final adapter is saved.
        state_path: file for the resumable state (adapter weights, AdamW state, RNG, step, metric
            rows), rewritten every ``train.checkpoint_every`` steps. When it holds a state with the
            same ``resume_key``, training resumes after its step and ends exactly where an
            uninterrupted run would.
        stop_after: stop (raising :class:`TrainingInterrupted`) after this many steps of this call;
            used to test resumption.

    Returns:
        :class:`TrainResult`: per-step metric rows, wall-clock timing, the adapter folder.

    Raises:
        ValueError: no sequences, or no policy-generated token in the batch.
        FloatingPointError: a non-finite gradient norm.
    """
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict

    from tasks.rollout.models import load_model_and_tokenizer
    from tasks.rollout.policy import autocast
    from tasks.train.advantages import advantages_for, zero_signal_fraction
    from tasks.train.kl import importance_weighted, kl_estimate
    from tasks.train.losses import agg_loss, policy_loss

    tc = cfg.train
    kl_cfg = tc.kl
    if not seqs:
        raise ValueError("train: no usable episodes (all were infra errors or there were none)")
    torch.manual_seed(seed_from(cfg.seed, "train"))
    device = cfg.policy.device
    base, tok = load_model_and_tokenizer(model_dir, device)
    pad_id = int(tok.pad_token_id)
    if tc.init_adapter:
        model = PeftModel.from_pretrained(base, tc.init_adapter, is_trainable=True)
    else:
        model = get_peft_model(base, LoraConfig(r=tc.lora.r, lora_alpha=tc.lora.alpha, lora_dropout=tc.lora.dropout,
                                                target_modules=list(tc.lora.target_modules), task_type="CAUSAL_LM"))
    model.train()
    ac = lambda: autocast(device, cfg.policy.autocast_dtype)  # noqa: E731

    def passes(indices: list[int], adapter: bool) -> dict[int, Any]:
        """No-grad log-probs per sequence (1-D, masked) under the starting policy or the base."""
        out: dict[int, Any] = {}
        with torch.no_grad():
            for idx in _batches([seqs[i] for i in indices], tc.micro_batch_size):
                idx = [indices[j] for j in idx]
                ids, attn, mask, _ = _pad(seqs, idx, pad_id)
                if adapter:
                    lp = _logp(model, ids.to(device), attn.to(device), mask, seqs[idx[0]].sampling_key, ac)[0]
                else:
                    with model.disable_adapter():
                        lp = _logp(model, ids.to(device), attn.to(device), mask, seqs[idx[0]].sampling_key, ac)[0]
                for r, i in enumerate(idx):
                    out[i] = lp[r, : len(seqs[i].ids) - 1]
        return out

    def behaviour(i: int) -> Any:
        return torch.tensor(seqs[i].behaviour_logp[1:], dtype=torch.float32)

    kl_in_reward = kl_cfg.beta > 0 and kl_cfg.placement in ("reward", "both")
    kl_in_loss = kl_cfg.beta > 0 and kl_cfg.placement in ("loss", "both")
    # With a fresh adapter (LoRA B = 0) the starting policy *is* the base model, exactly.
    ref_is_initial = tc.reference == "initial" or not tc.init_adapter
    old_is_initial = tc.old_logprobs == "recompute"
    everyone = list(range(len(seqs)))
    rewards = torch.tensor([s.reward for s in seqs], dtype=torch.float64)
    initial: dict[int, Any] = {}
    base_lp: dict[int, Any] = {}
    if kl_in_reward and not (ref_is_initial and old_is_initial):
        # r' = r - beta * sum_t k_t(old, ref), detached, before advantages (P5, "in reward")
        initial = passes(everyone, adapter=True)
        base_lp = {} if ref_is_initial else passes(everyone, adapter=False)
        for i in everyone:
            old = initial[i] if old_is_initial else behaviour(i)
            ref = initial[i] if ref_is_initial else base_lp[i]
            m = torch.tensor(seqs[i].mask[1:], dtype=torch.float32)
            rewards[i] -= kl_cfg.beta * float((kl_estimate(old, ref, kl_cfg.estimator) * m).sum())
    # else: old = ref = the starting policy, so k(old, ref) = 0 for every estimator: nothing to subtract
    adv, gids = advantages_for(rewards, [s.task_id for s in seqs], [s.harness_id for s in seqs], tc.grouping,
                               scale=tc.advantage_scale, seed=seed_from(cfg.seed, "coverage"))
    zero_frac = zero_signal_fraction(adv, gids)
    num_tokens = float(sum(sum(s.mask[1:]) for s in seqs))
    num_seqs = float(sum(1 for s in seqs if sum(s.mask[1:]) > 0))
    if num_tokens == 0:
        raise ValueError("train: no trainable (policy-generated) tokens in the batch")
    # A sequence with advantage exactly 0 contributes exactly 0 to the clipped policy loss and its
    # gradient; unless the KL term is in the loss, it is skipped (it still counts in the global
    # denominators, so the loss and gradient are those of the whole batch).
    active = [i for i in everyone if kl_in_loss or adv[i] != 0.0]
    batches = [[active[j] for j in b] for b in _batches([seqs[i] for i in active], tc.micro_batch_size)]
    log(f"train: {len(seqs)} sequences, {len(active)} with signal, {int(num_tokens)} policy tokens, "
        f"{len(batches)} micro-batches, zero-advantage groups {zero_frac:.2f}")
    missing = [i for i in active if i not in initial]
    if missing:
        initial.update(passes(missing, adapter=True))
    if not ref_is_initial:
        missing = [i for i in active if i not in base_lp]
        base_lp.update(passes(missing, adapter=False))

    def stack(per_seq: dict[int, Any] | None, idx: list[int], width: int) -> Any:
        out = torch.zeros((len(idx), width), dtype=torch.float32)
        for r, i in enumerate(idx):
            v = per_seq[i] if per_seq is not None else behaviour(i)
            out[r, : v.numel()] = v
        return out

    level = {"grpo": "token", "gspo": "sequence", "gspo_token": "sequence_token"}[tc.algorithm]
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=tc.lr, weight_decay=tc.weight_decay)
    rows: list[dict[str, Any]] = []
    timing: list[dict[str, float]] = []
    first = 1
    if state_path is not None and state_path.is_file():
        st = torch.load(state_path, weights_only=False)
        if st.get("resume_key") == resume_key:
            set_peft_model_state_dict(model, st["adapter"])
            opt.load_state_dict(st["optimizer"])
            torch.set_rng_state(st["rng"])
            rows, timing, first = st["rows"], st["timing"], st["step"] + 1
            log(f"train: resuming after step {st['step']} from {state_path}")
    for step in range(first, tc.steps + 1):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        tot = {"loss": 0.0, "policy_loss": 0.0, "kl": 0.0, "entropy": 0.0, "clip_frac": 0.0}
        seen_tokens = 0.0
        for idx in batches:
            ids, attn, mask, _ = _pad(seqs, idx, pad_id)
            width = mask.shape[1]
            old_lp = stack(initial if old_is_initial else None, idx, width)
            ref_lp = stack(initial if ref_is_initial else base_lp, idx, width)
            logp, ent = _logp(model, ids.to(device), attn.to(device), mask, seqs[idx[0]].sampling_key, ac,
                              with_entropy=True)
            m_tokens = float(mask.sum())
            pg, met = policy_loss(logp, old_lp, adv[idx], mask, level=level, clip_low=tc.clip_low,
                                  clip_high=tc.clip_high, agg=tc.agg, max_len=tc.max_len,
                                  num_tokens=num_tokens, num_seqs=num_seqs)
            k = kl_estimate(logp, ref_lp, kl_cfg.estimator) * mask
            loss = pg
            if kl_in_loss:
                k_loss = importance_weighted(k, logp, old_lp, mask) if kl_cfg.importance_weighted else k
                loss = loss + kl_cfg.beta * agg_loss(k_loss, mask, tc.agg, max_len=tc.max_len, num_tokens=num_tokens,
                                                     num_seqs=num_seqs)
            loss.backward()
            seen_tokens += m_tokens
            tot["loss"] += float(loss.detach())
            tot["policy_loss"] += float(pg.detach())
            tot["kl"] += float(k.detach().sum())
            tot["entropy"] += float((ent * mask).sum())
            tot["clip_frac"] += met["clip_frac"] * m_tokens
        for key in ("kl", "entropy", "clip_frac"):  # token means over the sequences trained on
            tot[key] = tot[key] / seen_tokens if seen_tokens else 0.0
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, tc.max_grad_norm)) if batches else 0.0
        if not math.isfinite(grad_norm):
            raise FloatingPointError(f"train step {step}: gradient norm is {grad_norm}")
        if batches:
            opt.step()
        dt = time.perf_counter() - t0
        rows.append({
            "step": step, **tot, "grad_norm": grad_norm, "reward_mean": float(rewards.mean()),
            "zero_adv_frac": zero_frac, "lr": tc.lr, "tokens": int(seen_tokens),
        })
        timing.append({"step": step, "seconds": dt, "tokens_per_s": seen_tokens / dt if dt > 0 else 0.0})
        log(f"train step {step}/{tc.steps}: loss {tot['loss']:.4f} kl {tot['kl']:.5f} clip {tot['clip_frac']:.3f} "
            f"grad {grad_norm:.3f} ({dt:.1f} s)")
        if state_path is not None and (step % tc.checkpoint_every == 0 or step == tc.steps):
            _save_state(state_path, {"resume_key": resume_key, "step": step, "adapter": get_peft_model_state_dict(model),
                                     "optimizer": opt.state_dict(), "rng": torch.get_rng_state(), "rows": rows,
                                     "timing": timing})
        if stop_after is not None and step - first + 1 >= stop_after and step < tc.steps:
            raise TrainingInterrupted(f"stopped after step {step} (stop_after={stop_after})")
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    return TrainResult(steps=rows, timing=timing, adapter_dir=out_dir)


class TrainingInterrupted(RuntimeError):
    """Raised by :func:`train` when ``stop_after`` steps are done (a simulated kill)."""
