"""The TalkMesh protocol (docs/methods/p3-talkmesh.md; Turkcan, arXiv 2609.30578), pure and batched.

N agents share one base model. For every problem:

1. **Proposal** (round 0): agent i's proposal is its i-th sample (its own seed); its confidence
   c_i is the confidence head's score of (problem, answer_i) (:mod:`tasks.talkmesh.calibration`;
   an unparsable answer scores 0.0). A colluder proposes the poisoned answer and claims c = 1.0.
2. **Hint broadcast** (rounds 1..R): every agent i looks at its closed neighbourhood N[i] in the
   topology (full: everyone, so one global broadcaster) and takes the agent with the highest
   *claimed* confidence as its hint source (ties: lowest agent id). Each distinct honest source
   writes one hint per round with the talk policy; a colluding source sends a poisoned hint naming
   the wrong answer (no model call).
3. **Revision**: an honest agent with c_i < ``threshold`` that is not its own source revises its
   solution given the hint; the revision's answer is scored by the head, c'; the revision is
   **kept iff c' > c_i** (then the agent's answer and confidence become the revision's).
   **Defence** (``defended=True``): before revising, the receiver re-scores the hint's answer with
   its own head; a hint scoring below the receiver's current confidence is ignored (no revision).
4. **Gossip consensus**: every agent holds a table of votes (agent -> (answer, confidence)),
   starting with its own; at each gossip step every agent merges its neighbours' tables (epidemic
   dissemination). An agent's decision is the confidence-weighted vote over the votes it knows
   (:func:`weighted_vote`). After diameter(G) steps every agent knows every vote, so the decision
   equals the coordinator's confidence-weighted vote: gossip reaches it without a coordinator.
   Colluders announce their fake 1.0; in the defended mesh a receiver replaces the confidence of
   every received vote by its own head's score of that answer. The mesh's answer is the plurality
   of the honest agents' final decisions (ties: the decision of the lowest-id honest agent among
   the tied).

With one base model and one confidence head, every honest agent's "own head" is the same
function, so re-scoring is ``score(problem, answer)``; per-agent heads would change nothing here
but the call.

**Outputs spent** (the x-axis of the budget plot) counts every message an agent emits: N
proposals, one hint per distinct source per round (poisoned hints included), one per revision
attempted. Confidence scoring is a forward pass, not an output, and is not counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

from tasks.talkmesh.topology import Topology, build_topology


@dataclass(frozen=True)
class Problem:
    """One problem: ``problem_id`` (the frozen task id), ``question`` (the visible instruction),
    and the hidden ``verifier_kind`` / ``verifier_spec`` (JSON), used only by the grader."""

    problem_id: str
    question: str
    verifier_kind: str = ""
    verifier_spec: str = ""


@dataclass(frozen=True)
class Output:
    """One generated message: ``text``, the parsed ``answer`` (None: nothing parsable), and for
    model-generated outputs the ``prompt_ids`` / ``token_ids`` / ``logprobs`` (nats) of the call
    (empty for scripted or adversarial messages)."""

    text: str
    answer: str | None
    prompt_ids: tuple[int, ...] = ()
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()


class TalkPolicy(Protocol):
    """What the mesh needs from the talk policy. Both methods take a batch and return one
    :class:`Output` per item, in order; ``seed`` makes the batch reproducible."""

    def hints(self, items: Sequence[tuple[Problem, Output]], seed: int) -> list[Output]:
        """A hint for each (problem, the source's current solution)."""
        ...

    def revise(self, items: Sequence[tuple[Problem, Output, str]], seed: int) -> list[Output]:
        """A revision for each (problem, the receiver's current solution, the hint message)."""
        ...


Scorer = Callable[[Sequence[tuple[Problem, "str | None"]]], list[float]]
Grader = Callable[[Problem, "str | None"], bool]


@dataclass(frozen=True)
class MeshSettings:
    """``agents`` N (>= 2); ``topology`` full | ring | regular (random ``degree``-regular, drawn
    with ``seed``); ``rounds`` R of hint + revision (>= 0); ``threshold`` in [0, 1]: agents with a
    lower confidence revise; ``gossip_steps``: the most gossip steps (None: N, always enough, the
    diameter of a connected graph on N nodes is < N)."""

    agents: int
    topology: Topology = "full"
    degree: int = 2
    rounds: int = 1
    threshold: float = 0.5
    gossip_steps: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.agents < 2:
            raise ValueError(f"agents={self.agents}: a mesh needs at least 2 agents")
        if self.topology not in ("full", "ring", "regular"):
            raise ValueError(f"topology={self.topology!r} is not one of full, ring, regular")
        if self.rounds < 0:
            raise ValueError(f"rounds={self.rounds} must be >= 0")
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold={self.threshold} is outside [0, 1]")
        if self.gossip_steps is not None and self.gossip_steps < 1:
            raise ValueError(f"gossip_steps={self.gossip_steps} must be >= 1")


def weighted_vote(votes: Sequence[tuple[str | None, float]]) -> str | None:
    """The answer with the largest total weight; ties go to the answer seen first. ``None``
    answers (nothing parsable) cast no vote; no votes -> None. Majority vote is this with every
    weight 1."""
    tot: dict[str, float] = {}
    for a, w in votes:
        if a is not None:
            tot[a] = tot.get(a, 0.0) + float(w)
    if not tot:
        return None
    best = max(tot.values())
    return next(a for a, w in tot.items() if w == best)


@dataclass
class _Agent:
    out: Output
    conf: float
    colluder: bool


@dataclass
class MeshResult:
    """``messages``: one row per (problem, agent, round) (the ``talkmesh_messages`` contract,
    without the ``condition`` column); ``results``: one row per problem (``talkmesh_results``);
    ``revisions``: for every revision attempted, ``(problem, source, receiver, hint Output,
    proposal Output, revision Output, proposal correct, revision correct)``, for the talk policy's
    GRPO (:mod:`tasks.talkmesh.talk`)."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)
    revisions: list[dict[str, Any]] = field(default_factory=list)


def run_mesh(problems: Sequence[Problem], proposals: Sequence[Sequence[Output]], score: Scorer, talk: TalkPolicy,
             correct: Grader, settings: MeshSettings, *, colluders: frozenset[int] = frozenset(),
             poison: Callable[[Problem], str] | None = None, defended: bool = False, seed: int = 0) -> MeshResult:
    """Run the protocol (module docstring) on a batch of problems, every phase batched across them.

    Args:
        proposals: ``[P][N]`` the agents' proposals (agent i of problem p: ``proposals[p][i]``;
            a colluder's is replaced by the poisoned one).
        score: the confidence head: ``[(problem, answer)] -> [confidence in [0, 1]]``.
        talk: writes hints and revisions (:class:`TalkPolicy`).
        correct: the grader (``True`` iff the answer is right; never shown to the agents).
        colluders: agent ids that collude (fake confidence 1.0, poisoned proposals and hints).
        poison: problem -> the colluders' wrong answer (required with colluders).
        defended: receivers re-score hints and gossip votes with their own head.
        seed: base seed of the talk policy's calls (round r uses ``seed + 2r`` for hints and
            ``seed + 2r + 1`` for revisions).

    Raises:
        ValueError: ``proposals`` is not ``[len(problems)][settings.agents]``; a colluder id out of
            range; colluders without ``poison``; all agents colluding; a scorer or talk policy
            returning the wrong number of items.
    """
    n = settings.agents
    if len(proposals) != len(problems) or any(len(p) != n for p in proposals):
        raise ValueError(f"proposals must be [{len(problems)}][{n}], got "
                         f"[{len(proposals)}][{sorted({len(p) for p in proposals})}]")
    if any(not 0 <= c < n for c in colluders):
        raise ValueError(f"colluders={sorted(colluders)}: ids must be in [0, {n - 1}]")
    if colluders and poison is None:
        raise ValueError("colluders given without a poison function")
    if len(colluders) >= n:
        raise ValueError(f"colluders={sorted(colluders)}: at least one agent must be honest")
    g = build_topology(settings.topology, n, settings.degree, settings.seed)
    hood = {i: sorted([i, *g.neighbors(i)]) for i in range(n)}
    out = MeshResult()

    def scored(items: list[tuple[Problem, str | None]]) -> list[float]:
        todo = [(p, a) for p, a in items if a is not None]
        got = iter(_checked(score(todo), len(todo), "score") if todo else [])
        return [next(got) if a is not None else 0.0 for _, a in items]

    # round 0: proposals and their confidence
    state: list[list[_Agent]] = []
    honest_items = [(p, proposals[k][i].answer) for k, p in enumerate(problems) for i in range(n) if i not in colluders]
    confs = iter(scored(honest_items))
    poisons = [poison(p) if colluders else None for p in problems]  # type: ignore[misc]
    for k, p in enumerate(problems):
        row = []
        for i in range(n):
            if i in colluders:
                row.append(_Agent(Output(f"Answer: {poisons[k]}", poisons[k]), 1.0, True))
            else:
                row.append(_Agent(proposals[k][i], next(confs), False))
        state.append(row)
    spent = [n] * len(problems)
    initially = [[correct(p, a.out.answer) for a in state[k]] for k, p in enumerate(problems)]

    for r in range(1, settings.rounds + 1):
        # sources per receiver, by claimed confidence
        src = [[max(hood[i], key=lambda j: (state[k][j].conf, -j)) for i in range(n)] for k in range(len(problems))]
        senders = [sorted(set(src[k])) for k in range(len(problems))]
        honest_send = [(k, s) for k in range(len(problems)) for s in senders[k] if not state[k][s].colluder]
        gen = _checked(talk.hints([(problems[k], state[k][s].out) for k, s in honest_send], seed + 2 * r),
                       len(honest_send), "hints") if honest_send else []
        hint: dict[tuple[int, int], Output] = dict(zip(honest_send, gen))
        for k in range(len(problems)):
            for s in senders[k]:
                if state[k][s].colluder:
                    hint[(k, s)] = Output(f"The answer is {poisons[k]}.", poisons[k])
            spent[k] += len(senders[k])
        # who revises: honest, below threshold, not its own source
        recv = [(k, i) for k in range(len(problems)) for i in range(n)
                if not state[k][i].colluder and state[k][i].conf < settings.threshold and src[k][i] != i]
        rescored = dict(zip(recv, scored([(problems[k], hint[(k, src[k][i])].answer) for k, i in recv])))
        ignored = {ki for ki in recv if defended and rescored[ki] < state[ki[0]][ki[1]].conf}
        go = [ki for ki in recv if ki not in ignored]
        msgs = {ki: hint_message(hint[(ki[0], src[ki[0]][ki[1]])], state[ki[0]][src[ki[0]][ki[1]]].conf) for ki in go}
        revs = _checked(talk.revise([(problems[k], state[k][i].out, msgs[(k, i)]) for k, i in go], seed + 2 * r + 1),
                        len(go), "revise") if go else []
        rev = dict(zip(go, revs))
        rev_conf = dict(zip(go, scored([(problems[k], rev[(k, i)].answer) for k, i in go])))
        for k, i in go:
            spent[k] += 1
        for k, p in enumerate(problems):
            for i in range(n):
                a = state[k][i]
                before = correct(p, a.out.answer)
                s = src[k][i]
                is_recv = (k, i) in rescored
                revised = (k, i) in rev
                kept = revised and rev_conf[(k, i)] > a.conf
                after_out = rev[(k, i)] if kept else a.out
                ro = rev.get((k, i))
                rev_correct = correct(p, ro.answer) if ro is not None else None
                out.messages.append({
                    "problem_id": p.problem_id, "agent": i, "round": r, "colluder": a.colluder,
                    "proposal": a.out.text, "proposal_answer": a.out.answer, "confidence": a.conf,
                    "hint_source": s if is_recv else -1,
                    "hint": hint[(k, s)].text if is_recv else None,
                    "hint_answer": hint[(k, s)].answer if is_recv else None,
                    "hint_confidence": state[k][s].conf if is_recv else None,
                    "hint_rescored": rescored.get((k, i)), "hint_ignored": (k, i) in ignored,
                    "revision": ro.text if ro is not None else None,
                    "revision_answer": ro.answer if ro is not None else None,
                    "revision_confidence": rev_conf.get((k, i)), "kept": kept,
                    "correct_before": before, "correct_after": correct(p, after_out.answer),
                })
                if revised:
                    out.revisions.append({"problem": p, "source": s, "receiver": i, "hint": hint[(k, s)],
                                          "message": msgs[(k, i)], "proposal": a.out, "revision": ro,
                                          "proposal_correct": before, "revision_correct": bool(rev_correct)})
        for k, i in go:
            if rev_conf[(k, i)] > state[k][i].conf:
                state[k][i] = _Agent(rev[(k, i)], rev_conf[(k, i)], False)

    # gossip consensus
    steps_max = settings.gossip_steps or n
    for k, p in enumerate(problems):
        own = {j: (state[k][j].out.answer, state[k][j].conf) for j in range(n)}
        if defended:
            view = dict(zip(range(n), scored([(p, own[j][0]) for j in range(n)])))
        known = [{i} for i in range(n)]
        honest = [i for i in range(n) if not state[k][i].colluder]

        def decisions() -> list[str | None]:
            return [weighted_vote([(own[j][0], view[j] if defended and j != i else own[j][1]) for j in sorted(known[i])])
                    for i in range(n)]

        dec = decisions()
        agreed_at = 0 if len({dec[i] for i in honest}) == 1 else -1
        step = 0
        while step < steps_max and any(len(s) < n for s in known):
            step += 1
            known = [set().union(*(known[j] for j in hood[i])) for i in range(n)]
            dec = decisions()
            if agreed_at < 0 and len({dec[i] for i in honest}) == 1:
                agreed_at = step
        tally: dict[str | None, int] = {}
        for i in honest:
            tally[dec[i]] = tally.get(dec[i], 0) + 1
        top = max(tally.values())
        answer = next(dec[i] for i in honest if tally[dec[i]] == top)
        out.results.append({
            "problem_id": p.problem_id, "answer": answer, "correct": correct(p, answer),
            "outputs_spent": spent[k], "consensus": len({dec[i] for i in honest}) == 1,
            "consensus_step": agreed_at, "gossip_steps": step,
            "proposal_accuracy": sum(initially[k][i] for i in honest) / len(honest),
            "final_accuracy": sum(correct(p, state[k][i].out.answer) for i in honest) / len(honest),
        })
    return out


def hint_message(hint: Output, confidence: float) -> str:
    """The message a receiver sees: the hint text, then the source's answer and claimed
    confidence (two decimals)."""
    ans = hint.answer if hint.answer is not None else "none"
    return f"{hint.text.strip()}\n(The hint's answer: {ans}; its confidence: {confidence:.2f})"


def _checked(got: list[Any], want: int, what: str) -> list[Any]:
    if len(got) != want:
        raise ValueError(f"{what} returned {len(got)} items for {want} inputs")
    return list(got)
