"""The trainer: GRPO / GSPO on a LoRA adapter (transformers + peft), over frozen rollouts.

One loop, with every choice pushed into the pure functions of ``advantages``, ``kl``, ``losses``
and ``logprobs`` and the validated :class:`tasks.config.TrainConfig`:

1. reference log-probs: the base model (= the fresh adapter's policy, whose LoRA B is 0);
2. old (behaviour) log-probs: recomputed with the starting policy (= 1.), or the sampler's own;
3. KL in reward: r' = r - beta * sum_t k_t(old, ref) (detached), before advantages; with a fresh
   adapter old = ref, so this term is exactly 0 on the first batch of rollouts;
4. group advantages under the Within or Cross rule;
5. ``steps`` optimizer steps over the batch; micro-batches accumulate gradients with global
   token / sequence denominators, so the gradient equals the one-big-batch gradient;
6. KL in loss: beta * agg(k_t(theta, ref)) added to the policy loss.

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


def train(cfg: RunConfig, model_dir: Path, seqs: list[TrainSequence], out_dir: Path,
          log: Callable[[str], None] = print) -> TrainResult:
    """Run ``cfg.train.steps`` GRPO/GSPO steps on a fresh LoRA adapter and save it to ``out_dir``.

    Returns the per-step metric rows (the ``train_steps`` artifact) and the adapter folder.

    Raises:
        ValueError: no sequences, or a sequence without a single trainable token.
    """
    import torch
    from peft import LoraConfig, get_peft_model

    from tasks.rollout.models import load_model_and_tokenizer
    from tasks.rollout.policy import autocast
    from tasks.train.advantages import group_advantages, group_ids, zero_signal_fraction
    from tasks.train.kl import kl_estimate
    from tasks.train.losses import agg_loss, policy_loss

    tc = cfg.train
    if not seqs:
        raise ValueError("train: no usable episodes (all were infra errors or there were none)")
    torch.manual_seed(seed_from(cfg.seed, "train"))
    device = cfg.policy.device
    base, tok = load_model_and_tokenizer(model_dir, device)
    pad_id = int(tok.pad_token_id)
    lcfg = LoraConfig(r=tc.lora.r, lora_alpha=tc.lora.alpha, lora_dropout=tc.lora.dropout,
                      target_modules=list(tc.lora.target_modules), task_type="CAUSAL_LM")
    model = get_peft_model(base, lcfg)
    model.train()
    ac = lambda: autocast(device, cfg.policy.autocast_dtype)  # noqa: E731
    kl_cfg = tc.kl

    # A fresh LoRA adapter has B = 0, so at step 0 the policy *is* the reference model, exactly:
    # the recomputed behaviour log-probs equal the reference log-probs and the in-reward KL
    # k(old, ref) is 0 for every estimator. One no-grad pass serves as both.
    rewards = torch.tensor([s.reward for s in seqs], dtype=torch.float64)
    gids = group_ids([s.task_id for s in seqs], [s.harness_id for s in seqs], tc.grouping)
    adv = group_advantages(rewards, gids, scale=tc.advantage_scale)
    zero_frac = zero_signal_fraction(adv, gids)
    num_tokens = float(sum(sum(s.mask[1:]) for s in seqs))
    num_seqs = float(sum(1 for s in seqs if sum(s.mask[1:]) > 0))
    if num_tokens == 0:
        raise ValueError("train: no trainable (policy-generated) tokens in the batch")
    # A sequence with advantage exactly 0 contributes exactly 0 to the clipped policy loss and its
    # gradient; unless the KL term is in the loss, it is skipped (it still counts in the global
    # denominators, so the loss and gradient are those of the whole batch).
    kl_in_loss = kl_cfg.beta > 0 and kl_cfg.placement in ("loss", "both")
    active = [i for i in range(len(seqs)) if kl_in_loss or adv[i] != 0.0]
    batches = _batches([seqs[i] for i in active], tc.micro_batch_size)
    batches = [[active[j] for j in b] for b in batches]
    log(f"train: {len(seqs)} sequences, {len(active)} with signal, {int(num_tokens)} policy tokens, "
        f"{len(batches)} micro-batches, zero-advantage groups {zero_frac:.2f}")

    ref_lp: dict[int, Any] = {}
    with torch.no_grad():
        for b, idx in enumerate(batches):
            ids, attn, mask, blogp = _pad(seqs, idx, pad_id)
            if tc.old_logprobs == "sampler":
                ref_lp[b] = blogp
            else:
                ref_lp[b] = _logp(model, ids.to(device), attn.to(device), mask, seqs[idx[0]].sampling_key, ac)[0]
    old_lp = ref_lp

    level = "token" if tc.algorithm == "grpo" else "sequence"
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=tc.lr, weight_decay=tc.weight_decay)
    rows, timing = [], []
    for step in range(1, tc.steps + 1):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        tot = {"loss": 0.0, "policy_loss": 0.0, "kl": 0.0, "entropy": 0.0, "clip_frac": 0.0}
        seen_tokens = 0.0
        for b, idx in enumerate(batches):
            ids, attn, mask, _ = _pad(seqs, idx, pad_id)
            logp, ent = _logp(model, ids.to(device), attn.to(device), mask, seqs[idx[0]].sampling_key, ac,
                              with_entropy=True)
            m_tokens = float(mask.sum())
            pg, met = policy_loss(logp, old_lp[b], adv[idx], mask, level=level, clip_low=tc.clip_low,
                                  clip_high=tc.clip_high, agg=tc.agg, max_len=tc.max_len,
                                  num_tokens=num_tokens, num_seqs=num_seqs)
            k = kl_estimate(logp, ref_lp[b], kl_cfg.estimator)
            loss = pg
            if kl_in_loss:
                loss = loss + kl_cfg.beta * agg_loss(k, mask, tc.agg, max_len=tc.max_len, num_tokens=num_tokens,
                                                     num_seqs=num_seqs)
            loss.backward()
            seen_tokens += m_tokens
            tot["loss"] += float(loss.detach())
            tot["policy_loss"] += float(pg.detach())
            tot["kl"] += float((k.detach() * mask).sum())
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
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    return TrainResult(steps=rows, timing=timing, adapter_dir=out_dir)
