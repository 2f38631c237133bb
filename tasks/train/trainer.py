"""The trainer: GRPO / GSPO on a LoRA adapter (transformers + peft), over frozen rollouts or online.

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

import contextlib
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from tasks.config import RunConfig
from tasks.hashing import seed_from
from tasks.train.sequences import TrainSequence


def autocast(device: str, dtype: str) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast on ``device`` (CPU or CUDA), or a no-op for float32."""
    import torch

    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device, dtype=torch.bfloat16)


@dataclass
class TrainResult:
    """``steps``: rows of the ``train_steps`` artifact (deterministic); ``timing``: per step
    ``{"step", "seconds", "tokens_per_s"}`` (wall clock); ``adapter_dir``: the saved adapter."""

    steps: list[dict[str, Any]]
    timing: list[dict[str, float]]
    adapter_dir: Path


def _batches(seqs: list[TrainSequence], micro: int) -> list[list[int]]:
    """Micro-batches of sequence indices: one sampling setting per micro-batch, the samples of one
    prompt together, groups ordered by length so that little padding is computed (the accumulated
    gradient does not depend on how sequences are grouped: every micro-batch uses the global
    denominators)."""
    by_key: dict[tuple[float, int, float], list[int]] = {}
    for i, s in enumerate(seqs):
        by_key.setdefault(s.sampling_key, []).append(i)
    out = []
    for key in sorted(by_key):
        # samples of one prompt side by side (their prompt is then computed once), then by length
        first = {}
        for i in by_key[key]:
            first.setdefault(tuple(seqs[i].ids[: prefix_len(seqs[i])]), len(seqs[i].ids))
        idx = sorted(by_key[key], key=lambda i: (first[tuple(seqs[i].ids[: prefix_len(seqs[i])])],
                                                 tuple(seqs[i].ids[: prefix_len(seqs[i])]), len(seqs[i].ids), i))
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


def prefix_len(s: TrainSequence) -> int:
    """Length of a sequence's first prompt: the tokens before its first policy token."""
    return s.mask.index(1) if 1 in s.mask else len(s.ids)


def _hidden_shared_prefix(decoder: Any, ids: Any, attn: Any, sel: Any, prefix_lens: list[int], pad_id: int) -> Any:
    """Final hidden states ``[N, H]`` at the selected target positions, computing each distinct
    first prompt once: the G samples of a GRPO group share their prompt, so its keys and values
    are computed for one row and gathered for the others (the gather is differentiable, so the
    gradient through the prompt is the same as without sharing). Prompts are left-padded,
    completions right-padded; position ids are the true positions.
    """
    import torch

    n = ids.shape[0]
    lengths = attn.sum(-1).tolist()
    uniq: dict[tuple[int, ...], int] = {}
    j_idx = [uniq.setdefault(tuple(ids[r, : prefix_lens[r]].tolist()), len(uniq)) for r in range(n)]
    prompts = list(uniq)
    width = max(len(p) for p in prompts)
    p_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    p_attn = torch.zeros((len(prompts), width), dtype=torch.long)
    for j, p in enumerate(prompts):
        p_ids[j, width - len(p):] = torch.tensor(p, dtype=torch.long)
        p_attn[j, width - len(p):] = 1
    dev = ids.device
    p_ids, p_attn = p_ids.to(dev), p_attn.to(dev)
    out_p = decoder(input_ids=p_ids, attention_mask=p_attn, position_ids=(p_attn.cumsum(-1) - 1).clamp_min(0),
                    use_cache=True)
    j = torch.tensor(j_idx, device=dev)
    cache = out_p.past_key_values
    cache.batch_select_indices(j)
    f = torch.tensor(prefix_lens, device=dev)
    s_len = max(1, max(L - fr for L, fr in zip(lengths, prefix_lens)))
    s_ids = torch.full((n, s_len), pad_id, dtype=torch.long, device=dev)
    s_attn = torch.zeros((n, s_len), dtype=torch.long, device=dev)
    for r in range(n):
        k = lengths[r] - prefix_lens[r]
        s_ids[r, :k] = ids[r, prefix_lens[r]: lengths[r]]
        s_attn[r, :k] = 1
    out_s = decoder(input_ids=s_ids, attention_mask=torch.cat([p_attn[j], s_attn], 1),
                    position_ids=f[:, None] + torch.arange(s_len, device=dev)[None], past_key_values=cache,
                    use_cache=True)
    # hid[:, u] is the hidden state at full position prefix_len - 1 + u
    hid = torch.cat([out_p.last_hidden_state[:, -1][j][:, None], out_s.last_hidden_state], 1)
    rows, qs = sel.nonzero(as_tuple=True)
    return hid[rows.to(dev), (qs.to(dev) - (f[rows.to(dev)] - 1))]


