"""The ``hf`` engine: transformers ``generate`` in this process.

On the CPU or CUDA, weights in ``policy.rollout_dtype`` (a LoRA adapter beside them, unmerged, by
forward hooks: :mod:`tasks.rollout.engines.hf_lora`), batched with left padding, prompts of similar
length together (:func:`plan_batches`); an episode's later turns start from its earlier turns' keys
and values (:mod:`tasks.rollout.engines.hf_prefix`). Tokens are drawn by :class:`_Sampler` from the
processed scores (temperature, top-k, top-p applied), and their log-probs read from the same
scores, so they equal :func:`tasks.train.logprobs.token_logprobs` on the same weights.
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

        from tasks.rollout.engines.hf_lora import hook_lora
        from tasks.rollout.models import contiguous_output_head, load_model_and_tokenizer

        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)
        self.cfg = cfg
        self.model, self.tokenizer = load_model_and_tokenizer(model_dir, cfg.device, cfg.rollout_dtype)
        self.adapter_sha256 = ""
        self.lora_hooks = None  # the adapter's hooks (hf_lora.LoraHooks) when they run it
        if adapter_dir is not None:
            from peft import PeftModel

            # unmerged, on purpose: merged into bf16 weights, a few steps' LoRA update is mostly
            # rounded away (94% of the weights the default run's final adapter changes round back
            # to the base value; the per-token change of log-prob against float32's has cosine
            # 0.23 merged, 0.41 unmerged). peft keeps the adapter in float32 beside the bf16 base.
            # A small update is only sampled faithfully with rollout_dtype float32.
            # The same float32 update by forward hooks, with fewer ops per layer than peft's
            # (tasks/rollout/engines/hf_lora.py); peft's own path for adapters the hooks do not cover.
            self.model, self.lora_hooks = hook_lora(PeftModel.from_pretrained(self.model, adapter_dir).eval())
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
        self.lora_hooks = None
        self.eos_id, self.pad_id = int(tokenizer.eos_token_id), int(tokenizer.pad_token_id)
        self.max_model_len = getattr(model.config, "max_position_embeddings", None)
        return self

    def generate(self, prompts: list[list[int]], sampling: SamplingSpec, seed: int, *,
                 states: list[Any] | None = None, keep_states: bool = False) -> list[Generation]:
        """Sample one completion per prompt (token-id lists), returned in the prompts' order.

        Prompts run in the batches :func:`plan_batches` cuts (at most ``cfg.batch_size`` rows,
        similar lengths together); batch ``b`` of the plan samples under seed ``seed + b``.
        Deterministic for a given (weights, prompts, sampling, seed, states) on the CPU.

        Args:
            states: per prompt, the ``Generation.state`` of the same episode's previous turn (or
                None): a batch whose every prompt extends its state's tokens prefills only the
                tokens past them (:mod:`tasks.rollout.engines.hf_prefix`).
            keep_states: return each row's keys and values as ``Generation.state`` for the next
                turn (None where the batch would keep more than ``hf_prefix.MAX_STATE_BYTES``).

        Progress: a row is reported to :func:`tasks.progress.requests_done` at the decoding step
        that samples its EOS, the batch's other rows when the batch ends.
        """
        from tasks.progress import requests_done

        out: list[Generation | None] = [None] * len(prompts)
        plan = plan_batches([len(p) for p in prompts], self.cfg.batch_size, self.cfg.batch_overhead_tokens)
        for b, rows in enumerate(plan):
            stopped = _StoppedRows(max(len(prompts[i]) for i in rows), self.eos_id, requests_done)
            batch_states = [states[i] for i in rows] if states is not None else None
            for i, g in zip(rows, self._generate_batch([prompts[i] for i in rows], sampling, seed + b, stopped,
                                                       batch_states, keep_states)):
                out[i] = g
            requests_done(len(rows) - stopped.n)
        return [g for g in out if g is not None]

    def close(self) -> None:
        """Nothing to release: the model lives in this process and goes with the object (an
        engine with a worker or connections stops them here)."""

    def _generate_batch(self, prompts: list[list[int]], sampling: SamplingSpec, seed: int,
                        stopped: "_StoppedRows | None" = None, states: list[Any] | None = None,
                        keep_states: bool = False) -> list[Generation]:
        import torch
        from transformers import GenerationConfig, LogitsProcessorList
        from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                            TopPLogitsWarper)

        from tasks.rollout.engines import hf_prefix
        from tasks.rollout.kv_cache import reserved_cache

        device = self.cfg.device
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            attn[i, width - len(p):] = 1
        # the sampler's processing is ours (the transformers warpers, in transformers' order), and
        # so is the draw (:class:`_Sampler`, last): generate runs greedy over what it returns, and no
        # [T, B, V] stack of scores is kept
        warpers = LogitsProcessorList()
        if sampling.temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(sampling.temperature))
        if sampling.top_k:
            warpers.append(TopKLogitsWarper(sampling.top_k))
        if sampling.top_p < 1.0:
            warpers.append(TopPLogitsWarper(sampling.top_p))
        if stopped is not None:  # reads the tokens drawn so far; the scores pass unchanged
            warpers.append(stopped)
        generator = torch.Generator(device=device).manual_seed(seed)
        sampler = _Sampler(generator)
        warpers.append(sampler)
        gen_cfg = GenerationConfig(
            # greedy over what the sampler returns (its draw: 0 there, -inf elsewhere, so even a
            # model config that turns sampling back on draws the same token); transformers' own
            # warpers stay off (the ones above do the processing)
            do_sample=False, temperature=1.0, top_k=None, top_p=1.0,
            min_p=None, typical_p=1.0, repetition_penalty=1.0, max_new_tokens=sampling.max_new_tokens,
            eos_token_id=self.eos_id, pad_token_id=self.pad_id, return_dict_in_generate=True,
        )
        torch.manual_seed(seed)  # nothing else in generate draws; kept so that nothing depends on earlier calls
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                ids, attn = ids.to(device), attn.to(device)
                cache = reserved = None
                # a model whose generation config names its own cache (static, ...) keeps it: generate
                # refuses a cache object beside one
                if getattr(getattr(self.model, "generation_config", None), "cache_implementation", None) is None:
                    # room for 64 new tokens at first, doubled when full up to the most the batch can need:
                    # a batch whose rows all stop early never holds max_new_tokens positions per row
                    # (1.5 GB for 128 rows x 512 on SmolLM2)
                    reserved = reserved_cache(self.model.config,
                                              width + min(sampling.max_new_tokens, RESERVE_NEW_TOKENS),
                                              limit=width + sampling.max_new_tokens)
                    # the episodes' earlier turns from their states (a reserved cache holds every
                    # position), else each distinct prompt once
                    columns = hf_prefix.usable(prompts, states) if reserved is not None else 0
                    cache = (hf_prefix.fill(reserved, prompts, states, columns) if columns  # type: ignore[arg-type]
                             else self._shared_prompt_cache(ids, attn, reserved))
                res = self.model.generate(input_ids=ids, attention_mask=attn, generation_config=gen_cfg,
                                          logits_processor=warpers, cache=cache)
                seqs = res.sequences[:, width:].cpu()
                rows = [trim_completion(seqs[i].tolist(), [], self.eos_id)[0] for i in range(len(prompts))]
                kept = (hf_prefix.keep(reserved, prompts, rows, seqs.shape[1]) if keep_states and reserved is not None
                        else [None] * len(prompts))
        finally:
            self.model.train(was_training)
        logp_all = sampler.logprobs(seqs)  # [B, T]
        del res, cache, reserved
        gens = []
        for i in range(len(prompts)):
            toks, lps, finish = trim_completion(seqs[i].tolist(), logp_all[i].tolist(), self.eos_id)
            gens.append(Generation(token_ids=toks, logprobs=lps, finish_reason=finish,
                                   text=self.tokenizer.decode(toks, skip_special_tokens=True), state=kept[i]))
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


class _Sampler:
    """A logits processor, last in the list, that draws each row's next token from its processed
    scores (:func:`sample_tokens`) and keeps that token's log-probability; ``generate`` runs greedy
    and picks it (the returned scores are 0 there, ``-inf`` elsewhere).

    Holds one ``[B, V]`` step at a time (``output_scores`` would keep all ``T`` steps: 1.6 GB for
    128 x 64 tokens of a 49,152-token vocabulary).
    """

    def __init__(self, generator: Any) -> None:
        self.generator = generator
        self.cols: list[Any] = []  # per step, [B] float32 log-probs of the drawn tokens

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        logp = torch.log_softmax(scores.float(), dim=-1)
        tokens = sample_tokens(logp, self.generator)
        self.cols.append(logp.gather(-1, tokens[:, None]).squeeze(-1).cpu())
        picked = torch.full_like(scores, float("-inf"))
        picked.scatter_(-1, tokens[:, None], 0.0)
        return picked

    def logprobs(self, generated: Any) -> Any:
        """``[B, T]`` float32 log-probs of ``generated`` (``[B, T]``, the new tokens); steps the
        sampler ran past the end (undone by ``generate``) are dropped."""
        import torch

        cols = self.cols[:generated.shape[1]]
        return torch.stack(cols, dim=1) if cols else torch.zeros((generated.shape[0], 0))


#: tokens per block of :func:`sample_tokens`' first race
SAMPLE_BLOCK = 256


def sample_tokens(logp: Any, generator: Any, block: int = SAMPLE_BLOCK) -> Any:
    """One token per row drawn from ``exp(logp)``, exactly, with ``ceil(V / block) + block``
    exponential variates per row instead of ``V``.

    ``torch.multinomial`` draws one sample as an exponential race over the whole vocabulary
    (the token with the largest ``p_i / E_i``, ``E_i ~ Exp(1)``): ``V`` variates per row (49,152 for
    SmolLM2), which cost more than the rest of a decoding step on the CPU. The race runs here in
    two rounds: first over blocks of ``block`` consecutive tokens, each with its mass ``P_b``
    (the largest ``P_b / E_b``), then over the winning block's tokens. The block wins with
    probability ``P_b``, a token within it with ``p_i / P_b``: ``p_i`` in all. A race, unlike a
    draw by the cumulative sum, moves to another token only when the two leading ``p / E`` nearly
    tie, so probabilities that differ in the last bits (another CPU's kernels) rarely change the
    draw. A token with ``logp`` ``-inf`` (cut by top-k/top-p) is never drawn.

    Args:
        logp: ``[B, V]`` float32 log-probabilities (each row's ``exp`` sums to 1).
        generator: a ``torch.Generator`` on ``logp``'s device; the variates come from it alone.
        block: tokens per block, >= 1.

    Returns:
        ``[B]`` long token ids. Deterministic for a given ``generator`` state and ``logp``.

    Raises:
        ValueError: ``block`` < 1.
    """
    import torch

    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    rows, v = logp.shape
    blocks = -(-v // block)
    p = logp.exp()
    if blocks * block != v:
        p = torch.nn.functional.pad(p, (0, blocks * block - v))
    mass = p.view(rows, blocks, block).sum(-1).double()  # [B, blocks]
    race = torch.empty((rows, blocks), dtype=torch.float64, device=logp.device).exponential_(generator=generator)
    first = (mass / race).argmax(-1) * block  # [B]: the winning block's first token
    idx = first[:, None] + torch.arange(block, device=logp.device)  # [B, block]
    inside = logp.gather(-1, idx.clamp(max=v - 1)).double().masked_fill(idx >= v, float("-inf"))
    race = torch.empty((rows, block), dtype=torch.float64, device=logp.device).exponential_(generator=generator)
    return first + (inside - race.log()).argmax(-1)
