"""Forward passes of the trainer: padding a set of sequences, log-probs of their policy tokens,
and the shared-prompt computation that runs each distinct first prompt once.

Every function here is shape-level plumbing with no RL choice in it; the objectives live in
``losses``, ``kl`` and ``advantages``.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

from tasks.config.train import DEFAULT_LOGPROB_CHUNK_TOKENS
from tasks.train.sequences import TrainSequence


@contextlib.contextmanager
def layer_checkpointing(model: Any, on: bool = True) -> Iterator[int]:
    """Within the block, every decoder layer of ``model`` (a transformers model, or a peft model
    around one) that is not already checkpointed runs its forward under
    ``torch.utils.checkpoint`` (non-reentrant, RNG state preserved: dropout masks are replayed):
    a training forward keeps only each layer's input for the backward pass, which recomputes the
    layer. The same values and gradients as without. On exit the layers are as they were (a model
    with ``gradient_checkpointing_enable`` stays checkpointed). ``on`` False: nothing changes.

    Yields:
        the number of layers switched on (0 when ``on`` is False or all were already on).

    Raises:
        ValueError: ``on`` and ``model`` has no checkpointable decoder layer.
    """
    if not on:
        yield 0
        return
    import functools

    from torch.utils.checkpoint import checkpoint
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no checkpointable decoder layer (GradientCheckpointingLayer)")
    off = [m for m in layers if not m.gradient_checkpointing]
    saved = [(m, m.__dict__.get("_gradient_checkpointing_func")) for m in off]
    fn = functools.partial(checkpoint, use_reentrant=False)
    for m in off:
        m._gradient_checkpointing_func = fn
        m.gradient_checkpointing = True
    try:
        yield len(off)
    finally:
        for m, f in saved:
            m.gradient_checkpointing = False
            if f is None:
                m.__dict__.pop("_gradient_checkpointing_func", None)
            else:
                m._gradient_checkpointing_func = f


def prefix_len(s: TrainSequence) -> int:
    """Length of a sequence's first prompt: the tokens before its first policy token."""
    return s.mask.index(1) if 1 in s.mask else len(s.ids)


def micro_batches(seqs: list[TrainSequence], micro: int | None, tokens: int | None = None) -> list[list[int]]:
    """Micro-batches of indices into ``seqs``: one sampling setting per micro-batch, the samples
    of one prompt side by side (their prompt is then computed once), ordered by length so that
    little padding is computed. In that order a micro-batch takes sequences while it holds at
    most ``micro`` of them (None: no count limit) and its padded size, rows x longest row, stays
    within ``tokens`` (None: no token limit); a sequence longer than ``tokens`` forms a
    micro-batch of its own. The accumulated gradient does not depend on how sequences are
    grouped: every micro-batch uses the mini-batch's global denominators.

    Raises:
        ValueError: ``micro`` or ``tokens`` < 1.
    """
    if micro is not None and micro < 1:
        raise ValueError(f"micro-batch size must be >= 1 sequence, got {micro}")
    if tokens is not None and tokens < 1:
        raise ValueError(f"micro-batch token budget must be >= 1, got {tokens}")
    by_key: dict[tuple[float, int, float], list[int]] = {}
    for i, s in enumerate(seqs):
        by_key.setdefault(s.sampling_key, []).append(i)
    out: list[list[int]] = []
    for key in sorted(by_key):
        first = {i: tuple(seqs[i].ids[: prefix_len(seqs[i])]) for i in by_key[key]}
        longest: dict[tuple[int, ...], int] = {}
        for i in by_key[key]:
            longest.setdefault(first[i], len(seqs[i].ids))
        idx = sorted(by_key[key], key=lambda i: (longest[first[i]], first[i], len(seqs[i].ids), i))
        cur: list[int] = []
        width = 0
        for i in idx:
            w = max(width, len(seqs[i].ids))
            full = (micro is not None and len(cur) + 1 > micro) or (tokens is not None and (len(cur) + 1) * w > tokens)
            if cur and full:
                out.append(cur)
                cur, w = [], len(seqs[i].ids)
            cur.append(i)
            width = w
        if cur:
            out.append(cur)
    return out


def pad_batch(seqs: list[TrainSequence], idx: list[int], pad_id: int) -> tuple[Any, Any, Any, Any]:
    """Right-padded tensors for ``seqs[i] for i in idx``: ``(ids [B, L] long, attention [B, L]
    long, target mask [B, L-1] float32, behaviour log-probs [B, L-1] float32)``; target position
    p predicts ``ids[:, p + 1]``."""
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
    return ids, attn, mask[:, 1:], blogp[:, 1:]