def _logp(model: Any, ids: Any, attn: Any, mask: Any, key: tuple[float, int, float],
          autocast_ctx: Callable[[], Any], with_entropy: bool = False, *, prefix_lens: list[int] | None = None,
          pad_id: int = 0) -> tuple[Any, Any]:
    """``[B, T-1]`` log-probs of ``ids[:, 1:]`` (and entropies), computed only where ``mask`` is 1.

    The output projection (hidden -> vocabulary) and the sampler's logit processing run only at
    the masked positions: prompt, observation and padding positions never need logits, and on
    multi-turn episodes they are most of the sequence. With ``prefix_lens`` each distinct first
    prompt is run once (:func:`_hidden_shared_prefix`). Zero elsewhere.
    """
    import torch

    from tasks.train.logprobs import entropy_from_logits, token_logprobs

    temperature, top_k, top_p = key
    sel = mask.bool()  # [B, T-1]
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    with autocast_ctx():
        if prefix_lens is None:
            hidden = inner.get_decoder()(input_ids=ids, attention_mask=attn).last_hidden_state[:, :-1]  # [B, T-1, H]
            hidden = hidden[sel.to(hidden.device)]
        else:
            hidden = _hidden_shared_prefix(inner.get_decoder(), ids, attn, sel, prefix_lens, pad_id)
        logits = inner.get_output_embeddings()(hidden)  # [N, V]
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


class TrainingInterrupted(RuntimeError):
    """Raised when ``stop_after`` steps are done (a simulated kill, for resume tests)."""


@dataclass
class PreparedBatch:
    """A batch ready for optimizer steps: advantages ``[N]``, per-sequence old and reference
    log-probs (1-D, masked), the micro-batches of sequences with signal, global denominators."""

    seqs: list[TrainSequence]
    rewards: Any
    adv: Any
    zero_frac: float
    num_tokens: float
    num_seqs: float
    batches: list[list[int]]
    old: dict[int, Any]
    ref: dict[int, Any]
    version: int  # policy version that sampled the batch


