"""TalkMesh's section of the pipeline's analysis report (``analyze/report.md``) for the harnesses
of ``loop_type: talkmesh`` in a pipeline run, registered in :mod:`tasks.talkmesh.application`."""

from __future__ import annotations

from typing import Any

from tasks.analysis.report import fmt_num, md_table


def report_section(store: Any, inputs: dict[str, Any], evals: list[dict[str, Any]],
                   eval_turns: list[dict[str, Any]], harnesses: list[str]) -> str:
    """The section for the run's talkmesh ``harnesses``: the confidence heads of the rollout stage's
    ``talkmesh_head`` artifact (``inputs``; none when absent), then :func:`talkmesh_section`."""
    heads = store.rows(inputs["talkmesh_head"], contract="talkmesh_head") if "talkmesh_head" in inputs else []
    return talkmesh_section(heads, evals, eval_turns, harnesses)


def analysis_note(harnesses: list[str]) -> str:
    """The analysis report's note on the talkmesh ``harnesses`` left out of the engine tables."""
    return (f"talkmesh harness(es) {harnesses}: left out of per-step branching and the log-odds check "
            "(their turns are separate agent messages, not one context an engine can replay or branch) "
            "and of the zero-advantage / harness-leakage analysis (their training batch is the talk "
            "policy's hints and revisions, grouped per task and kind, not the episodes).")


def talkmesh_section(heads: list[dict[str, Any]], evals: list[dict[str, Any]], eval_turns: list[dict[str, Any]],
                     harnesses: list[str]) -> str:
    """The report's TalkMesh section (P3: docs/methods/p3-talkmesh.md) for the talkmesh harnesses ``harnesses``.

    Args:
        heads: ``talkmesh_head`` rows (the head's ECE and Brier score on its graded train
            proposals).
        evals: sealed ``evaluations`` rows; first attempts and retries alike, infra errors left out.
        eval_turns: the attempts' turn rows (``turns`` contract, TalkMesh action JSON).

    Returns Markdown: per harness, the head's calibration, then per checkpoint the mesh's accuracy
    (consensus answer correct), the mean model-written messages per problem (outputs spent), and
    revisions kept / attempted.
    """
    import json

    out = ["## TalkMesh (P3)", ""]
    if heads:
        out += ["Confidence head, fitted in the rollout stage on graded base-policy proposals of the train tasks "
                "(ECE with equal-width bins; Brier score):", ""]
        out += md_table(["harness", "proposals", "correct", "ECE", "Brier"],
                      [[h["harness_name"], str(h["n"]), str(h["positives"]), fmt_num(h["ece"]), fmt_num(h["brier"])]
                       for h in sorted(heads, key=lambda h: h["harness_name"])], keep=1)
        out.append("")
    by_ep: dict[str, list[dict[str, Any]]] = {}
    for t in eval_turns:
        by_ep.setdefault(t["episode_id"], []).append(t)
    rows = []
    for h in harnesses:
        for ck in dict.fromkeys(e["checkpoint"] for e in evals if e["harness_name"] == h):
            cell = [e for e in evals if e["harness_name"] == h and e["checkpoint"] == ck and e["status"] != "infra_error"
                    and e["status"] != "timeout"]
            if not cell:
                continue
            revs = [json.loads(t["action"]) for e in cell for t in by_ep.get(e["eval_id"], [])]
            revs = [a for a in revs if a.get("kind") == "revision"]
            rows.append([h, ck, str(len(cell)), fmt_num(sum(e["resolved"] for e in cell) / len(cell)),
                         fmt_num(sum(e["num_turns"] for e in cell) / len(cell), ".1f"),
                         f"{sum(bool(a.get('kept')) for a in revs)}/{len(revs)}"])
    out += ["Sealed evaluation of the mesh (an attempt passes when the agents' consensus answer is correct); "
            "outputs = model-written messages per problem (proposals, hints, revisions):", ""]
    out += md_table(["harness", "checkpoint", "attempts", "accuracy", "outputs / problem", "revisions kept"], rows, keep=2)
    return "\n".join(out) + "\n"
