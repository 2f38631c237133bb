"""The trainer: GRPO / GSPO on a LoRA adapter (transformers + peft), one optimizer step per
mini-batch of whole groups.

Every choice is pushed into the pure functions of ``advantages``, ``batches``, ``kl``, ``losses``
and ``logprobs`` and the validated :class:`tasks.config.TrainConfig`. A :class:`Batch` is the
data whose old log-probs are fixed together (one frozen-mode epoch, or one online sample); each
:meth:`Trainer.step` on a mini-batch of it:

1. rewards r_i (the verifier's, with cut episodes scored 0: :mod:`tasks.train.sequences`);
2. KL in reward (P5): r'_i = r_i - beta * sum_t k_t(theta, ref), k evaluated on the *current*
   policy's log-probs of the sampled tokens, detached, at every step (before the first update of
   a fresh adapter theta = ref and the term is 0; from the second step on it acts). With stale
   samples the surrogate's ratio pi_theta / pi_old importance-weights it like the task reward:
   E_old[rho * A * grad log pi_theta] is the on-policy score-function gradient;
3. group advantages of the mini-batch's groups (complete, so the same as over the whole batch)
   under one of P4's grouping rules (:class:`tasks.train.batches.GroupPlan`);
4. the clipped policy loss against the fixed old log-probs (optionally TIS-weighted), plus KL in
   loss, beta * agg(k_t(theta, ref)), optionally importance-weighted (rho * k); micro-batches
   accumulate with the mini-batch's global denominators, so the gradient equals the one-big-batch
   gradient;
5. gradient clipping, one AdamW step; the policy version is the number of steps taken.

Data-parallel (``train.distributed``, :mod:`tasks.train.distributed`): under a process group of N >
1 processes each step's mini-batch is split across them by whole groups; each process runs its
share's micro-batches with the mini-batch's global denominators, its loss scaled by N, and
DistributedDataParallel averages the gradients (one all-reduce per step, the other micro-batches
under ``no_sync``), so every process takes the one-process step, to rounding: each rank's
micro-batches have other shapes, and under bf16 autocast that rounding, through AdamW's normalised
first steps, leaves a few weights up to 2 x lr from the one-process adapter (docs/scale-out.md).
The no-grad passes that fix a batch's old and reference log-probs are split the same way and
gathered; the step's metrics are summed over the processes. With ``train.distributed.fsdp`` the
frozen base weights are sharded (FSDP2, :func:`tasks.train.distributed.shard_base_weights`) instead
of replicated, the LoRA weights stay replicated and their gradients are averaged by one all-reduce,
and every process runs as many forward passes as the others (zero-weighted passes of one sequence
fill in): DDP's step to float rounding (bit-identical in the tests, 2 processes; with
``lora.dropout`` > 0 the padding passes draw dropout masks too, so the masks differ from DDP's).

Memory: the frozen base weights are held in ``policy.autocast_dtype`` (bf16 by default; float32
when autocast is off), the LoRA weights and the AdamW state in float32; forward passes under bf16
autocast. The loops over batches are in :mod:`tasks.train.loops`.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from tasks.config import RunConfig
from tasks.hashing import seed_from
from tasks.train.advantages import control_rewards
from tasks.train.batches import GroupPlan, plan_groups
from tasks.train.forward import layer_checkpointing, micro_batches, pad_batch, prefix_len, sequence_logprobs
from tasks.train.sequences import TrainSequence


def autocast(device: str, dtype: str) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast on ``device`` (CPU or CUDA), or a no-op for float32."""
    import torch

    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device, dtype=torch.bfloat16)


class TrainingInterrupted(RuntimeError):
    """Raised when ``stop_after`` steps are done (a simulated kill, for resume tests)."""


@dataclass
class Batch:
    """Sequences whose old log-probs were fixed together, ready for optimizer steps.

    Attributes:
        seqs: the sequences; ``rewards`` float64 ``[N]`` their rewards (before any KL term).
        train_rewards: float64 ``[N]``, the rewards the advantages are computed from: ``rewards``,
            or under ``train.reward_control`` the control's uninformative ones
            (:func:`tasks.train.advantages.control_rewards`); ``rewards`` stay the logged ones.
        plan: their groups under the arm's grouping rule.
        old, ref: per sequence index, 1-D float32 log-probs ``[len(ids) - 1]`` of the targets
            (0 where the mask is 0) under the old (behaviour or proximal) and the reference
            policy; ``ref`` is empty when no KL term is configured.
        old_version: the trainer version whose log-probs ``old`` are (recompute), or None when
            ``old`` is the sampler's.
        static_adv: float32 ``[N]`` advantages from the task rewards alone (what every step uses
            when no KL is in the reward).
        dropped: episodes left out of the batch, by rule (``build_sequences``).
        mismatch: ``{"mean", "max"}`` of |sampler log-prob - trainer log-prob| over the batch's
            policy tokens at the sampling version (None when the trainer was not at that version
            when the batch was fixed; then each step measures it if it can).
        epoch: the frozen epoch or online iteration the batch belongs to.
        sync_diff: the sync canary's max |logp diff| of the weights that sampled it (NaN: none).
        layout: the mini-batches of the batch's first pass (sequence indices).
        deferred: sequences whose old log-probs (and reference ones, when the current policy is
            the reference) are those of their first step's own forward pass, detached: the first
            mini-batch of a batch is trained at the version that fixed the batch, so a separate
            no-grad pass would compute the same numbers again (TRL's GRPO does the same with one
            iteration per batch). Filled into ``old``/``ref`` by that step.
        ref_deferred: whether ``deferred`` also covers ``ref``.
    """

    seqs: list[TrainSequence]
    rewards: Any
    train_rewards: Any
    plan: GroupPlan
    old: dict[int, Any]
    ref: dict[int, Any]
    old_version: int | None
    static_adv: Any
    dropped: dict[str, int] = field(default_factory=dict)
    mismatch: dict[str, float] | None = None
    epoch: int = 0
    sync_diff: float = float("nan")
    layout: list[list[int]] = field(default_factory=list)
    deferred: set[int] = field(default_factory=set)
    ref_deferred: bool = False