class Trainer:
    """One LoRA policy, its optimizer and its reference, stepping over prepared batches.

    The reference policy is the starting policy kept frozen (``train.reference: initial``): the
    base model for a fresh adapter (LoRA B = 0, so the adapter-disabled model is that policy,
    exactly), or a frozen second copy of ``init_adapter``; or the base model with the adapter
    disabled (``reference: base``).
    """

    def __init__(self, cfg: RunConfig, model_dir: Path, log: Callable[[str], None] = print):
        import torch
        from peft import LoraConfig, PeftModel, get_peft_model

        from tasks.rollout.models import load_model_and_tokenizer

        self.cfg, self.tc, self.log = cfg, cfg.train, log
        torch.manual_seed(seed_from(cfg.seed, "train"))
        self.device = cfg.policy.device
        base, self.tokenizer = load_model_and_tokenizer(model_dir, self.device)
        self.pad_id = int(self.tokenizer.pad_token_id)
        tc = self.tc
        if tc.init_adapter:
            self.model = PeftModel.from_pretrained(base, tc.init_adapter, is_trainable=True)
            if tc.reference == "initial":
                self.model.load_adapter(tc.init_adapter, adapter_name="reference", is_trainable=False)
                self.model.set_adapter("default")
        else:
            self.model = get_peft_model(base, LoraConfig(
                r=tc.lora.r, lora_alpha=tc.lora.alpha, lora_dropout=tc.lora.dropout,
                target_modules=list(tc.lora.target_modules), task_type="CAUSAL_LM"))
        self.ref_mode = "adapter" if (tc.init_adapter and tc.reference == "initial") else "base"
        self.model.train()
        self.params = [p for n, p in self.model.named_parameters() if p.requires_grad and ".reference." not in n]
        self.opt = torch.optim.AdamW(self.params, lr=tc.lr, weight_decay=tc.weight_decay)
        self.ac = lambda: autocast(self.device, cfg.policy.autocast_dtype)  # noqa: E731
        self.version = 0
        self.level = {"grpo": "token", "gspo": "sequence", "gspo_token": "sequence_token"}[tc.algorithm]

    # ---- log-prob passes -------------------------------------------------------------------
    def _prefix_kw(self, seqs: list[TrainSequence], idx: list[int]) -> dict[str, Any]:
        """Shared-prompt computation when enabled and it saves work (some prompt repeats)."""
        if not self.tc.share_prompt:
            return {}
        firsts = [tuple(seqs[i].ids[: prefix_len(seqs[i])]) for i in idx]
        if len(set(firsts)) == len(firsts) or min(len(f) for f in firsts) == 0:
            return {}
        return {"prefix_lens": [len(f) for f in firsts], "pad_id": self.pad_id}

    def passes(self, seqs: list[TrainSequence], indices: list[int], which: str) -> dict[int, Any]:
        """No-grad log-probs per sequence (1-D, masked) under ``which``: ``policy`` (the current
        adapter) or ``reference``."""
        import torch

        out: dict[int, Any] = {}
        with torch.no_grad():
            for idx in _batches([seqs[i] for i in indices], self.tc.micro_batch_size):
                idx = [indices[j] for j in idx]
                ids, attn, mask, _ = _pad(seqs, idx, self.pad_id)
                args = (ids.to(self.device), attn.to(self.device), mask, seqs[idx[0]].sampling_key, self.ac)
                kw = self._prefix_kw(seqs, idx)
                if which == "policy":
                    lp = _logp(self.model, *args, **kw)[0]
                elif self.ref_mode == "base":
                    with self.model.disable_adapter():
                        lp = _logp(self.model, *args, **kw)[0]
                else:
                    self.model.set_adapter("reference")
                    try:
                        lp = _logp(self.model, *args, **kw)[0]
                    finally:
                        self.model.set_adapter("default")
                        for n, p in self.model.named_parameters():
                            if ".reference." in n:
                                p.requires_grad_(False)
                for r, i in enumerate(idx):
                    out[i] = lp[r, : len(seqs[i].ids) - 1]
        return out

    # ---- a batch ------------------------------------------------------------------------------
    def prepare(self, seqs: list[TrainSequence], *, old_from: str, version: int) -> PreparedBatch:
        """Rewards (minus the in-reward KL), advantages, old and reference log-probs for ``seqs``.

        ``old_from``: ``recompute`` (the current policy, now) or ``sampler`` (the behaviour
        log-probs recorded at sampling). Raises ValueError without any policy token.
        """
        import torch

        from tasks.train.advantages import advantages_for, zero_signal_fraction
        from tasks.train.kl import kl_estimate

        tc, kl_cfg = self.tc, self.tc.kl
        if not seqs:
            raise ValueError("train: no usable episodes (all were infra errors or there were none)")
        everyone = list(range(len(seqs)))
        kl_in_reward = kl_cfg.beta > 0 and kl_cfg.placement in ("reward", "both")
        kl_in_loss = kl_cfg.beta > 0 and kl_cfg.placement in ("loss", "both")
        # Before the first step the current policy *is* the reference (fresh adapter or the
        # starting adapter kept as reference): one pass serves both.
        ref_is_current = self.version == 0 and (self.ref_mode == "adapter" or not self.tc.init_adapter)
        rewards = torch.tensor([s.reward for s in seqs], dtype=torch.float64)
        old: dict[int, Any] = {}
        ref: dict[int, Any] = {}

        def behaviour(i: int) -> Any:
            return torch.tensor(seqs[i].behaviour_logp[1:], dtype=torch.float32)

        need_ref = kl_cfg.beta > 0  # with the KL off, the reference is never evaluated (kl is reported as NaN)

        def fill(indices: list[int]) -> None:
            todo = [i for i in indices if i not in old]
            if not todo:
                return
            want_cur = old_from == "recompute" or (need_ref and ref_is_current)
            cur = self.passes(seqs, todo, "policy") if want_cur else {}
            if need_ref:
                ref.update({i: cur[i] for i in todo} if ref_is_current else self.passes(seqs, todo, "reference"))
            old.update({i: cur[i] for i in todo} if old_from == "recompute" else {i: behaviour(i) for i in todo})

        if kl_in_reward and not (ref_is_current and old_from == "recompute"):
            # r' = r - beta * sum_t k_t(old, ref), detached, before advantages (P5, "in reward")
            fill(everyone)
            for i in everyone:
                m = torch.tensor(seqs[i].mask[1:], dtype=torch.float32)
                rewards[i] -= kl_cfg.beta * float((kl_estimate(old[i], ref[i], kl_cfg.estimator) * m).sum())
        # else old = ref = the current policy: k(old, ref) = 0 for every estimator, nothing to subtract
        adv, gids = advantages_for(rewards, [s.task_id for s in seqs], [s.harness_id for s in seqs], tc.grouping,
                                   scale=tc.advantage_scale, seed=seed_from(self.cfg.seed, "coverage", version))
        num_tokens = float(sum(sum(s.mask[1:]) for s in seqs))
        if num_tokens == 0:
            raise ValueError("train: no trainable (policy-generated) tokens in the batch")
        # A sequence with advantage exactly 0 contributes exactly 0 to the clipped policy loss and
        # its gradient; unless a KL term is in the loss it is skipped (it still counts in the
        # global denominators, so the loss and gradient are those of the whole batch).
        active = [i for i in everyone if kl_in_loss or adv[i] != 0.0]
        fill(active)
        batches = [[active[j] for j in b] for b in _batches([seqs[i] for i in active], tc.micro_batch_size)]
        zero_frac = zero_signal_fraction(adv, gids)
        self.log(f"train: {len(seqs)} sequences from policy version {version}, {len(active)} with signal, "
                 f"{int(num_tokens)} policy tokens, {len(batches)} micro-batches, zero-advantage groups {zero_frac:.2f}")
        return PreparedBatch(seqs=seqs, rewards=rewards, adv=adv, zero_frac=zero_frac, num_tokens=num_tokens,
                             num_seqs=float(sum(1 for s in seqs if sum(s.mask[1:]) > 0)), batches=batches,
                             old=old, ref=ref, version=version)

    def step(self, b: PreparedBatch) -> tuple[dict[str, Any], dict[str, float]]:
        """One optimizer step over the whole prepared batch (micro-batches accumulate).

        Returns the ``train_steps`` row and its wall-clock timing. Raises FloatingPointError on a
        non-finite gradient norm."""
        import torch

        from tasks.train.kl import importance_weighted, kl_estimate
        from tasks.train.losses import agg_loss, policy_loss

        tc, kl_cfg = self.tc, self.tc.kl
        kl_in_loss = kl_cfg.beta > 0 and kl_cfg.placement in ("loss", "both")

        def stack(per_seq: dict[int, Any], idx: list[int], width: int) -> Any:
            out = torch.zeros((len(idx), width), dtype=torch.float32)
            for r, i in enumerate(idx):
                out[r, : per_seq[i].numel()] = per_seq[i]
            return out

        t0 = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        tot = {"loss": 0.0, "policy_loss": 0.0, "kl": 0.0, "entropy": 0.0, "clip_frac": 0.0}
        seen = 0.0
        for idx in b.batches:
            ids, attn, mask, _ = _pad(b.seqs, idx, self.pad_id)
            old_lp = stack(b.old, idx, mask.shape[1])
            ref_lp = stack(b.ref, idx, mask.shape[1]) if b.ref else None
            logp, ent = _logp(self.model, ids.to(self.device), attn.to(self.device), mask, b.seqs[idx[0]].sampling_key,
                              self.ac, with_entropy=True, **self._prefix_kw(b.seqs, idx))
            pg, met = policy_loss(logp, old_lp, b.adv[idx], mask, level=self.level, clip_low=tc.clip_low,
                                  clip_high=tc.clip_high, agg=tc.agg, max_len=tc.max_len,
                                  num_tokens=b.num_tokens, num_seqs=b.num_seqs)
            k = kl_estimate(logp, ref_lp, kl_cfg.estimator) * mask if ref_lp is not None else None
            loss = pg
            if kl_in_loss:
                k_loss = importance_weighted(k, logp, old_lp, mask) if kl_cfg.importance_weighted else k
                loss = loss + kl_cfg.beta * agg_loss(k_loss, mask, tc.agg, max_len=tc.max_len,
                                                     num_tokens=b.num_tokens, num_seqs=b.num_seqs)
            loss.backward()
            m_tokens = float(mask.sum())
            seen += m_tokens
            tot["loss"] += float(loss.detach())
            tot["policy_loss"] += float(pg.detach())
            tot["kl"] += float(k.detach().sum()) if k is not None else float("nan")
            tot["entropy"] += float((ent * mask).sum())
            tot["clip_frac"] += met["clip_frac"] * m_tokens
        for key in ("kl", "entropy", "clip_frac"):  # token means over the sequences trained on
            tot[key] = tot[key] / seen if seen else 0.0
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, tc.max_grad_norm)) if b.batches else 0.0
        if not math.isfinite(grad_norm):
            raise FloatingPointError(f"train step {self.version + 1}: gradient norm is {grad_norm}")
        if b.batches:
            self.opt.step()
        self.version += 1
        dt = time.perf_counter() - t0
        staleness = self.version - 1 - b.version  # versions the trainer is ahead of the sampler
        row = {"step": self.version, **tot, "grad_norm": grad_norm, "reward_mean": float(b.rewards.mean()),
               "zero_adv_frac": b.zero_frac, "lr": tc.lr, "tokens": int(seen), "policy_version_sampled": b.version,
               "staleness": staleness}
        self.log(f"train step {self.version}/{tc.steps}: loss {tot['loss']:.4f} kl {tot['kl']:.5f} "
                 f"clip {tot['clip_frac']:.3f} grad {grad_norm:.3f} staleness {staleness} ({dt:.1f} s)")
        return row, {"step": self.version, "seconds": dt, "tokens_per_s": seen / dt if dt > 0 else 0.0}

    def inference_model(self, dtype: str) -> Any:
        """A plain copy of the current policy for sampling: the adapter merged into the weights
        (W + s * B A), cast to ``dtype``, in eval mode. Sampling from it skips the LoRA detour
        of every adapted layer; the trainer's own weights are not touched. (The "weight sync" of
        an RL system, here within one process.)"""
        import copy

        import torch

        merged = copy.deepcopy(self.model)
        for n in [n for n in merged.peft_config if n != "default"]:
            merged.delete_adapter(n)
        merged.set_adapter("default")
        plain = merged.merge_and_unload()
        return plain.to(getattr(torch, dtype)).eval()

    # ---- state ----------------------------------------------------------------------------------
    def state(self, **extra: Any) -> dict[str, Any]:
        import torch
        from peft import get_peft_model_state_dict

        return {"version": self.version, "adapter": get_peft_model_state_dict(self.model),
                "optimizer": self.opt.state_dict(), "rng": torch.get_rng_state(), **extra}

    def load(self, st: dict[str, Any]) -> None:
        import torch
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(self.model, st["adapter"])
        self.opt.load_state_dict(st["optimizer"])
        torch.set_rng_state(st["rng"])
        self.version = st["version"]

    def save_adapter(self, out_dir: Path) -> Path:
        """Save the trained adapter with a byte-stable ``adapter_config.json`` (see
        :func:`normalize_adapter_config`)."""
        out_dir.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(out_dir, selected_adapters=["default"])
        normalize_adapter_config(out_dir)
        return out_dir