def hidden_shared_prefix(decoder: Any, ids: Any, attn: Any, sel: Any, prefix_lens: list[int], pad_id: int) -> Any:
    """Final hidden states ``[N, H]`` at the selected target positions (``sel`` ``[B, L-1]``
    bool), computing each distinct first prompt once: the G samples of a GRPO group share their
    prompt, so its keys and values are computed for one row and gathered for the others (the
    gather is differentiable, so the gradient through the prompt is the same as without
    sharing). Prompts are left-padded, completions right-padded; position ids are the true
    positions.
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
    cache = out_p.cache
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
                    position_ids=f[:, None] + torch.arange(s_len, device=dev)[None], cache=cache,
                    use_cache=True)
    # hid[:, u] is the hidden state at full position prefix_len - 1 + u
    hid = torch.cat([out_p.last_hidden_state[:, -1][j][:, None], out_s.last_hidden_state], 1)
    rows, qs = sel.nonzero(as_tuple=True)
    return hid[rows.to(dev), (qs.to(dev) - (f[rows.to(dev)] - 1))]


def sequence_logprobs(model: Any, ids: Any, attn: Any, mask: Any, key: tuple[float, int, float],
                      autocast_ctx: Callable[[], Any], with_entropy: bool = False, *,
                      prefix_lens: list[int] | None = None, pad_id: int = 0,
                      chunk_tokens: int = DEFAULT_LOGPROB_CHUNK_TOKENS) -> tuple[Any, Any]:
    """``[B, L-1]`` float32 log-probs of ``ids[:, 1:]`` under the sampler's processed
    distribution ``key`` = (temperature, top_k, top_p) (and entropies, nats), computed only where
    ``mask`` is 1; exactly 0 elsewhere.

    The output projection (hidden -> vocabulary) and the logit processing run only at the masked
    positions: prompt, observation and padding positions never need logits, and on multi-turn
    episodes they are most of the sequence. With ``prefix_lens`` each distinct first prompt is
    run once (:func:`hidden_shared_prefix`).

    ``chunk_tokens`` > 0: the projection, the processing and the entropy run ``chunk_tokens``
    policy tokens at a time (:func:`tasks.train.logprobs.chunked_logprobs`, recomputed chunk by
    chunk in the backward pass), so memory beyond the decoder's activations is bounded by one
    chunk's ``[chunk_tokens, V]`` logits, whatever the micro-batch; 0: all ``N`` selected
    positions at once (``[N, V]`` float32 logits, several copies kept for the backward pass), the
    path before chunking, kept for comparison (equal to rounding).

    Raises:
        ValueError: ``chunk_tokens`` < 0.
    """
    import torch

    from tasks.train.logprobs import chunked_logprobs, entropy_from_logits, token_logprobs

    if chunk_tokens < 0:
        raise ValueError(f"chunk_tokens must be >= 0 (0: unchunked), got {chunk_tokens}")
    temperature, top_k, top_p = key
    sel = mask.bool()  # [B, L-1]
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = inner.get_output_embeddings()
    with autocast_ctx():
        if prefix_lens is None:
            hidden = inner.get_decoder()(input_ids=ids, attention_mask=attn).last_hidden_state[:, :-1]  # [B, L-1, H]
            hidden = hidden[sel.to(hidden.device)]
        else:
            hidden = hidden_shared_prefix(inner.get_decoder(), ids, attn, sel, prefix_lens, pad_id)
    targets = ids[:, 1:][sel.to(ids.device)]
    proc = {"temperature": temperature, "top_k": top_k or None, "top_p": top_p if top_p < 1.0 else None}
    if chunk_tokens:
        lp, e = chunked_logprobs(hidden, head, targets, chunk=chunk_tokens, with_entropy=with_entropy,
                                 autocast_ctx=autocast_ctx, **proc)
    else:  # the whole [N, V] at once
        with autocast_ctx():
            logits = head(hidden)  # [N, V]
        lp = token_logprobs(logits, targets, **proc)
        e = None
        if with_entropy:
            with torch.no_grad():
                e = entropy_from_logits(logits.detach(), temperature=temperature)
    where = sel.nonzero(as_tuple=True)
    logp = torch.zeros(sel.shape, dtype=torch.float32).index_put(where, lp.cpu())
    ent = torch.zeros(sel.shape, dtype=torch.float32).index_put(where, e.cpu()) if with_entropy else None
    return logp, ent
