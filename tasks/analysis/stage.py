"""The analyze stage: evaluations -> the ``mismatch`` table and a Markdown report."""

from __future__ import annotations

import logging
from typing import Any

from schemas import ArtifactRef, ArtifactStore
from tasks.analysis.mismatch import mismatch_table
from tasks.config import RunConfig

log = logging.getLogger("harnessrl.analyze")

REPORT = "analyze/report.md"


def render_report(cfg: RunConfig, mismatch: list[dict[str, Any]], steps: list[dict[str, Any]],
                  timing: list[dict[str, float]], episodes: list[dict[str, Any]], seal_head: str, plan_hash: str) -> str:
    """The run report as Markdown."""
    lines = [f"# harnessrl run `{cfg.name}`", "", f"config hash `{cfg.config_hash()[:16]}`, model `{cfg.policy.model}`", ""]
    lines += ["## Training rollouts (base policy)", "", "| harness | episodes | mean reward | success rate | mean turns |",
              "| --- | ---: | ---: | ---: | ---: |"]
    for h in sorted({e["harness_name"] for e in episodes}):
        es = [e for e in episodes if e["harness_name"] == h]
        lines.append(f"| {h} | {len(es)} | {sum(e['reward'] for e in es) / len(es):.3f} | "
                     f"{sum(e['success'] for e in es) / len(es):.3f} | {sum(e['num_turns'] for e in es) / len(es):.2f} |")
    lines += ["", "## Training steps", "",
              "| arm | step | loss | policy loss | KL | entropy | clip frac | grad norm | tokens/s |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    tps = {(t["arm"], t["step"]): t["tokens_per_s"] for t in timing}
    for s in steps:
        lines.append(f"| {s['arm']} | {s['step']} | {s['loss']:.4f} | {s['policy_loss']:.4f} | {s['kl']:.5f} | {s['entropy']:.3f} | "
                     f"{s['clip_frac']:.3f} | {s['grad_norm']:.3f} | {tps.get((s['arm'], s['step']), float('nan')):.0f} |")
    k = mismatch[0]["ceiling_k"] if mismatch else cfg.analyze.ceiling_k
    lines += ["", f"## Sealed evaluation: pass@1, harness ceiling (pass@{k}) and mismatch", "",
              f"plan `{plan_hash[:16]}`, chain head `{seal_head[:16]}` (`harnessrl verify` recomputes both)", "",
              f"| checkpoint | harness | tasks | graded | infra errors | pass@1 | ceiling pass@{k} | mismatch |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in mismatch:
        lines.append(f"| {r['checkpoint']} | {r['harness_name']} | {r['n_tasks']} | {r['graded']} | {r['infra_errors']} | "
                     f"{r['pass_at_1']:.3f} | {r['ceiling']:.3f} | {r['mismatch']:.3f} |")
    lines += ["", "Mismatch = ceiling - pass@1 (METHODS.md, P1, simple estimator). With few test tasks these "
              "numbers carry wide sampling error; they describe this run, not the model in general.", ""]
    return "\n".join(lines)


def run_analyze(store: ArtifactStore, cfg: RunConfig, inputs: dict[str, ArtifactRef]) -> dict[str, ArtifactRef]:
    """Write the ``mismatch`` table and ``analyze/report.md``."""
    evals = store.rows(inputs["evaluations"])
    rows = mismatch_table(evals, cfg.analyze.ceiling_k)
    ref = store.write("analyze", "mismatch", rows, inputs=[inputs["evaluations"]],
                      config_hash=cfg.section_hash("analyze"))
    head = evals[-1]["seal_hash"] if evals else ""
    plan = evals[0]["plan_hash"] if evals else ""
    timing = store.manifest("train", "train_steps").get("extra", {}).get("timing", [])
    report = render_report(cfg, rows, store.rows(inputs["train_steps"]), timing, store.rows(inputs["episodes"]),
                           head, plan)
    store.write_text(REPORT, report)
    for r in rows:
        log.info("%s / %s: pass@1 %.3f, ceiling pass@%d %.3f, mismatch %.3f", r["checkpoint"], r["harness_name"],
                 r["pass_at_1"], r["ceiling_k"], r["ceiling"], r["mismatch"])
    return {"mismatch": ref}
