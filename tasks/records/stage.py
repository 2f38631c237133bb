"""The freeze stage: config -> ``tasks``, ``harnesses``, ``records`` and ``split_overlap`` artifacts."""

from __future__ import annotations

import logging

from schemas import ArtifactRef, ArtifactStore
from tasks.config import RunConfig
from tasks.records.freeze import freeze_tables
from tasks.records.overlap import overlap_rows

log = logging.getLogger("harnessrl.freeze")


def run_freeze(store: ArtifactStore, cfg: RunConfig, inputs: dict[str, ArtifactRef]) -> dict[str, ArtifactRef]:
    """Freeze the configured suites x harnesses. ``inputs`` is empty (freeze reads only the config)."""
    tasks, harnesses, records = freeze_tables(cfg)
    ch = cfg.section_hash("suites", "split", "harnesses", "evaluate")
    t = store.write("freeze", "tasks", tasks, config_hash=ch)
    h = store.write("freeze", "harnesses", harnesses, config_hash=ch)
    r = store.write("freeze", "records", records, inputs=[t, h], config_hash=ch)
    overlap = overlap_rows(tasks, cfg.split.disjoint)
    o = store.write("freeze", "split_overlap", overlap, inputs=[t], config_hash=ch)
    for row in overlap:
        if row["n_test"]:
            log.info("split of %s: %d train, %d test; test tasks sharing a prompt with train %d, a problem %d%s",
                     row["suite"], row["n_train"], row["n_test"], row["test_same_prompt"], row["test_same_problem"],
                     " (split.disjoint)" if row["disjoint"] else "")
    n_test = sum(1 for x in tasks if x["split"] == "test")
    log.info("froze %d tasks (%d train, %d test) x %d harnesses = %d records", len(tasks), len(tasks) - n_test,
             n_test, len(harnesses), len(records))
    return {"tasks": t, "harnesses": h, "records": r, "split_overlap": o}
