"""P1's log-odds check (docs/methods/p1-ceiling-mismatch.md, our reconstruction): do the trained
policy's log-odds between candidate actions track the harness's own preferences, shifted by the
value difference?

Under KL-regularised control with the harness's action preferences as the reference, the optimal
policy is pi*(a|s) proportional to pi_ref(a|s) exp(Q*(s,a)/beta), so for two actions a, b at one
state

    ell_theta(a, b) = ell_ref(a, b) + (Q*(s,a) - Q*(s,b)) / beta,
    ell(a, b)       = log pi(a|s) - log pi(b|s).

What we measure, per harness:

- States: the first-turn states of the training rollouts' sampling groups. Every (task, harness)
  group of G samples shares its turn-0 prompt (the state s); the candidate actions at s are the
  group's distinct turn-0 completions (deduplicated by token ids: identical candidates would give
  a pair with log-odds 0 by construction, so they are merged, never paired).
- Sequence log-prob of an action = the sum over its completion tokens of the per-token log-prob
  given the prompt and the earlier completion tokens (teacher forcing), in nats, summed in
  float64. Scoring uses the harness's *temperature only* (softmax(logits / T)), not its top-k /
  top-p truncation: a token the behaviour policy sampled can fall outside the trained policy's
  (or the reference's) top-k / top-p support, which would make its log-prob -inf and the log-odds
  undefined. With temperature only, every token has a finite log-prob and both policies are
  compared on the same full-support distribution. (:func:`sequence_logprobs` also accepts
  ``top_k`` / ``top_p`` for other uses.)
- pi_theta = the checkpoint (base model + LoRA adapter), pi_ref = the base model in the same
  harness (same prompt), i.e. the same peft model with its adapter disabled.
- The reward of a candidate = the mean episode reward of the group's episodes whose turn-0
  completion it is (a Monte-Carlo estimate of Q(s, a) under the behaviour policy; for single-turn
  harnesses it is the action's reward). reward_diff = r_a - r_b.
- Pairs: every unordered pair of a state's candidates, oriented a = the candidate first seen in
  sample order (sample_idx), b = the later one. Samples are i.i.d., so the orientation is random
  with respect to the candidates' content.

Summary per harness (:func:`log_odds_summary`): Pearson r and Spearman rho between ell_theta and
ell_ref ("the trained policy's log-odds track the harness's preferences"), and Pearson r between
the shift ell_theta - ell_ref and reward_diff ("the shift is (Q(a) - Q(b))/beta").
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tasks.hashing import seed_from, sha256_json
from tasks.rollout.turns import episode_prompts

Item = tuple[list[int], list[int]]
# score(items, temperature) -> one float64 sequence log-prob (nats) per (prompt ids, completion ids) item
Scorer = Callable[[list[Item], float], list[float]]


def sequence_logprobs(model: Any, tokenizer: Any, items: Sequence[Item], *, temperature: float,
                      top_k: int = 0, top_p: float = 1.0, device: str = "cpu", batch_size: int = 16) -> list[float]:
    """Sequence log-probs ``log pi(completion | prompt)`` by batched teacher forcing.

    For each ``(prompt_ids, completion_ids)`` item: the sum over completion tokens y_j of
    ``log softmax(process(logits_j))[y_j]`` where ``logits_j`` is the model's output at the
    position before y_j and ``process`` is :func:`tasks.train.logprobs.process_logits`
    (divide by ``temperature``; ``top_k`` 0 / ``top_p`` 1.0 mean off). Per-token log-probs are
    float32 (as :func:`tasks.train.logprobs.token_logprobs` computes them), summed in float64.
    Units: nats. An empty completion gives 0.0. A token outside a top-k/top-p support gives -inf.

    Batching: items sharing a prompt are grouped; each batch runs each distinct prompt once and
    its completions from the prompt's cached keys/values
    (:func:`tasks.train.forward.hidden_shared_prefix`); the output projection runs only at the
    completion positions. Padding never changes a value (attention masks and true position ids).

    Args:
        model: a transformers causal LM or a peft model around one (its active adapters apply);
            run under ``torch.inference_mode``, in its current train/eval mode set to eval.
        tokenizer: its tokenizer (``pad_token_id``, else ``eos_token_id``, pads).
        items: ``[(prompt ids, completion ids)]``, token ids as ints.
        temperature: > 0. ``device``: where the batch tensors go (the model's device).
        batch_size: sequences per forward pass (> 0).

    Returns:
        ``list[float]``, one per item, in the items' order.

    Raises:
        ValueError: an empty prompt, ``batch_size`` < 1, or a bad temperature / top-k / top-p
            (from ``process_logits``).
    """
    import torch

    from tasks.train.logprobs import token_logprobs
    from tasks.train.forward import hidden_shared_prefix

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    for i, (p, _c) in enumerate(items):
        if not p:
            raise ValueError(f"items[{i}]: empty prompt (a completion needs a prompt to be scored against)")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    out = [0.0] * len(items)
    # group by prompt (completions of one state share its keys/values), longest work first
    order = sorted((i for i, (_p, c) in enumerate(items) if c),
                   key=lambda i: (tuple(items[i][0]), len(items[i][1]), i))
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder, head = inner.get_decoder(), inner.get_output_embeddings()
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for start in range(0, len(order), batch_size):
                idx = order[start:start + batch_size]
                seqs = [list(items[i][0]) + list(items[i][1]) for i in idx]
                width = max(len(s) for s in seqs)
                ids = torch.full((len(idx), width), int(pad_id), dtype=torch.long)
                attn = torch.zeros((len(idx), width), dtype=torch.long)
                sel = torch.zeros((len(idx), width - 1), dtype=torch.bool)
                for r, (i, s) in enumerate(zip(idx, seqs)):
                    ids[r, :len(s)] = torch.tensor(s, dtype=torch.long)
                    attn[r, :len(s)] = 1
                    # target position q predicts ids[q + 1]: completion tokens start at len(prompt)
                    sel[r, len(items[i][0]) - 1: len(s) - 1] = True
                prefix = [len(items[i][0]) for i in idx]
                hidden = hidden_shared_prefix(decoder, ids.to(device), attn.to(device), sel, prefix, int(pad_id))
                logits = head(hidden)  # [N, V], N = completion tokens of the batch
                targets = ids[:, 1:][sel]
                lp = token_logprobs(logits, targets.to(logits.device), temperature=temperature,
                                    top_k=top_k or None, top_p=top_p if top_p < 1.0 else None)
                lp64 = lp.double().cpu()
                counts = sel.sum(-1).tolist()
                pos = 0
                for i, cnt in zip(idx, counts):
                    out[i] = float(lp64[pos:pos + cnt].sum())
                    pos += cnt
    finally:
        model.train(was_training)
    return out


def adapter_scorers(model: Any, tokenizer: Any, *, device: str = "cpu", batch_size: int = 16
                    ) -> tuple[Scorer, Scorer]:
    """``(score_policy, score_ref)`` for a peft model (base model + LoRA adapter): the policy
    scores with the adapter active, the reference with it disabled (``model.disable_adapter()``),
    so the base weights are loaded once. Each scorer is ``score(items, temperature) -> list[float]``
    (:func:`sequence_logprobs`, temperature only). Load the model with float32 weights for
    scoring (``load_policy`` with ``policy.rollout_dtype: float32``, or
    ``load_model_and_tokenizer(..., "float32")`` + ``PeftModel.from_pretrained``): bf16 logits
    carry ~0.4% relative error per token, which sums into the sequence log-probs.

    Raises:
        TypeError: ``model`` has no ``disable_adapter`` (not a peft model): without an adapter
            the policy is the reference and the check is empty.
    """
    if not hasattr(model, "disable_adapter"):
        raise TypeError(f"adapter_scorers needs a peft model with an adapter, got {type(model).__name__}")

    def score_policy(items: list[Item], temperature: float) -> list[float]:
        return sequence_logprobs(model, tokenizer, items, temperature=temperature, device=device,
                                 batch_size=batch_size)

    def score_ref(items: list[Item], temperature: float) -> list[float]:
        with model.disable_adapter():
            return sequence_logprobs(model, tokenizer, items, temperature=temperature, device=device,
                                     batch_size=batch_size)

    return score_policy, score_ref


def _first_turns(turns: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {t["episode_id"]: t for t in turns if int(t["turn_idx"]) == 0}


def log_odds_pairs(episodes: list[dict[str, Any]], turns: list[dict[str, Any]], specs: dict[str, Any],
                   score_policy: Scorer, score_ref: Scorer, *, max_states_per_harness: int | None = None,
                   seed: int = 0) -> list[dict[str, Any]]:
    """Log-odds of every pair of distinct candidate first actions, under the policy and the reference.

    States (see the module docstring): episodes grouped by (``group_id``, turn-0 prompt); a group
    whose episodes saw different first prompts (a task whose first page depends on the episode
    seed) splits into one state per prompt, ``state_id`` = ``group_id#<12 hex of the prompt
    hash>``; otherwise ``state_id`` = ``group_id``. Episodes with status ``infra_error`` are left
    out (their reward says nothing about the action). States with fewer than 2 distinct
    candidates give no pair. When a harness has more than ``max_states_per_harness`` states with
    a pair, that many are drawn without replacement with ``numpy.random.default_rng(seed_from(seed,
    "logodds", harness_id))`` from the states sorted by id (same inputs + seed -> same rows).

    Args:
        episodes: ``episodes`` rows (episode_id, task_id, harness_id, harness_name, group_id,
            sample_idx, reward, status).
        turns: ``turns`` rows; only ``turn_idx`` 0 is read (its whole prompt, completion_token_ids).
        specs: harness specs by harness_id (``spec.sampling.temperature`` is the scoring temperature).
        score_policy, score_ref: ``score(items, temperature) -> list[float]`` sequence log-probs
            (e.g. :func:`adapter_scorers`); each is called once per harness with all its candidates.
        max_states_per_harness: None = all states; else >= 1.

    Returns:
        Rows sorted by (harness_name, state_id, a_episode, b_episode): ``harness_name``,
        ``task_id``, ``state_id``, ``a_episode``, ``b_episode`` (the first episode, by
        sample_idx, with each candidate as its turn-0 completion), ``logodds_policy``,
        ``logodds_ref``, ``logodds_shift`` (= policy - ref), ``reward_diff`` (float, nats for the
        log-odds, reward units for the difference).

    Raises:
        ValueError: an episode without a turn-0 row, a harness_id missing from ``specs``,
            ``max_states_per_harness`` < 1, or a scorer returned a wrong count or a non-finite value.
    """
    if max_states_per_harness is not None and max_states_per_harness < 1:
        raise ValueError(f"max_states_per_harness must be >= 1 or None, got {max_states_per_harness}")
    first = _first_turns(turns)
    states: dict[str, dict[tuple[str, tuple[int, ...]], list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for e in episodes:
        if e["status"] == "infra_error":
            continue
        if e["harness_id"] not in specs:
            raise ValueError(f"episode {e['episode_id']}: harness_id {e['harness_id']!r} is not in specs")
        t0 = first.get(e["episode_id"])
        if t0 is None:
            raise ValueError(f"episode {e['episode_id']}: no turn with turn_idx 0 in turns")
        states[e["harness_id"]][(e["group_id"], tuple(episode_prompts([t0])[0]))].append(e)
    rows: list[dict[str, Any]] = []
    for hid in sorted(states):
        by_group: dict[str, int] = defaultdict(int)
        for gid, _p in states[hid]:
            by_group[gid] += 1
        cand: dict[str, tuple[list[int], list[list[dict[str, Any]]], str]] = {}
        for (gid, prompt), eps in states[hid].items():
            sid = gid if by_group[gid] == 1 else f"{gid}#{sha256_json(list(prompt))[:12]}"
            groups: dict[tuple[int, ...], list[dict[str, Any]]] = {}
            for e in sorted(eps, key=lambda e: (int(e["sample_idx"]), e["episode_id"])):
                c = tuple(int(x) for x in first[e["episode_id"]]["completion_token_ids"])
                groups.setdefault(c, []).append(e)
            if len(groups) >= 2:
                cand[sid] = (list(prompt), list(groups.values()), eps[0]["task_id"])
        chosen = sorted(cand)
        if max_states_per_harness is not None and len(chosen) > max_states_per_harness:
            rng = np.random.default_rng(seed_from(seed, "logodds", hid))
            pick = rng.choice(len(chosen), size=max_states_per_harness, replace=False)
            chosen = [chosen[i] for i in sorted(pick.tolist())]
        if not chosen:
            continue
        spec = specs[hid]
        temp = float(spec.sampling.temperature)
        items: list[Item] = []
        where: dict[tuple[str, int], int] = {}
        for sid in chosen:
            prompt, groups, _task = cand[sid]
            for j, g in enumerate(groups):
                where[(sid, j)] = len(items)
                items.append((prompt, [int(x) for x in first[g[0]["episode_id"]]["completion_token_ids"]]))
        lp_pol, lp_ref = score_policy(items, temp), score_ref(items, temp)
        for name, vals in (("score_policy", lp_pol), ("score_ref", lp_ref)):
            if len(vals) != len(items):
                raise ValueError(f"{name} returned {len(vals)} values for {len(items)} items")
            bad = [v for v in vals if not math.isfinite(v)]
            if bad:
                raise ValueError(f"{name} returned a non-finite sequence log-prob ({bad[0]}) for harness {spec.name!r}")
        for sid in chosen:
            _prompt, groups, task_id = cand[sid]
            reward = [math.fsum(float(e["reward"]) for e in g) / len(g) for g in groups]
            for a in range(len(groups)):
                for b in range(a + 1, len(groups)):
                    ia, ib = where[(sid, a)], where[(sid, b)]
                    lpol = lp_pol[ia] - lp_pol[ib]
                    lref = lp_ref[ia] - lp_ref[ib]
                    rows.append({
                        "harness_name": spec.name, "task_id": task_id, "state_id": sid,
                        "a_episode": groups[a][0]["episode_id"], "b_episode": groups[b][0]["episode_id"],
                        "logodds_policy": lpol, "logodds_ref": lref, "logodds_shift": lpol - lref,
                        "reward_diff": reward[a] - reward[b],
                    })
    rows.sort(key=lambda r: (r["harness_name"], r["state_id"], r["a_episode"], r["b_episode"]))
    return rows


def _corr(x: list[float], y: list[float], method: str) -> float | None:
    """Pearson or Spearman correlation (pandas ``Series.corr``; Spearman = Pearson of average
    ranks); None with fewer than 3 pairs or when either side has zero variance."""
    import pandas as pd

    if len(x) < 3 or float(np.var(x)) == 0.0 or float(np.var(y)) == 0.0:
        return None
    r = float(pd.Series(x, dtype="float64").corr(pd.Series(y, dtype="float64"), method=method))
    return r if math.isfinite(r) else None


def log_odds_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per harness (sorted by name), from :func:`log_odds_pairs` rows:

    ``harness_name``, ``n_states``, ``n_pairs``, ``pearson_policy_ref`` and
    ``spearman_policy_ref`` (correlation of ``logodds_policy`` with ``logodds_ref``),
    ``pearson_shift_reward`` (of ``logodds_shift`` with ``reward_diff``), ``mean_abs_shift``
    (nats). A correlation is None (null) with fewer than 3 pairs or when either variable has zero
    variance (e.g. every reward difference 0, or an adapter that changes nothing): a correlation
    is undefined there, not 0.
    """
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by[r["harness_name"]].append(r)
    out = []
    for h in sorted(by):
        rs = by[h]
        pol = [r["logodds_policy"] for r in rs]
        ref = [r["logodds_ref"] for r in rs]
        shift = [r["logodds_shift"] for r in rs]
        rdiff = [r["reward_diff"] for r in rs]
        out.append({
            "harness_name": h, "n_states": len({r["state_id"] for r in rs}), "n_pairs": len(rs),
            "pearson_policy_ref": _corr(pol, ref, "pearson"), "spearman_policy_ref": _corr(pol, ref, "spearman"),
            "pearson_shift_reward": _corr(shift, rdiff, "pearson"),
            "mean_abs_shift": math.fsum(abs(s) for s in shift) / len(shift),
        })
    return out