def _stack(per_seq: dict[int, Any], idx: list[int], width: int) -> Any:
    import torch

    out = torch.zeros((len(idx), width), dtype=torch.float32)
    for r, i in enumerate(idx):
        out[r, : per_seq[i].numel()] = per_seq[i]
    return out


def _logprob_module(model: Any) -> Any:
    """An ``nn.Module`` whose forward is :func:`sequence_logprobs` of ``model``: what DDP wraps, so
    that the trainer's forward passes go through DDP's ``forward`` (which prepares its gradient
    all-reduce) while the model keeps its peft interface."""
    import torch

    class LogprobModule(torch.nn.Module):
        def __init__(self, inner: Any):
            super().__init__()
            self.inner = inner

        def forward(self, ids: Any, attn: Any, mask: Any, key: tuple[float, int, float], ac: Callable[[], Any],
                    with_entropy: bool, kw: dict[str, Any]) -> tuple[Any, Any]:
            return sequence_logprobs(self.inner, ids, attn, mask, key, ac, with_entropy=with_entropy, **kw)

    return LogprobModule(model)


class Trainer:
    """One LoRA policy, its optimizer and its reference, stepping over mini-batches.

    The reference policy is the starting policy kept frozen (``train.reference: initial``): the
    base model for a fresh adapter (LoRA B = 0, so the adapter-disabled model is that policy,
    exactly), or a frozen second copy of ``init_adapter``; or the base model with the adapter
    disabled (``reference: base``).

    Inside a torch.distributed process group of N > 1 processes (:mod:`tasks.train.distributed`)
    the model is wrapped in DistributedDataParallel (or its base weights sharded with FSDP2,
    ``train.distributed.fsdp``) and every step trains this rank's share of the mini-batch; every
    rank must call the same methods with the same data.
    """

    def __init__(self, cfg: RunConfig, model_dir: Path, log: Callable[[str], None] = print):
        import torch
        from peft import LoraConfig, PeftModel, get_peft_model

        from tasks.rollout.models import load_model_and_tokenizer

        self.cfg, self.tc, self.log = cfg, cfg.train, log
        torch.manual_seed(seed_from(cfg.seed, "train"))
        self.device = cfg.policy.device
        from tasks.train.distributed import context

        self.dist = context()
        if self.device == "cuda" and self.dist.world_size > 1:  # rank r on GPU r, gloo too (nccl: set by join)
            import os

            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", str(self.dist.rank))) % torch.cuda.device_count())
        dc = cfg.train.distributed
        fsdp = self.dist.world_size > 1 and dc is not None and dc.fsdp
        # under FSDP the base is read into host memory and each layer's shard moved to the device as
        # it is sharded: the whole model never sits on one device
        base, self.tokenizer = load_model_and_tokenizer(model_dir, "cpu" if fsdp else self.device,
                                                        dtype=cfg.policy.autocast_dtype)
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
        if tc.gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.ref_mode = "adapter" if (tc.init_adapter and tc.reference == "initial") else "base"
        self.model.train()
        self.params = [p for n, p in self.model.named_parameters() if p.requires_grad and ".reference." not in n]
        for p in self.params:  # LoRA weights (and so AdamW's state) in float32 whatever the base dtype
            p.data = p.data.float()
        self.opt = torch.optim.AdamW(self.params, lr=tc.lr, weight_decay=tc.weight_decay)
        self.ac = lambda: autocast(self.device, cfg.policy.autocast_dtype)  # noqa: E731
        self.version = 0
        self.checkpointed_forwards = 0  # training forwards the automatic choice checkpointed (_auto_checkpoint)
        self.level = {"grpo": "token", "gspo": "sequence", "gspo_token": "sequence_token"}[tc.algorithm]
        self.ddp: Any = None
        self.fsdp: Any = None
        if fsdp:  # base weights sharded, LoRA replicated
            from tasks.train.distributed import shard_base_weights

            lora = {p for n, p in self.model.named_parameters() if "lora_" in n}
            for p in lora:  # FSDP moves what it shards; the replicated weights are ours to move
                p.data = p.data.to(self.device)
            layers = self.model.get_base_model().get_decoder().layers
            self.fsdp = shard_base_weights(_logprob_module(self.model), layers, lora, self.device)
        elif self.dist.world_size > 1:  # the base weights are frozen: DDP all-reduces only the LoRA gradients
            from torch.nn.parallel import DistributedDataParallel

            with warnings.catch_warnings():  # torch 2.13 renames the flag; the meaning we need is this one
                warnings.simplefilter("ignore", FutureWarning)
                # no buffer broadcast: ranks run different numbers of forwards per step (no_sync
                # micro-batches), and the buffers (rotary frequencies) are identical anyway
                self.ddp = DistributedDataParallel(_logprob_module(self.model), device_ids=None,
                                                   broadcast_buffers=False)

    # ---- log-prob passes -------------------------------------------------------------------
    def _prefix_kw(self, seqs: list[TrainSequence], idx: list[int]) -> dict[str, Any]:
        """Shared-prompt computation when enabled and it saves work (some prompt repeats, and
        every sequence has a prompt). Under FSDP the ranks decide together, for each forward (one
        ``all_reduce``): on when some rank's micro-batch repeats a prompt and none has a sequence
        without one. That path calls every layer twice (prompts, then the rest), and every rank's
        forwards must all-gather the layers equally often.
        """
        if not self.tc.share_prompt:
            return {}
        firsts = [tuple(seqs[i].ids[: prefix_len(seqs[i])]) for i in idx]
        repeats, empty = len(set(firsts)) < len(firsts), min(len(f) for f in firsts) == 0
        if self.fsdp is not None:
            from tasks.train.distributed import max_over_ranks

            repeats, empty = (bool(v) for v in max_over_ranks([int(repeats), int(empty)], self.dist))
        if not repeats or empty:
            return {}
        return {"prefix_lens": [len(f) for f in firsts], "pad_id": self.pad_id}

    def _auto_checkpoint(self, ids: Any, kw: dict[str, Any]) -> bool:
        """Whether a training forward of the padded ``ids`` ``[B, L]`` runs with its decoder layers
        checkpointed by the automatic choice: ``train.checkpoint_tokens`` > 0, the forward does not
        take the shared-prompt path (``kw`` empty: checkpointing cannot recompute the shared
        prompt's key/value cache), ``B x L`` exceeds it, not under FSDP, and
        ``gradient_checkpointing`` does not already checkpoint every forward."""
        n = self.tc.checkpoint_tokens
        return bool(n) and not kw and not self.tc.gradient_checkpointing and self.fsdp is None and ids.numel() > n

    def _micro_batches(self, seqs: list[TrainSequence]) -> list[list[int]]:
        """:func:`micro_batches` under the config's count and token budget."""
        return micro_batches(seqs, self.tc.micro_batch_size, self.tc.micro_tokens)

    def passes(self, seqs: list[TrainSequence], indices: list[int], which: str) -> dict[int, Any]:
        """No-grad log-probs per sequence (1-D ``[len(ids) - 1]``, 0 where masked) under ``which``:
        ``policy`` (the current adapter) or ``reference``."""
        import torch

        from tasks.train.distributed import max_over_ranks

        out: dict[int, Any] = {}
        mbs = [[indices[j] for j in local] for local in self._micro_batches([seqs[i] for i in indices])]
        if self.fsdp is not None:  # every rank all-gathers the layers as often as the others: pad with
            # forwards of one sequence (the shortest) whose log-probs are thrown away
            mbs += [None] * (max_over_ranks([len(mbs)], self.dist)[0] - len(mbs))
        with torch.no_grad():
            for idx in mbs:
                run = idx if idx is not None else [min(indices or range(len(seqs)), key=lambda i: len(seqs[i].ids))]
                ids, attn, mask, _ = pad_batch(seqs, run, self.pad_id)
                args = (ids, attn, mask, seqs[run[0]].sampling_key, False, self._prefix_kw(seqs, run), False)
                if which == "policy":
                    lp = self._forward(*args)[0]
                elif self.ref_mode == "base":
                    with self.model.disable_adapter():
                        lp = self._forward(*args)[0]
                else:
                    self.model.set_adapter("reference")
                    try:
                        lp = self._forward(*args)[0]
                    finally:
                        self.model.set_adapter("default")
                        for n, p in self.model.named_parameters():
                            if ".reference." in n:
                                p.requires_grad_(False)
                for r, i in enumerate(idx or []):
                    out[i] = lp[r, : len(seqs[i].ids) - 1]
        return out

    def eval_logprobs(self, seqs: list[TrainSequence], *, base: bool = False) -> dict[int, Any]:
        """:meth:`passes` of the policy (``base``: of the base model, every adapter disabled) over
        all of ``seqs`` in eval mode, dropout off: what an inference engine holding the same
        weights computes (the sync canary's side of the comparison). Draws no random numbers; the
        model is back in train mode afterwards."""
        was = self.model.training
        self.model.eval()
        try:
            if base:
                with self.model.disable_adapter():
                    return self.passes(seqs, list(range(len(seqs))), "policy")
            return self.passes(seqs, list(range(len(seqs))), "policy")
        finally:
            self.model.train(was)

    def share(self, plan: GroupPlan, seqs: list[TrainSequence], idx: list[int]) -> list[int]:
        """This rank's part of ``idx`` (whole groups, balanced by tokens; :func:`tasks.train.
        distributed.my_share`), in the order of ``idx``; ``idx`` itself on one process."""
        from tasks.train.distributed import my_share

        return my_share(idx, lambda i: plan.group_ids[i], lambda i: float(len(seqs[i].ids)), self.dist)

    def _ref_is_current(self) -> bool:
        """Before the first step the current policy *is* the reference (a fresh adapter, or the
        starting adapter kept as the reference): one pass serves both."""
        return self.version == 0 and (self.ref_mode == "adapter" or not self.tc.init_adapter)

    # ---- a batch ------------------------------------------------------------------------------
    def new_batch(self, seqs: list[TrainSequence], *, epoch: int = 0, dropped: dict[str, int] | None = None,
                  ref_cache: dict[int, Any] | None = None, sync_diff: float = float("nan"),
                  layout_seed: int = 0) -> Batch:
        """Fix the old log-probs of ``seqs`` (``train.old_logprobs``: recomputed now with the
        current policy, or the sampler's), compute the reference log-probs when a KL term is
        configured (``ref_cache``: those of the same sequences from an earlier epoch; the
        reference is frozen), the group plan and the task-reward advantages.

        The passes run mini-batch by mini-batch in the layout of the batch's first pass
        (``minibatches(plan.groups, batch_size, layout_seed)``, kept in ``Batch.layout``) with the
        micro-batches :meth:`step` will use, so that the first step's log-probs are computed in
        the same shapes and its ratio is exactly 1.

        Raises:
            ValueError: no sequences, or no policy-generated token among them.
        """
        import torch

        from tasks.train.batches import minibatches
        from tasks.train.distributed import gather_dict
        from tasks.train.kl import kl_in_reward

        tc, kl_cfg = self.tc, self.tc.kl
        if not seqs:
            raise ValueError("train: no usable episodes (all were infra errors, dropped, or there were none)")
        if sum(sum(s.mask[1:]) for s in seqs) == 0:
            raise ValueError("train: no trainable (policy-generated) tokens in the batch")
        rewards = torch.tensor([s.reward for s in seqs], dtype=torch.float64)
        # the random-reward control trains on rewards with the information taken out (logged: the real ones)
        train_rewards = control_rewards(rewards, tc.reward_control, seed_from(self.cfg.seed, "reward-control", epoch))
        plan = plan_groups(train_rewards, [s.task_id for s in seqs], [s.harness_id for s in seqs], tc.grouping,
                           scale=tc.advantage_scale, seed=seed_from(self.cfg.seed, "coverage", epoch))
        static = plan.advantages(train_rewards, range(len(seqs)))
        layout = minibatches(plan.groups, tc.batch_size, layout_seed)
        kl_on = kl_cfg.beta > 0
        recompute = tc.old_source == "recompute"
        old: dict[int, Any] = {}
        ref: dict[int, Any] = dict(ref_cache or {})
        # the first mini-batch takes its old log-probs from its own step (Batch.deferred), when it trains;
        # not under several processes (each rank would hold only its share) nor with KL in the
        # reward (its advantages need the log-probs before the step's forward)
        can_defer = recompute and self.dist.world_size == 1 and not kl_in_reward(kl_cfg.beta, kl_cfg.placement)
        deferred: set[int] = set()
        ref_deferred = False
        for n, idx in enumerate(layout):
            todo = self._active(idx, static, kl_on)
            if not todo:
                continue
            # only the batch's first step trains at the version that fixes the batch: when the first
            # mini-batch has no signal, its step still counts a version and nothing is deferred
            if can_defer and n == 0:
                deferred = set(todo)
                ref_deferred = kl_on and self._ref_is_current() and any(i not in ref for i in todo)
                missing = [i for i in todo if i not in ref] if kl_on and not ref_deferred else []
                ref.update(self.passes(seqs, missing, "reference") if missing else {})
                continue
            mine = self.share(plan, seqs, todo)  # the sequences this rank's step will train on, same shapes
            cur = self.passes(seqs, mine, "policy") if (recompute or (kl_on and self._ref_is_current())) else {}
            missing = [i for i in mine if i not in ref] if kl_on else []
            if self._ref_is_current():
                new_ref = {i: cur[i] for i in missing}
            else:  # every rank calls it, a rank with nothing missing too (under FSDP it joins the all-gathers)
                new_ref = self.passes(seqs, missing, "reference") if kl_on else {}
            cur, new_ref = gather_dict(cur, self.dist), gather_dict(new_ref, self.dist)
            ref.update(new_ref)
            for i in todo:
                old[i] = cur[i] if recompute else torch.tensor(seqs[i].behaviour_logp[1:], dtype=torch.float32)
        mismatch = None if deferred else self._mismatch(seqs, old) if recompute else None
        n_sig = int((static != 0).sum())
        self.log(f"train: batch of {len(seqs)} sequences in {len(plan.groups)} groups at policy version "
                 f"{self.version}, {n_sig} with a task-reward signal; dropped {dropped or {}}")
        return Batch(seqs=seqs, rewards=rewards, train_rewards=train_rewards, plan=plan, old=old, ref=ref,
                     old_version=self.version if recompute else None, static_adv=static, dropped=dict(dropped or {}),
                     mismatch=mismatch, epoch=epoch, sync_diff=sync_diff, layout=layout, deferred=deferred,
                     ref_deferred=ref_deferred)

    def _mismatch(self, seqs: list[TrainSequence], old: dict[int, Any]) -> dict[str, float] | None:
        """``{"mean", "max"}`` of |old - sampler log-prob| over the policy tokens of ``old``'s
        sequences, when every one was sampled at the current version; else None."""
        import torch

        from tasks.train.losses import masked

        if not old or any(seqs[i].policy_version != self.version for i in old):
            return None
        diffs = []
        for i in old:
            m = torch.tensor(seqs[i].mask[1:], dtype=torch.float32)
            beh = torch.tensor(seqs[i].behaviour_logp[1:], dtype=torch.float32)
            diffs.append(masked(old[i] - beh, m).abs()[m.bool()])
        d = torch.cat(diffs)
        return {"mean": float(d.mean()), "max": float(d.max())} if d.numel() else None

    @staticmethod
    def _active(idx: list[int], static_adv: Any, kl_on: bool) -> list[int]:
        """The sequences of a mini-batch that need a forward pass: all of them with a KL term (in
        the loss every token carries a KL gradient; in the reward the advantages move each step),
        else those with a non-zero advantage (the others contribute exactly 0 to the loss and its
        gradient; they still count in the denominators)."""
        return [i for i in idx if kl_on or static_adv[i] != 0.0]

    def advantages(self, b: Batch, idx: list[int]) -> tuple[Any, float]:
        """The advantages ``[len(idx)]`` (float32) a step on the mini-batch ``idx`` uses now, and
        the mean in-reward KL penalty beta * sum_t k_t (NaN without KL in the reward).

        With KL in the reward (P5): r'_i = r_i - beta * sum_t k_t(theta, ref), k on the current
        policy's log-probs of the sampled tokens, detached (a no-grad pass unless the current
        policy is the one the old log-probs were recomputed with); else the task-reward
        advantages fixed with the batch."""
        import torch

        from tasks.train.kl import kl_in_reward, kl_penalized_rewards

        kl_cfg = self.tc.kl
        if not kl_in_reward(kl_cfg.beta, kl_cfg.placement):
            return b.static_adv[idx], float("nan")
        seqs = b.seqs
        if self.version == b.old_version:
            cur = {i: b.old[i] for i in idx}
        else:  # each rank its share (the step's micro-batches), gathered: every rank needs every penalty
            from tasks.train.distributed import gather_dict

            cur = gather_dict(self.passes(seqs, self.share(b.plan, seqs, idx), "policy"), self.dist)
        masks = [torch.tensor(seqs[i].mask[1:], dtype=torch.float32) for i in idx]
        rewards, penalty = kl_penalized_rewards(b.train_rewards[idx], [cur[i] for i in idx], [b.ref[i] for i in idx],
                                                masks, kl_cfg.estimator, kl_cfg.beta)
        return b.plan.advantages(rewards, idx), penalty

    def step(self, b: Batch, idx: list[int], *, ppo_epoch: int = 0, batch_index: int = 0
             ) -> tuple[dict[str, Any], dict[str, float]]:
        """One optimizer step on the mini-batch ``idx`` (indices into ``b.seqs``, whole groups).

        Under N > 1 processes this rank runs its share (:meth:`share`) with the mini-batch's global
        denominators and its loss scaled by N; DDP's averaged gradient is then the gradient of the
        whole mini-batch, and the row's metrics are summed over the ranks (the same row on each).

        Returns the ``train_steps`` row and its wall-clock timing. Raises FloatingPointError on a
        non-finite gradient norm."""
        import json

        import torch

        from tasks.train.advantages import zero_signal_fraction
        from tasks.train.kl import kl_estimate, kl_in_loss, kl_loss_term
        from tasks.train.losses import policy_loss, truncated_is_weights

        tc, kl_cfg = self.tc, self.tc.kl
        in_loss = kl_in_loss(kl_cfg.beta, kl_cfg.placement)
        t0 = time.perf_counter()
        seqs = b.seqs
        adv, penalty = self.advantages(b, idx)
        adv_of = {i: adv[r] for r, i in enumerate(idx)}
        active = self._active(idx, b.static_adv, kl_cfg.beta > 0)
        num_tokens = float(sum(sum(seqs[i].mask[1:]) for i in idx))
        num_seqs = float(sum(1 for i in idx if sum(seqs[i].mask[1:]) > 0))
        mine = self.share(b.plan, seqs, active)
        world = float(self.dist.world_size)
        self.opt.zero_grad(set_to_none=True)
        tot = {"loss": 0.0, "policy_loss": 0.0, "kl": 0.0, "entropy": 0.0, "clip_frac": 0.0}
        r_min, r_max, r_sum, seen = math.inf, -math.inf, 0.0, 0.0
        mis_sum, mis_max, mis_n = 0.0, 0.0, 0
        measure_mismatch = b.mismatch is None
        mbs = [[mine[j] for j in local] for local in self._micro_batches([seqs[i] for i in mine])]
        # a rank with less to do joins the collectives with zero-gradient passes of one sequence, after
        # its micro-batches as in :meth:`passes` (so that the ranks' j-th forwards are the same in both:
        # the shared-prompt decision): DDP's one all-reduce when it has nothing; under FSDP every
        # forward and backward (all-gathers)
        n_idle = 0
        if active and self.fsdp is not None:
            from tasks.train.distributed import max_over_ranks

            n_idle = max_over_ranks([len(mbs)], self.dist)[0] - len(mbs)
        elif active and self.ddp is not None and not mbs:
            n_idle = 1
        had_deferred = bool(b.deferred)
        for n_mb, mb in enumerate(mbs):
            ids, attn, mask, blogp = pad_batch(seqs, mb, self.pad_id)
            defer = [i for i in mb if i in b.deferred]
            if defer and (len(defer) != len(mb) or self.version != b.old_version):
                raise RuntimeError(f"train step {self.version + 1}: the batch's first mini-batch must be trained first, "
                                   f"at version {b.old_version}")
            old_lp = None if defer else _stack(b.old, mb, mask.shape[1])
            ref_lp = _stack(b.ref, mb, mask.shape[1]) if b.ref and not (defer and b.ref_deferred) else None
            # DDP all-reduces at the backward of this rank's last micro-batch only
            sync = self.ddp is None or n_mb == len(mbs) - 1
            with contextlib.nullcontext() if sync else self.ddp.no_sync():
                kw = self._prefix_kw(seqs, mb)
                with layer_checkpointing(self.model, self._auto_checkpoint(ids, kw)) as n_on:
                    self.checkpointed_forwards += bool(n_on)
                    logp, ent = self._forward(ids, attn, mask, seqs[mb[0]].sampling_key, True, kw)
                # (the backward below recomputes the checkpointed layers from what the forward saved)
                if defer:  # this forward is the old policy's (Batch.deferred): its values, detached
                    old_lp = logp.detach()
                    ref_lp = old_lp if b.ref_deferred else ref_lp
                    for r, i in enumerate(mb):
                        b.old[i] = old_lp[r, : len(seqs[i].ids) - 1].clone()
                        if b.ref_deferred:
                            b.ref[i] = b.old[i]
                    b.deferred.difference_update(mb)
                weights = truncated_is_weights(old_lp, blogp, mask, tc.tis_cap, self.level) if tc.tis_cap else None
                pg, met = policy_loss(logp, old_lp, torch.stack([adv_of[i] for i in mb]), mask, level=self.level,
                                      clip_low=tc.clip_low, clip_high=tc.clip_high, agg=tc.agg, max_len=tc.max_len,
                                      num_tokens=num_tokens, num_seqs=num_seqs, weights=weights)
                k = kl_estimate(logp, ref_lp, kl_cfg.estimator, mask=mask) if ref_lp is not None else None
                loss = pg
                if in_loss:
                    loss = loss + kl_loss_term(k, logp, old_lp, mask, beta=kl_cfg.beta,
                                               weighted=kl_cfg.importance_weighted, agg=tc.agg, max_len=tc.max_len,
                                               num_tokens=num_tokens, num_seqs=num_seqs)
                # DDP averages over the ranks: scaled by N, the average is the sum of the shares
                (loss * world if world > 1 else loss).backward()
            m_tokens = float(mask.sum())
            seen += m_tokens
            tot["loss"] += float(loss.detach())
            tot["policy_loss"] += float(pg.detach())
            tot["kl"] += float(k.detach().sum()) if k is not None else float("nan")
            tot["entropy"] += float((ent * mask).sum())
            tot["clip_frac"] += met["clip_frac"] * m_tokens
            r_min, r_max = min(r_min, met["ratio_min"]), max(r_max, met["ratio_max"])
            r_sum += met["ratio_mean"] * m_tokens
            if measure_mismatch and all(seqs[i].policy_version == self.version for i in mb):
                d = (logp.detach() - blogp).abs()[mask.bool()]
                mis_sum, mis_n = mis_sum + float(d.sum()), mis_n + d.numel()
                mis_max = max(mis_max, float(d.max())) if d.numel() else mis_max
        if n_idle:
            pad = [min(active, key=lambda i: len(seqs[i].ids))]  # the shortest: the cheapest pass
            for _ in range(n_idle):
                ids, attn, mask, _ = pad_batch(seqs, pad, self.pad_id)
                logp, _ = self._forward(ids, attn, mask, seqs[pad[0]].sampling_key, False, self._prefix_kw(seqs, pad))
                (logp.sum() * 0.0).backward()
        if had_deferred and not b.deferred and b.mismatch is None:  # the whole batch's, now that old is complete
            b.mismatch = self._mismatch(seqs, b.old)
        if self.fsdp is not None and active:  # the LoRA weights are replicated: DDP's all-reduce, by hand
            from tasks.train.distributed import average_gradients

            average_gradients(self.params, self.dist)
        if self.dist.world_size > 1:  # the whole mini-batch's sums, minima and maxima on every rank
            tot, seen, r_sum, mis_sum, mis_n, r_min, r_max, mis_max = self._reduce_metrics(
                tot, seen, r_sum, mis_sum, mis_n, r_min, r_max, mis_max)
        for key in ("kl", "entropy", "clip_frac"):  # token means over the sequences trained on
            tot[key] = tot[key] / seen if seen else (float("nan") if key == "kl" else 0.0)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, tc.max_grad_norm)) if active else 0.0
        if not math.isfinite(grad_norm):
            raise FloatingPointError(f"train step {self.version + 1}: gradient norm is {grad_norm}")
        if active:
            self.opt.step()
        sampled = min(seqs[i].policy_version for i in idx)
        staleness = self.version - sampled  # versions the trainer is ahead of the sampler
        self.version += 1
        dt = time.perf_counter() - t0
        if b.mismatch is not None:
            mismatch = b.mismatch
        elif mis_n:
            mismatch = {"mean": mis_sum / mis_n, "max": mis_max}
        else:
            mismatch = {"mean": float("nan"), "max": float("nan")}
        gids = [b.plan.group_ids[i] for i in idx]
        row = {"step": self.version, "epoch": b.epoch, "ppo_epoch": ppo_epoch, "batch_index": batch_index, **tot,
               "kl_penalty": penalty, "ratio_min": r_min if seen else 1.0, "ratio_mean": r_sum / seen if seen else 1.0,
               "ratio_max": r_max if seen else 1.0, "grad_norm": grad_norm,
               "reward_mean": float(b.rewards[idx].mean()), "zero_adv_frac": zero_signal_fraction(adv, gids),
               "lr": tc.lr, "tokens": int(seen), "sequences": len(idx), "policy_version_sampled": sampled,
               "staleness": staleness, "logp_mismatch_mean": mismatch["mean"], "logp_mismatch_max": mismatch["max"],
               "sync_max_abs_logp_diff": b.sync_diff, "dropped": json.dumps(b.dropped, sort_keys=True)}
        self.log(f"train step {self.version} ({self._batch_label(b, ppo_epoch, batch_index)}): loss {tot['loss']:.4f} "
                 f"kl {'off' if kl_cfg.beta == 0 else format(tot['kl'], '.5f')} clip {tot['clip_frac']:.3f} "
                 f"ratio [{row['ratio_min']:.3f}, {row['ratio_max']:.3f}] grad {grad_norm:.3f} staleness {staleness} "
                 f"({dt:.1f} s)")
        return row, {"step": self.version, "seconds": dt, "tokens_per_s": seen / dt if dt > 0 else 0.0}

    def _batch_label(self, b: Batch, ppo_epoch: int, batch_index: int) -> str:
        """Where a step sits, as its log line says it: ``iteration N`` (1-based, as the online
        loop's own line counts) in online mode, ``epoch N`` in frozen mode (0-based, as the
        ``train_steps`` row's ``epoch``), then the PPO epoch when there are several, then the
        mini-batch."""
        where = f"iteration {b.epoch + 1}" if self.tc.mode == "online" else f"epoch {b.epoch}"
        ppo = f", ppo epoch {ppo_epoch}" if self.tc.ppo_epochs > 1 else ""
        return f"{where}{ppo}, batch {batch_index}"

    def _forward(self, ids: Any, attn: Any, mask: Any, key: tuple[float, int, float], with_entropy: bool,
                 kw: dict[str, Any], train: bool = True) -> tuple[Any, Any]:
        """:func:`sequence_logprobs` of the policy: under several processes through FSDP's root module
        (always) or DDP's (for a training forward, ``train``)."""
        ids, attn = ids.to(self.device), attn.to(self.device)
        kw = {**kw, "chunk_tokens": self.tc.chunk_tokens}
        if self.fsdp is not None:
            return self.fsdp(ids, attn, mask, key, self.ac, with_entropy, kw)
        if self.ddp is not None and train:
            return self.ddp(ids, attn, mask, key, self.ac, with_entropy, kw)
        return sequence_logprobs(self.model, ids, attn, mask, key, self.ac, with_entropy=with_entropy, **kw)

    def _reduce_metrics(self, tot: dict[str, float], seen: float, r_sum: float, mis_sum: float, mis_n: int,
                        r_min: float, r_max: float, mis_max: float) -> tuple[Any, ...]:
        """A step's metric sums, minima and maxima over every rank (``all_reduce`` SUM / MAX)."""
        import torch
        import torch.distributed as dist

        keys = list(tot)
        dev = self.device if dist.get_backend() == "nccl" else "cpu"
        sums = torch.tensor([tot[k] for k in keys] + [seen, r_sum, mis_sum, float(mis_n)], dtype=torch.float64,
                            device=dev)
        maxes = torch.tensor([-r_min, r_max, mis_max], dtype=torch.float64, device=dev)
        dist.all_reduce(sums, op=dist.ReduceOp.SUM)
        dist.all_reduce(maxes, op=dist.ReduceOp.MAX)
        s, m = sums.tolist(), maxes.tolist()
        out = dict(zip(keys, s[:len(keys)]))
        seen, r_sum, mis_sum, mis_n = s[len(keys):]
        return out, seen, r_sum, mis_sum, int(mis_n), -m[0], m[1], m[2]

    def inference_model(self, dtype: str) -> Any:
        """A plain copy of the current policy for sampling: the adapter merged into the weights
        (W + s * B A), cast to ``dtype``, in eval mode. Sampling from it skips the LoRA detour
        of every adapted layer; the trainer's own weights are not touched.

        Raises:
            RuntimeError: under FSDP (each rank holds a shard of the base weights)."""
        import copy

        import torch

        self._whole_base("inference_model")
        merged = copy.deepcopy(self.model)
        for n in [n for n in merged.peft_config if n != "default"]:
            merged.delete_adapter(n)
        merged.set_adapter("default")
        plain = merged.merge_and_unload()
        return plain.to(getattr(torch, dtype)).eval()

    def merged_state(self, dtype: str) -> dict[str, Any]:
        """The current policy's weights with the adapter merged, as a transformers state dict
        (``{name: tensor}`` in ``dtype``, names as the base model's checkpoint has them), only for
        the modules the adapter changes: what a weight sync sends to a sampling engine.

        Merged in float32 (W + (alpha / r) B A) and cast once.

        Raises:
            RuntimeError: under FSDP (each rank holds a shard of the base weights)."""
        import torch

        self._whole_base("merged_state")

        out: dict[str, Any] = {}
        scale_cache: dict[str, float] = {}
        with torch.no_grad():
            for name, module in self.model.named_modules():
                if not hasattr(module, "lora_A") or "default" not in getattr(module, "lora_A", {}):
                    continue
                base_w = module.get_base_layer().weight
                a, bw = module.lora_A["default"].weight, module.lora_B["default"].weight
                s = scale_cache.setdefault(name, float(module.scaling["default"]))
                w = base_w.float() + s * (bw.float() @ a.float())
                key = name.split("base_model.model.", 1)[-1] + ".weight"
                out[key] = w.to(getattr(torch, dtype)).contiguous()
        return out

    def adapter_state(self) -> dict[str, Any]:
        """The current adapter's LoRA factors, what an adapter-only weight sync sends
        (``policy.vllm.lora: delta``; :meth:`tasks.rollout.engines.vllm_engine.VLLMPolicy.load_adapter`):
        ``{peft name: float32 tensor}`` (``...q_proj.lora_A.weight`` (r, in), ``...lora_B.weight``
        (out, r)), detached copies of the ``default`` adapter's weights. Multiply by
        :meth:`adapter_scale` to get the update ``s B A``.

        Raises:
            RuntimeError: under FSDP (each rank holds a shard)."""
        import torch
        from peft import get_peft_model_state_dict

        self._whole_base("adapter_state")
        with torch.no_grad():
            state = get_peft_model_state_dict(self.model, adapter_name="default")
            return {k: v.detach().to(torch.float32).clone() for k, v in state.items() if ".lora_" in k}

    def adapter_scale(self) -> float:
        """peft's scaling of the ``default`` adapter (``lora_alpha / r``; ``/ sqrt(r)`` with rsLoRA).

        Raises:
            RuntimeError: modules with different scalings (one number cannot express them)."""
        scales = {float(m.scaling["default"]) for m in self.model.modules()
                  if hasattr(m, "lora_A") and isinstance(getattr(m, "scaling", None), dict) and "default" in m.scaling}
        if len(scales) != 1:
            raise RuntimeError(f"Trainer.adapter_scale: the adapter's modules have scalings {sorted(scales)}")
        return scales.pop()

    @contextlib.contextmanager
    def adapter_swapped(self, state: dict[str, Any]) -> Iterator[None]:
        """Within the block, the ``default`` adapter's factors are ``state`` (names and shapes as
        :meth:`adapter_state`); restored exactly afterwards, even on an error (the sync canary
        scores its probe adapter this way). Draws no random numbers.

        Raises:
            KeyError: a name in ``state`` the adapter does not have."""
        import torch
        from peft import set_peft_model_state_dict

        saved = self.adapter_state()
        missing = sorted(set(state) - set(saved))
        if missing:
            raise KeyError(f"Trainer.adapter_swapped: no adapter weight {missing[0]!r}")
        with torch.no_grad():
            set_peft_model_state_dict(self.model, {**saved, **state}, adapter_name="default")
        try:
            yield
        finally:
            with torch.no_grad():
                set_peft_model_state_dict(self.model, saved, adapter_name="default")

    def _whole_base(self, what: str) -> None:
        if self.fsdp is not None:
            raise RuntimeError(f"Trainer.{what}: the base weights are sharded over the ranks "
                               "(train.distributed.fsdp); a whole-model copy is not built")

    # ---- state ----------------------------------------------------------------------------------
    def rng_state(self) -> dict[str, Any]:
        """Every random stream a step draws from, as this process holds it now: ``cpu`` (torch's
        CPU generator: LoRA dropout on the CPU) and ``cuda`` (every CUDA device's generator, when
        the policy runs on ``cuda``; else None). Under N > 1 processes every rank must call it at
        the same point (each rank's streams are gathered): ``ranks`` holds them by rank."""
        import torch

        from tasks.train.distributed import gather_dict

        mine = {"cpu": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if self.device == "cuda" else None}
        if self.dist.world_size == 1:
            return mine
        ranks = gather_dict({self.dist.rank: mine}, self.dist)
        return {**mine, "ranks": [ranks[r] for r in range(self.dist.world_size)]}

    def restore_rng(self, st: dict[str, Any]) -> None:
        """Put back the random streams of a saved state (:meth:`state`), this rank's own when the
        state holds every rank's. Called when the resumed run stands where the saved one stood
        (after a frozen epoch's batch is rebuilt: its no-grad passes draw dropout masks too)."""
        import torch

        rng = st.get("rng_streams") or {"cpu": st["rng"], "cuda": None}
        ranks = rng.get("ranks")
        if ranks is not None and len(ranks) == self.dist.world_size:
            rng = ranks[self.dist.rank]
        torch.set_rng_state(rng["cpu"])
        if rng.get("cuda") is not None and self.device == "cuda":
            torch.cuda.set_rng_state_all(rng["cuda"])

    def state(self, rng: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
        """The resumable state: version, adapter, AdamW state, the random streams ``rng``
        (:meth:`rng_state`, taken now when None; ``rng`` in the state: the CPU one, kept for older
        readers) and ``extra``. Under N > 1 processes pass ``rng``, which every rank took."""
        from peft import get_peft_model_state_dict

        rng = rng if rng is not None else self.rng_state()
        return {"version": self.version, "adapter": get_peft_model_state_dict(self.model),
                "optimizer": self.opt.state_dict(), "rng": rng["cpu"], "rng_streams": rng, **extra}

    def load(self, st: dict[str, Any]) -> None:
        """Load a saved state's adapter, AdamW state, version and random streams (call
        :meth:`restore_rng` again once the run stands where it was saved)."""
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(self.model, st["adapter"])
        self.opt.load_state_dict(st["optimizer"])
        self.restore_rng(st)
        self.version = st["version"]

    def save_adapter(self, out_dir: Path) -> Path:
        """Save the trained adapter with a byte-stable ``adapter_config.json`` (see
        :func:`normalize_adapter_config`)."""
        out_dir.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(out_dir, selected_adapters=["default"])
        normalize_adapter_config(out_dir)
        return out_dir


def normalize_adapter_config(adapter_dir: Path, base_model_id: str | None = None) -> None:
    """Make an adapter folder byte-stable, so that its SHA-256 (the trained policy's id, which
    seeds its evaluation) is a function of the weights and the config alone.

    - ``adapter_config.json``: peft writes ``target_modules`` from a Python set, whose order
      changes from process to process (string hash randomisation). Lists of strings are sorted,
      keys sorted; ``base_model_id``, when given, replaces the machine-specific base-model path.
    - peft's model card ``README.md`` is removed: it names the base model by its local path
      (``base_model: /home/<user>/.cache/...``), so the same training on another machine, or with
      the model in another folder, hashed differently and sampled its evaluation differently.
    """
    import json

    (adapter_dir / "README.md").unlink(missing_ok=True)
    path = adapter_dir / "adapter_config.json"
    conf = json.loads(path.read_text())
    for k, v in conf.items():
        if isinstance(v, list) and all(isinstance(x, str) for x in v):
            conf[k] = sorted(v)
    if base_model_id is not None:
        conf["base_model_name_or_path"] = base_model_id
    path.write_text(json.dumps(conf, indent=2, sort_keys=True) + "\n")

