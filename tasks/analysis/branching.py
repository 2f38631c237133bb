"""P1's per-step mismatch estimator by branching continuations from visited states
(P1, docs/methods/p1-ceiling-mismatch.md: the per-step estimator branches K continuations from
visited states to estimate V* and Q*). The definitions below are our reconstruction [design].

For a recorded episode with turns 0..T-1 and outcome success S in {0, 1}:

- the visited states s_t (t = 0..T-1) are the states before turn t: the task's environment after
  the recorded actions of turns < t, and the prompt of turn t;
- from each s_t, ``n`` continuations are run with the policy being analysed: the recorded
  completions of turns < t are *forced* (replayed token for token; their tool calls are
  re-executed in a fresh sandbox, so the environment state is rebuilt), then the policy samples
  freely from turn t on, under the harness's own sampling settings and loop;
- V*_K(s_t) = the unbiased pass@K estimate (Chen et al. 2021, :func:`tasks.evaluate.stats.pass_at_k`)
  from the c successes of the n continuations: the chance that at least one of K continuations
  from s_t succeeds (the harness ceiling from s_t at budget K). With n = K it is 1[c > 0];
- V^pi(s_t) = c / n, the policy's own success rate from s_t;
- V*_K(s_T) := S (the recorded outcome: nothing is left to choose after the last turn);
- the per-step mismatch m_t = V*_K(s_t) - V*_K(s_{t+1}): how much of the reachable return the
  policy's action at turn t gave away (negative when the action moved to a better state than the
  estimate of s_t).

The sum telescopes: sum_t m_t = V*_K(s_0) - S, the episode-level mismatch (ceiling from the start
state minus the outcome); averaged over episodes it is the per-step estimate M_step of
M = C_h - J(pi). Single-turn harnesses have only s_0: M_step = V*_K(s_0) - S.

Continuations that end ``infra_error`` are left out of n (P4's rule); a state with fewer than K
graded continuations has V*_K = None and so do the m_t next to it. A continuation whose replay did
not reproduce the recorded state (a tool whose output differs from the recorded run, e.g. one that
prints the time or a random number: the forced turns' prompts or s_t's prompt differ from the
recorded ones, or the episode ended before turn t) is still counted, as a continuation from the
state the replay reached; the state's ``replay_ok`` is False and ``n_diverged`` counts them.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from tasks.evaluate.stats import pass_at_k
from tasks.hashing import seed_from, sha256_json
from tasks.rollout.generation import Generation
from tasks.rollout.turns import episode_prompts, iter_prompts


@dataclass(frozen=True)
class _Lineage:
    """A recorded episode's forced turns: generations of turns < depth (shared by every
    episode of a wave with this first prompt)."""

    gens: tuple[Generation, ...]


class ReplayPolicy:
    """A policy that replays recorded turns, then hands over to the wrapped policy.

    Built for one :func:`tasks.rollout.harness.run_episodes` call whose jobs all branch at the
    same ``depth``: the engine calls ``generate`` once per turn for the episodes still running, so
    call u (counted from 0) is turn u. For u < depth every prompt gets its episode's recorded
    completion of turn u (a :class:`Generation` with the recorded token ids, log-probs, finish
    reason and text); from u = depth on the whole call goes to the wrapped policy unchanged (same
    prompts, order, sampling and seed).

    An episode is found by its first prompt (the turn-0 prompt is a prefix of every later prompt
    of that episode), so a replay whose observation diverged from the recorded one still gets its
    own recorded actions. ``lineages`` must therefore map each first prompt to one forced history
    (:func:`branch_states` puts episodes that share a first prompt but not their history in
    separate calls).

    Args:
        inner: the policy being analysed (``tokenizer``, ``generate``; ``max_model_len`` if it has one).
        lineages: ``{turn-0 prompt ids (tuple): recorded Generations of turns 0..depth-1}``.
        depth: the turn from which the policy samples (>= 0).
        recorded_prompts: optional ``{turn-0 prompt ids: the recorded prompt ids of every turn}``,
            used only to check the engine's one-call-per-turn order.

    Raises:
        ValueError: ``depth`` < 0 or a lineage with fewer than ``depth`` recorded turns.

    Raises (from :meth:`generate`):
        RuntimeError: during a forced turn, a prompt that starts with none of the lineages' first
            prompts, or one equal to a recorded prompt of another turn (the engine did not call
            once per turn: the replay would be wrong).
    """

    def __init__(self, inner: Any, lineages: dict[tuple[int, ...], tuple[Generation, ...]], depth: int,
                 recorded_prompts: dict[tuple[int, ...], list[tuple[int, ...]]] | None = None):
        if depth < 0:
            raise ValueError(f"depth must be >= 0, got {depth}")
        for p0, gens in lineages.items():
            if len(gens) < depth:
                raise ValueError(f"a lineage has {len(gens)} recorded turns, fewer than depth {depth}")
        self.inner, self.depth, self.calls = inner, depth, 0
        self.tokenizer = inner.tokenizer
        self.max_model_len = getattr(inner, "max_model_len", None)
        self._lineages = {p0: _Lineage(tuple(g)) for p0, g in lineages.items()}
        self._lengths = sorted({len(p0) for p0 in lineages}, reverse=True)  # longest first
        self._recorded = recorded_prompts or {}

    def _lineage(self, prompt: list[int]) -> tuple[tuple[int, ...], _Lineage]:
        for n in self._lengths:
            key = tuple(prompt[:n])
            if key in self._lineages:
                return key, self._lineages[key]
        raise RuntimeError(f"forced turn {self.calls - 1}: a prompt of {len(prompt)} tokens starts with no recorded "
                           "episode's first prompt")

    def generate(self, prompts: list[list[int]], sampling: Any, seed: int) -> list[Generation]:
        """Recorded generations for forced turns, else the wrapped policy's (see the class docstring)."""
        u = self.calls
        self.calls += 1
        if u >= self.depth:
            return self.inner.generate(prompts, sampling, seed)
        out = []
        for p in prompts:
            key, lin = self._lineage(p)
            rec = self._recorded.get(key)
            if rec is not None:
                tp = tuple(p)
                hits = [v for v, q in enumerate(rec) if q == tp]
                if hits and u not in hits:
                    raise RuntimeError(f"generate call {u} got the recorded prompt of turn {hits[0]}: the engine did "
                                       "not call generate once per turn")
            out.append(lin.gens[u])
        return out