def normalize_adapter_config(adapter_dir: Path, base_model_id: str | None = None) -> None:
    """Make ``adapter_config.json`` byte-stable: peft writes ``target_modules`` from a Python set,
    whose order changes from process to process (string hash randomisation), so the same weights
    would hash differently. Lists of strings are sorted, keys sorted; ``base_model_id``, when
    given, replaces the machine-specific base-model path."""
    import json

    path = adapter_dir / "adapter_config.json"
    conf = json.loads(path.read_text())
    for k, v in conf.items():
        if isinstance(v, list) and all(isinstance(x, str) for x in v):
            conf[k] = sorted(v)
    if base_model_id is not None:
        conf["base_model_name_or_path"] = base_model_id
    path.write_text(json.dumps(conf, indent=2, sort_keys=True) + "\n")


def _resume(state_path: Path | None, resume_key: str, log: Callable[[str], None]) -> dict[str, Any] | None:
    import torch

    if state_path is None or not state_path.is_file():
        return None
    st = torch.load(state_path, weights_only=False)
    if st.get("resume_key") != resume_key:
        return None
    log(f"train: resuming after step {st['version']} from {state_path}")
    return st


def train(cfg: RunConfig, model_dir: Path, seqs: list[TrainSequence], out_dir: Path,
          log: Callable[[str], None] = print, *, state_path: Path | None = None, resume_key: str = "",
          stop_after: int | None = None) -> TrainResult:
    """Frozen mode: ``cfg.train.steps`` optimizer steps over one batch of rollouts, then save the
    adapter to ``out_dir``.

    Args:
        state_path: file for the resumable state (adapter weights, AdamW state, RNG, step, metric
            rows), rewritten every ``train.checkpoint_every`` steps. When it holds a state with the
            same ``resume_key``, training resumes after its step and ends bit-identical to an
            uninterrupted run; a state that already holds all ``train.steps`` steps skips the
            log-prob passes and only saves its adapter.
        stop_after: raise :class:`TrainingInterrupted` after this many steps of this call.

    Raises:
        ValueError: no sequences, or no policy-generated token in the batch.
        FloatingPointError: a non-finite gradient norm.
    """
    tc = cfg.train
    trainer = Trainer(cfg, model_dir, log)
    st = _resume(state_path, resume_key, log)
    # a state that already holds every step needs no batch: load it and save the adapter
    if st is None or st["version"] < tc.steps:
        batch = trainer.prepare(seqs, old_from=tc.old_logprobs or "recompute", version=0)
    rows: list[dict[str, Any]] = []
    timing: list[dict[str, float]] = []
    if st is not None:
        trainer.load(st)
        rows, timing = st["rows"], st["timing"]
    done_here = 0
    from tasks.progress import progress

    with progress("train steps", tc.steps - trainer.version, "steps") as advance:
        while trainer.version < tc.steps:
            row, t = trainer.step(batch)
            rows.append(row)
            timing.append(t)
            done_here += 1
            advance(1)
            if state_path is not None and (trainer.version % tc.checkpoint_every == 0 or trainer.version == tc.steps):
                _save_state(state_path, trainer.state(resume_key=resume_key, rows=rows, timing=timing))
            if stop_after is not None and done_here >= stop_after and trainer.version < tc.steps:
                raise TrainingInterrupted(f"stopped after step {trainer.version} (stop_after={stop_after})")
    return TrainResult(steps=rows, timing=timing, adapter_dir=trainer.save_adapter(out_dir))


