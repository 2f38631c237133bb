"""The ``hf`` engine: transformers ``generate`` in this process.

On the CPU or CUDA, weights in ``policy.rollout_dtype`` (a LoRA adapter beside them, unmerged),
batched with left padding, prompts of similar length together (:func:`plan_batches`). Log-probs are
read from the processed scores the sampler drew from (temperature, top-k, top-p applied), so they
equal :func:`tasks.train.logprobs.token_logprobs` on the same weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tasks.config import PolicyConfig
from tasks.harnesses.spec import SamplingSpec
from tasks.hashing import sha256_dir
from tasks.rollout.generation import Generation, trim_completion


#: new-token positions each KV-cache layer reserves at first (tasks/rollout/kv_cache.py doubles it)
RESERVE_NEW_TOKENS = 64


class HFPolicy:
    """A transformers causal LM, optionally with a LoRA adapter, as a rollout policy.

    Args:
        model_dir: transformers model folder (see :func:`tasks.rollout.models.resolve_model`).
        cfg: the run's policy config (device, autocast dtype, batch size).
        adapter_dir: a peft adapter folder (kept unmerged, in float32), or None for the base
            model.
        base_model_id: id of the base model (recorded in every episode's ``policy_id``).
    """

    def __init__(self, model_dir: Path, cfg: PolicyConfig, *, base_model_id: str, adapter_dir: Path | None = None):
        import torch

        from tasks.rollout.models import contiguous_output_head, load_model_and_tokenizer

        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)
        self.cfg = cfg
        self.model, self.tokenizer = load_model_and_tokenizer(model_dir, cfg.device, cfg.rollout_dtype)
        self.adapter_sha256 = ""
        if adapter_dir is not None:
            from peft import PeftModel

            # unmerged, on purpose: merged into bf16 weights, a few steps' LoRA update is mostly
            # rounded away (94% of the weights the default run's final adapter changes round back
            # to the base value; the per-token change of log-prob against float32's has cosine
            # 0.23 merged, 0.41 unmerged). peft keeps the adapter in float32 beside the bf16 base.
            # A small update is only sampled faithfully with rollout_dtype float32.
            self.model = PeftModel.from_pretrained(self.model, adapter_dir).eval()
            contiguous_output_head(self.model)  # the frozen base weights: see the function
            self.adapter_sha256 = sha256_dir(adapter_dir)
        self.base_model_id = base_model_id
        self.policy_id = f"{base_model_id}+{self.adapter_sha256[:12]}" if self.adapter_sha256 else base_model_id
        self.eos_id = int(self.tokenizer.eos_token_id)
        self.pad_id = int(self.tokenizer.pad_token_id)
        # tokens of prompt + completion the model's positions cover (the harness stops before it)
        self.max_model_len = getattr(self.model.config, "max_position_embeddings", None)

    @classmethod
    def from_model(cls, model: Any, tokenizer: Any, cfg: PolicyConfig, *, policy_id: str) -> "HFPolicy":
        """Wrap a model already in memory (a merged copy of the trainer's policy, for online
        rollouts). Generation runs in eval mode and puts the model back in its previous mode."""
        from tasks.rollout.models import contiguous_output_head

        self = cls.__new__(cls)
        self.cfg, self.model, self.tokenizer = cfg, contiguous_output_head(model), tokenizer
        self.adapter_sha256, self.base_model_id, self.policy_id = "", policy_id, policy_id
        self.eos_id, self.pad_id = int(tokenizer.eos_token_id), int(tokenizer.pad_token_id)
        self.max_model_len = getattr(model.config, "max_position_embeddings", None)
        return self

    def generate(self, prompts: list[list[int]], sampling: SamplingSpec, seed: int) -> list[Generation]:
        """Sample one completion per prompt (token-id lists), returned in the prompts' order.

        Prompts run in the batches :func:`plan_batches` cuts (at most ``cfg.batch_size`` rows,
        similar lengths together); batch ``b`` of the plan samples under seed ``seed + b``.
        Deterministic for a given (weights, prompts, sampling, seed) on the CPU.

        Progress: a row is reported to :func:`tasks.progress.requests_done` at the decoding step
        that samples its EOS, the batch's other rows when the batch ends.
        """
        from tasks.progress import requests_done

        out: list[Generation | None] = [None] * len(prompts)
        plan = plan_batches([len(p) for p in prompts], self.cfg.batch_size, self.cfg.batch_overhead_tokens)
        for b, rows in enumerate(plan):
            stopped = _StoppedRows(max(len(prompts[i]) for i in rows), self.eos_id, requests_done)
            for i, g in zip(rows, self._generate_batch([prompts[i] for i in rows], sampling, seed + b, stopped)):
                out[i] = g
            requests_done(len(rows) - stopped.n)
        return [g for g in out if g is not None]

    def close(self) -> None:
        """Nothing to release: the model lives in this process and goes with the object (an
        engine with a worker or connections stops them here)."""

    def _generate_batch(self, prompts: list[list[int]], sampling: SamplingSpec, seed: int,
                        stopped: "_StoppedRows | None" = None) -> list[Generation]:
        import torch
        from transformers import GenerationConfig, LogitsProcessorList
        from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                            TopPLogitsWarper)

        from tasks.rollout.kv_cache import reserved_cache

        device = self.cfg.device
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            attn[i, width - len(p):] = 1
        # the sampler's processing is ours (the transformers warpers, in transformers' order), with
        # a recorder last: generate itself applies none, and no [T, B, V] stack of scores is kept
        warpers = LogitsProcessorList()
        if sampling.temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(sampling.temperature))
        if sampling.top_k:
            warpers.append(TopKLogitsWarper(sampling.top_k))
        if sampling.top_p < 1.0:
            warpers.append(TopPLogitsWarper(sampling.top_p))
        if stopped is not None:  # reads the tokens drawn so far; the scores pass unchanged
            warpers.append(stopped)
        recorder = _LogprobRecorder()
        warpers.append(recorder)
        gen_cfg = GenerationConfig(
            # top_k=0 / top_p=1.0 / temperature=1.0 switch transformers' own warpers off (the ones
            # above do the processing); None would mean transformers' default top_k=50
            do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
            min_p=None, typical_p=1.0, repetition_penalty=1.0, max_new_tokens=sampling.max_new_tokens,
            eos_token_id=self.eos_id, pad_token_id=self.pad_id, return_dict_in_generate=True,
        )
        torch.manual_seed(seed)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                ids, attn = ids.to(device), attn.to(device)
                cache = None
                # a model whose generation config names its own cache (static, ...) keeps it: generate
                # refuses a cache object beside one
                if getattr(getattr(self.model, "generation_config", None), "cache_implementation", None) is None:
                    # room for 64 new tokens at first, doubled when full up to the most the batch can need:
                    # a batch whose rows all stop early never holds max_new_tokens positions per row
                    # (1.5 GB for 128 rows x 512 on SmolLM2)
                    cache = self._shared_prompt_cache(ids, attn, reserved_cache(
                        self.model.config, width + min(sampling.max_new_tokens, RESERVE_NEW_TOKENS),
                        limit=width + sampling.max_new_tokens))
                res = self.model.generate(input_ids=ids, attention_mask=attn, generation_config=gen_cfg,
                                          logits_processor=warpers, cache=cache)
        finally:
            self.model.train(was_training)
        seqs = res.sequences[:, width:].cpu()
        logp_all = recorder.logprobs(seqs)  # [B, T]
        del res
        gens = []
        for i in range(len(prompts)):
            toks, lps, finish = trim_completion(seqs[i].tolist(), logp_all[i].tolist(), self.eos_id)
            gens.append(Generation(token_ids=toks, logprobs=lps, finish_reason=finish,
                                   text=self.tokenizer.decode(toks, skip_special_tokens=True)))
        return gens

    def _shared_prompt_cache(self, ids: Any, attn: Any, cache: Any = None) -> Any:
        """``cache`` filled with the batch's prompts but their last column, computed once per
        distinct prompt and gathered to every row; ``cache`` itself, empty, when no two rows
        share a prompt or the prompts are one column wide (``generate`` then prefills it).

        Why: the G samples of a group share their prompt, so ``generate``'s prefill would
        compute it G times (``benchmarks/train_step.py`` samples 16 prompts x 8: 128 prefill
        rows for 16 prompts). ``generate`` runs the last column itself, so the first sampled
        token and every later one condition on the same prompt states. Position ids are ``generate``'s own
        (attention-mask cumsum, 0 on padding), so the rows' states equal those of the full
        prefill up to the matmul's blocking (the tests compare the sampled tokens and log-probs).

        Args:
            ids: ``[B, W]`` long, left-padded prompts on the model's device.
            attn: ``[B, W]`` long, 1 on prompt tokens.
            cache: an empty transformers ``Cache`` to fill (:func:`tasks.rollout.kv_cache.
                reserved_cache`), or None for the model's default.
        """
        import torch

        if ids.shape[1] < 2:
            return cache
        # a prompt is its padded ids with its mask: a prompt that starts with the pad id pads like a
        # shorter one, and must not take that one's cache
        first: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}  # prompt -> its first row
        rows = [first.setdefault((tuple(r), tuple(a)), i) for i, (r, a) in enumerate(zip(ids.tolist(), attn.tolist()))]
        if len(first) == len(rows):
            return cache
        number = {row: j for j, row in enumerate(first.values())}  # prompt j's first row -> j
        pick = torch.tensor(list(number), device=ids.device)
        rows = [number[r] for r in rows]  # each row's prompt j
        u_ids, u_attn = ids[pick, :-1], attn[pick, :-1]
        pos = (u_attn.cumsum(-1) - 1).masked_fill(u_attn == 0, 0)
        cache = self.model(input_ids=u_ids, attention_mask=u_attn, position_ids=pos, cache=cache, use_cache=True,
                           logits_to_keep=1).cache
        cache.batch_select_indices(torch.tensor(rows, device=ids.device))
        return cache


def plan_batches(lengths: list[int], max_rows: int, overhead_tokens: int) -> list[list[int]]:
    """Cut prompts into left-padded generation batches, similar lengths together.

    A batch of ``r`` prompts, the longest ``w`` tokens, costs ``r * w`` padded prompt tokens in
    prefill and in every decode step's attention, plus a fixed cost per batch (one more decode
    loop of ``max_new_tokens`` steps) worth ``overhead_tokens`` padded tokens. The prompts are
    sorted by length (ties by position) and cut into contiguous runs of at most ``max_rows``
    that minimise ``sum(r * w) + overhead_tokens * batches``, exactly (dynamic programming,
    O(n * max_rows)). Why: one long prompt in a batch of short ones pads every row to its length
    (a multi-turn episode with a 600-character observation made 27 turn-2 prompts of 109-259
    tokens pad to 764: 4.3x the real tokens).

    Args:
        lengths: ``[n]`` prompt lengths in tokens, in the caller's order.
        max_rows: most prompts per batch (``policy.batch_size``), >= 1.
        overhead_tokens: the fixed cost of one batch in padded prompt tokens, >= 0 (0: every
            distinct length its own batch; a large value: batches of ``max_rows`` in length order).

    Returns:
        The batches, in ascending length, each a list of indices into ``lengths`` in ascending
        order (the rows keep the caller's order, so a plan of one batch samples exactly what the
        prompts in one unplanned batch did); every index exactly once. Deterministic.

    Raises:
        ValueError: ``max_rows`` < 1 or ``overhead_tokens`` < 0.
    """
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    if overhead_tokens < 0:
        raise ValueError(f"overhead_tokens must be >= 0, got {overhead_tokens}")
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    n = len(order)
    best = [0] + [0] * n  # best[j]: least cost of the first j sorted prompts
    cut = [0] * (n + 1)   # cut[j]: where the last batch of that plan starts
    for j in range(1, n + 1):
        width = lengths[order[j - 1]]
        best[j], cut[j] = min((best[i] + (j - i) * width + overhead_tokens, i)
                              for i in range(max(0, j - max_rows), j))
    plan, j = [], n
    while j > 0:
        plan.append(sorted(order[cut[j]:j]))  # rows in the prompts' order: see Returns
        j = cut[j]
    return plan[::-1]


class _StoppedRows:
    """A logits processor that changes nothing and calls ``report(k)`` when ``k`` more rows of the
    batch have drawn ``eos_id`` (the last column of ``input_ids``, once it is past the prompts'
    ``width``), counting them in ``n``. ``generate`` pads a finished row with the pad id, which may
    differ from EOS: a row is counted once, at its first EOS."""

    def __init__(self, width: int, eos_id: int, report: Any) -> None:
        self.width, self.eos_id, self.report, self.n = width, eos_id, report, 0
        self.stopped: Any = None

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if input_ids.shape[1] > self.width:
            now = input_ids[:, -1] == self.eos_id
            self.stopped = now if self.stopped is None else self.stopped | now
            k = int(self.stopped.sum()) - self.n
            if k > 0:
                self.n += k
                self.report(k)
        return scores


class _LogprobRecorder:
    """A logits processor, last in the list, that keeps the log-probability of each sampled token
    under the processed distribution it was drawn from, holding one ``[B, V]`` step at a time
    (``output_scores`` would keep all ``T`` steps: 1.6 GB for 128 x 64 tokens of a 49,152-token
    vocabulary). The token drawn at step t is read at step t + 1 (the last column of
    ``input_ids``); the last step's in :meth:`logprobs`."""

    def __init__(self) -> None:
        self.prev: Any = None  # [B, V] float32 log-softmax of the last step's processed scores
        self.cols: list[Any] = []  # per step, [B] float32 log-probs of the drawn tokens

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        if self.prev is not None:
            self.cols.append(self.prev.gather(-1, input_ids[:, -1:]).squeeze(-1).cpu())
        self.prev = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def logprobs(self, generated: Any) -> Any:
        """``[B, T]`` float32 log-probs of ``generated`` (``[B, T]``, the new tokens); steps the
        sampler ran past the end (undone by ``generate``) are dropped."""
        import torch

        t = generated.shape[1]
        cols = self.cols[:t]
        if len(cols) < t and self.prev is not None:
            cols.append(self.prev.gather(-1, generated[:, len(cols):len(cols) + 1].to(self.prev.device))
                        .squeeze(-1).cpu())
        self.prev = None
        return torch.stack(cols, dim=1) if cols else torch.zeros((generated.shape[0], 0))