def _recorded_turns(turns: list[dict[str, Any]], episodes: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    wanted = {e["episode_id"] for e in episodes}
    for t in turns:
        if t["episode_id"] in wanted:
            by[t["episode_id"]].append(t)
    out = {}
    for e in episodes:
        ts = sorted(by.get(e["episode_id"], []), key=lambda t: int(t["turn_idx"]))
        if [int(t["turn_idx"]) for t in ts] != list(range(int(e["num_turns"]))):
            raise ValueError(f"episode {e['episode_id']}: turns rows have turn_idx {[int(t['turn_idx']) for t in ts]}, "
                             f"expected 0..{int(e['num_turns']) - 1} (num_turns {e['num_turns']})")
        out[e["episode_id"]] = ts
    return out


def _gen(t: dict[str, Any]) -> Generation:
    return Generation(token_ids=[int(x) for x in t["completion_token_ids"]],
                      logprobs=[float(x) for x in t["completion_logprobs"]],
                      finish_reason=str(t["finish_reason"]), text=str(t["completion_text"]))


def _ids(x: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in x)


def branch_states(policy: Any, spec: Any, episodes: list[dict[str, Any]], turns: list[dict[str, Any]],
                  tasks_by_id: dict[str, dict[str, Any]], sandbox_cfg: Any, *, n: int, k: int, seed: int,
                  max_depth: int | None = None) -> list[dict[str, Any]]:
    """Branch ``n`` continuations from every visited state of ``episodes`` (one harness) and
    estimate V*_K, V^pi and the per-step mismatch (definitions in the module docstring).

    Work: for each depth t (0 .. min(T_max, max_depth) - 1) the episodes with more than t turns
    are run with :func:`tasks.rollout.harness.run_episodes` under a :class:`ReplayPolicy` that
    forces turns < t, ``n`` jobs per episode. Episodes that share a first prompt (one sampling
    group) but not their first t completions go in separate calls ("waves"), so a first prompt
    always names one forced history; there are at most G calls per depth. Turn sampling is seeded
    per call with ``seed_from(seed, "branch", harness_id, t, wave)``; branch job ids are
    ``sha256_json([episode_id, "branch", t, j])[:32]`` and each job keeps the recorded episode's
    ``seed`` (so a browser task opens the same page). Same inputs + seed -> same rows.

    Args:
        policy: the policy analysed (``generate``, ``tokenizer``), e.g. ``load_policy(cfg, adapter_dir)``.
        spec: the harness spec (:class:`tasks.harnesses.spec.HarnessSpec`) of every episode.
        episodes: ``episodes`` rows of this harness (episode_id, task_id, harness_id, harness_name,
            num_turns, success, status; ``seed``, ``record_id``, ``group_id``, ``sample_idx`` if
            present). ``infra_error`` episodes are skipped (no outcome to compare with).
        turns: ``turns`` rows holding every turn of those episodes.
        tasks_by_id: task rows by task_id (the ``tasks`` artifact).
        sandbox_cfg: :class:`tasks.config.SandboxConfig` for the replays and continuations.
        n: continuations per state (>= k); k: the K of V*_K (>= 1).
        max_depth: branch only states t < max_depth (None: all). An episode longer than
            ``max_depth`` gets ``step_mismatch`` None at its last branched state (s_{t+1} not estimated).

    Returns:
        One row per (episode, t), sorted by (episode order, t): ``episode_id``, ``harness_name``,
        ``task_id``, ``turn_idx`` (t), ``num_turns`` (T), ``recorded_success`` (bool), ``n``
        (graded continuations), ``n_infra`` (infra_error continuations, not in n), ``successes``,
        ``v_star`` (pass@k, None if n < k), ``v_pi`` (successes / n, None if n = 0),
        ``step_mismatch`` (m_t, None when V*_K of s_t or s_{t+1} is None or s_{t+1} was not
        branched), ``replay_ok`` (every continuation reproduced the recorded turns < t and the
        recorded prompt of turn t), ``n_diverged`` (continuations that did not).

    Raises:
        ValueError: k < 1, n < k, max_depth < 1, an episode of another harness than ``spec``,
            a task_id missing from ``tasks_by_id``, or an episode's turns rows incomplete.
        RuntimeError: from :class:`ReplayPolicy` (engine turn-order contract broken).
    """
    from tasks.rollout.harness import EpisodeJob, run_episodes

    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if n < k:
        raise ValueError(f"n must be >= k ({k}), got {n}")
    if max_depth is not None and max_depth < 1:
        raise ValueError(f"max_depth must be >= 1 or None, got {max_depth}")
    for e in episodes:
        if e["harness_id"] != spec.harness_id:
            raise ValueError(f"episode {e['episode_id']}: harness_id {e['harness_id'][:12]} is not the spec's "
                             f"({spec.name}, {spec.harness_id[:12]})")
        if e["task_id"] not in tasks_by_id:
            raise ValueError(f"episode {e['episode_id']}: task_id {e['task_id']!r} is not in tasks_by_id")
    eps = sorted((e for e in episodes if e["status"] != "infra_error"),
                 key=lambda e: (str(e.get("group_id", "")), int(e.get("sample_idx", 0)), e["episode_id"]))
    rec = _recorded_turns(turns, eps)
    rec_prompts = {eid: [tuple(p) for p in episode_prompts(ts)] for eid, ts in rec.items()}
    t_max = max((int(e["num_turns"]) for e in eps), default=0)
    depths = range(min(t_max, max_depth) if max_depth is not None else t_max)
    cell: dict[tuple[str, int], dict[str, Any]] = {}
    for t in depths:
        at = [e for e in eps if int(e["num_turns"]) > t]
        # waves: within one wave a first prompt names exactly one forced history (turns < t)
        waves: list[list[dict[str, Any]]] = []
        hist_rank: dict[tuple[int, ...], dict[tuple[tuple[int, ...], ...], int]] = defaultdict(dict)
        for e in at:
            ts = rec[e["episode_id"]]
            p0 = rec_prompts[e["episode_id"]][0]
            hist = tuple(_ids(ts[u]["completion_token_ids"]) for u in range(t))
            w = hist_rank[p0].setdefault(hist, len(hist_rank[p0]))
            if w == len(waves):
                waves.append([])
            waves[w].append(e)
        for w, wave in enumerate(waves):
            lineages: dict[tuple[int, ...], tuple[Generation, ...]] = {}
            recorded: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
            jobs, owner = [], {}
            for e in wave:
                ts = rec[e["episode_id"]]
                p0 = rec_prompts[e["episode_id"]][0]
                lineages[p0] = tuple(_gen(ts[u]) for u in range(t))
                recorded[p0] = rec_prompts[e["episode_id"]]
                record = {"record_id": e.get("record_id", ""), "task_id": e["task_id"],
                          "harness_id": e["harness_id"], "harness_name": e["harness_name"]}
                ep_seed = int(e["seed"]) if e.get("seed") is not None else seed_from(seed, e["episode_id"])
                for j in range(n):
                    jid = sha256_json([e["episode_id"], "branch", t, j])[:32]
                    owner[jid] = e["episode_id"]
                    jobs.append(EpisodeJob(jid, record, tasks_by_id[e["task_id"]], j, ep_seed))
            replay = ReplayPolicy(policy, lineages, t, recorded)
            out_eps, out_turns = run_episodes(replay, spec, jobs, sandbox_cfg,
                                              seed=seed_from(seed, "branch", spec.harness_id, t, w))
            bturns: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
            for row in out_turns:
                bturns[row["episode_id"]][int(row["turn_idx"])] = row
            for be in out_eps:
                eid = owner[be["episode_id"]]
                ts = rec[eid]
                got = bturns[be["episode_id"]]
                got_prompts = [tuple(p) for _, p in itertools.islice(iter_prompts(list(got.values())), t + 1)]
                ok = len(got_prompts) == t + 1 and got_prompts == rec_prompts[eid][:t + 1]
                ok = ok and all(_ids(got[u]["completion_token_ids"]) == _ids(ts[u]["completion_token_ids"])
                                for u in range(t))
                c = cell.setdefault((eid, t), {"n": 0, "n_infra": 0, "successes": 0, "n_diverged": 0})
                if be["status"] == "infra_error":
                    c["n_infra"] += 1
                else:
                    c["n"] += 1
                    c["successes"] += int(bool(be["success"]))
                c["n_diverged"] += int(not ok)
    rows = []
    for e in eps:
        T = int(e["num_turns"])
        branched = [t for t in depths if t < T]
        vstar = {}
        for t in branched:
            c = cell[(e["episode_id"], t)]
            vstar[t] = pass_at_k(c["n"], c["successes"], k) if c["n"] >= k else None
        if len(branched) == T:
            vstar[T] = 1.0 if bool(e["success"]) else 0.0
        for t in branched:
            c = cell[(e["episode_id"], t)]
            nxt = vstar.get(t + 1)
            m = None if vstar[t] is None or nxt is None else vstar[t] - nxt
            rows.append({
                "episode_id": e["episode_id"], "harness_name": e["harness_name"], "task_id": e["task_id"],
                "turn_idx": t, "num_turns": T, "recorded_success": bool(e["success"]),
                "n": c["n"], "n_infra": c["n_infra"], "successes": c["successes"], "v_star": vstar[t],
                "v_pi": c["successes"] / c["n"] if c["n"] else None, "step_mismatch": m,
                "replay_ok": c["n_diverged"] == 0, "n_diverged": c["n_diverged"],
            })
    return rows


def _mean(xs: list[float]) -> float | None:
    return math.fsum(xs) / len(xs) if xs else None


def step_mismatch_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per harness (sorted by name), from :func:`branch_states` rows:

    - ``n_episodes``, ``n_states``;
    - ``mean_v_star_s0`` / ``mean_v_pi_s0``: mean V*_K(s_0) / V^pi(s_0) over episodes where defined;
    - ``mean_success``: mean recorded success;
    - ``m_step``: the per-step mismatch estimate M_step = mean over *complete* episodes (every
      state branched and every m_t defined) of sum_t m_t (= V*_K(s_0) - success by telescoping);
      ``n_complete`` counts them (None when 0);
    - ``m_by_turn`` / ``n_by_turn``: mean m_t at each turn index t = 0, 1, ... over the defined
      m_t, and how many there were (lists; a None entry where none was defined);
    - ``replay_divergences``: states with ``replay_ok`` False; ``diverged_continuations``:
      continuations that diverged; ``infra_continuations``: continuations left out as infra_error.
    """
    by: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        by[r["harness_name"]][r["episode_id"]].append(r)
    out = []
    for h in sorted(by):
        eps = by[h]
        s0 = [r for rs in eps.values() for r in rs if r["turn_idx"] == 0]
        sums = []
        for rs in eps.values():
            T = rs[0]["num_turns"]
            ms = [r["step_mismatch"] for r in sorted(rs, key=lambda r: r["turn_idx"])]
            if len(ms) == T and all(m is not None for m in ms):
                sums.append(math.fsum(ms))
        depth = max((r["turn_idx"] for rs in eps.values() for r in rs), default=-1) + 1
        m_by, n_by = [], []
        for t in range(depth):
            ms = [r["step_mismatch"] for rs in eps.values() for r in rs if r["turn_idx"] == t
                  and r["step_mismatch"] is not None]
            m_by.append(_mean(ms))
            n_by.append(len(ms))
        allr = [r for rs in eps.values() for r in rs]
        out.append({
            "harness_name": h, "n_episodes": len(eps), "n_states": len(allr),
            "mean_v_star_s0": _mean([r["v_star"] for r in s0 if r["v_star"] is not None]),
            "mean_v_pi_s0": _mean([r["v_pi"] for r in s0 if r["v_pi"] is not None]),
            "mean_success": _mean([1.0 if rs[0]["recorded_success"] else 0.0 for rs in eps.values()]),
            "m_step": _mean(sums), "n_complete": len(sums), "m_by_turn": m_by, "n_by_turn": n_by,
            "replay_divergences": sum(not r["replay_ok"] for r in allr),
            "diverged_continuations": sum(r["n_diverged"] for r in allr),
            "infra_continuations": sum(r["n_infra"] for r in allr),
        })
    return out