SampleFn = Callable[[Any, int, int], tuple[list[TrainSequence], dict[str, Any]]]


def train_online(cfg: RunConfig, model_dir: Path, sample: SampleFn, out_dir: Path,
                 log: Callable[[str], None] = print, *, state_path: Path | None = None,
                 resume_key: str = "") -> tuple[TrainResult, list[dict[str, Any]]]:
    """Online mode with bounded staleness (off-policy when ``train.max_staleness`` > 0).

    Loop until ``train.steps`` optimizer steps: sample a batch with the current policy (version
    v) through ``sample(trainer, v, iteration)``, which returns the sequences and any rows to
    keep; take up to ``max_staleness + 1`` steps on it, so the trainer is at most S versions ahead
    of the policy that sampled it; then sample again. Ratios use the behaviour log-probs recorded
    at sampling; each step's staleness is in its row. S = 0 is strictly on-policy. The state is
    saved after every batch; a resumed run continues with the next batch.

    Returns ``(TrainResult, sampled)`` where ``sampled`` collects what ``sample`` returned.
    """
    tc = cfg.train
    trainer = Trainer(cfg, model_dir, log)
    rows: list[dict[str, Any]] = []
    timing: list[dict[str, float]] = []
    sampled: list[dict[str, Any]] = []
    iteration = 0
    st = _resume(state_path, resume_key, log)
    if st is not None:
        trainer.load(st)
        rows, timing, sampled, iteration = st["rows"], st["timing"], st["sampled"], st["iteration"] + 1
    while trainer.version < tc.steps:
        v = trainer.version
        seqs, info = sample(trainer, v, iteration)
        sampled.append(info)
        batch = trainer.prepare(seqs, old_from="sampler", version=v)
        for _ in range(tc.max_staleness + 1):
            if trainer.version >= tc.steps:
                break
            row, t = trainer.step(batch)
            rows.append(row)
            timing.append(t)
        if state_path is not None:
            _save_state(state_path, trainer.state(resume_key=resume_key, rows=rows, timing=timing, sampled=sampled,
                                                  iteration=iteration))
        iteration += 1
    return TrainResult(steps=rows, timing=timing, adapter_dir=trainer.save_adapter(out_dir)), sampled
