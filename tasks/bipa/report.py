"""The Markdown report section of a BiPA run (``<run>/bipa/report.md``)."""

from __future__ import annotations

from typing import Any

from tasks.bipa.config import BipaRunConfig
from tasks.harnesses.spec import load_harness


def _f(x: float | None, d: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{d}f}"


def _b(x: bool | None) -> str:
    return "n/a" if x is None else ("yes" if x else "no")


def report_markdown(cfg: BipaRunConfig, cands: list[dict[str, Any]], replay: list[dict[str, Any]],
                    effect: list[dict[str, Any]], metrics: list[dict[str, Any]], learned: int) -> str:
    """The report: learned vs seed skill on the selection, fresh and test sets; the episode-graph
    token and turn overhead (learned minus seed); the replay table and the selection effect.

    Args: the rows of ``bipa_candidates``, ``bipa_replay``, ``bipa_effect``,
    ``bipa_graph_metrics``, and the index of the learned (final incumbent) candidate.
    """
    b = cfg.bipa
    mean = {(r["candidate_idx"], r["score_set"]): r["mean"] for r in replay}
    rule = f"accept iff candidate mean - incumbent mean > {b.accept.better_by} (ties rejected)"
    out = [f"# BiPA: skill optimizer evaluation ({cfg.name})", "",
           f"Harness `{cfg.seed_harness_name()}`, policy `{cfg.policy.model}`, {b.candidates} candidate(s), "
           f"{b.selection_tasks} selection task(s), {b.test_tasks} test task(s), {b.samples} episode(s) per task "
           f"per set. Rule: {rule}.", ""]
    out += ["## Learned skill vs seed skill", "",
            "| skill | candidate | selection | fresh | test |", "|---|---|---|---|---|"]
    for arm, idx in (("seed (hand-written)", 0), ("learned", learned)):
        out.append(f"| {arm} | {idx} | {_f(mean.get((idx, 'selection')))} | {_f(mean.get((idx, 'fresh')))} | "
                   f"{_f(mean.get((idx, 'test')))} |")
    if learned == 0:
        out += ["", "No candidate was accepted: the learned skill is the seed skill."]
    seed = load_harness(cfg.seed_harness_name())
    if seed.skill_placement == "file":
        placement = (f"Skill placement: the file `{seed.skill_path}` in the work dir, not in the prompt; the agent sees it "
                     "only by reading it with an action, so skill coverage and turns to first read measure what the "
                     "agent did.")
    else:
        placement = ("Skill placement: the system prompt. The skill is in every turn's context, read at turn 0 by "
                     "construction: coverage 1 and turns to first read 0 are how the harness is built, not behaviour "
                     "(use a `skill_placement: file` harness, e.g. react-python-skill-file, to measure reading).")
    out += ["", "## Token and turn overhead (episode graph)", "", placement, "",
            "| arm | set | episodes | skill coverage (episodes) | skill coverage (turns) | turns to first skill read | "
            "skill input tokens / episode | input tokens / episode | turns / episode |",
            "|---|---|---|---|---|---|---|---|---|"]
    for m in metrics:
        out.append(f"| {m['arm']} | {m['score_set']} | {m['episodes']} | {_f(m['episode_skill_coverage'])} | "
                   f"{_f(m['turn_skill_coverage'])} | {_f(m['mean_turns_to_first_skill_read'], 2)} | "
                   f"{_f(m['skill_input_tokens_per_episode'], 1)} | {_f(m['input_tokens_per_episode'], 1)} | "
                   f"{_f(m['turns_per_episode'], 2)} |")
    by = {(m["arm"], m["score_set"]): m for m in metrics}
    for s in ("fresh", "test"):
        if ("learned", s) in by:
            lm, sm = by[("learned", s)], by[("seed", s)]
            out.append("")
            out.append(f"Learned minus seed ({s}): {lm['input_tokens_per_episode'] - sm['input_tokens_per_episode']:+.1f} "
                       f"input tokens / episode, {lm['skill_input_tokens_per_episode'] - sm['skill_input_tokens_per_episode']:+.1f} "
                       f"skill tokens / episode, {lm['turns_per_episode'] - sm['turns_per_episode']:+.2f} turns / episode.")
    out += ["", "## Acceptance-rule replay", "",
            "| candidate | parent | decision | selection | parent selection | fresh | parent fresh | rule on fresh | "
            "test | parent test | rule on test |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    rr = {(r["candidate_idx"], r["score_set"]): r for r in replay}
    for c in cands:
        i, p = c["candidate_idx"], c["parent_idx"]
        fr, te = rr.get((i, "fresh"), {}), rr.get((i, "test"), {})
        out.append(f"| {i} | {p if p >= 0 else '-'} | {c['decision']} | {_f(c['selection_mean'])} | "
                   f"{_f(c['incumbent_mean'])} | {_f(fr.get('mean'))} | {_f(fr.get('parent_mean'))} | "
                   f"{_b(fr.get('rule_accepts'))} | {_f(te.get('mean'))} | {_f(te.get('parent_mean'))} | "
                   f"{_b(te.get('rule_accepts'))} |")
    out += ["", "| replay set | accepted | still accepted | selection effect E[sel - replay \\| accepted] | "
            "95% bootstrap interval |", "|---|---|---|---|---|"]
    for e in effect:
        ci = "n/a" if e["ci_low"] is None else f"[{e['ci_low']:.3f}, {e['ci_high']:.3f}] (B={e['bootstrap']})"
        out.append(f"| {e['score_set']} | {e['n_accepted']} | {e['still_accepted']} | {_f(e['selection_effect'])} | "
                   f"{ci} |")
    out += ["", "### Skills", ""]
    for c in cands:
        out += [f"Candidate {c['candidate_idx']} ({c['decision']}, sha256 {c['skill_sha256'][:12]}):", "", "```",
                c["skill"] or "(empty proposal)", "```", ""]
    return "\n".join(out) + "\n"
