"""An estimate of a sealed BiPA config's wall time from measured unit costs, before the run.

    .venv/bin/python benchmarks/bipa_budget.py configs/p2-findings.yaml
    .venv/bin/python benchmarks/bipa_budget.py configs/p2-findings.yaml --measured runs/p2-findings-<hash>
    .venv/bin/python benchmarks/bipa_budget.py configs/p2-findings.yaml --measured RUN --append   # a row to
                                                               # benchmarks/results/bipa_budget.jsonl

It runs nothing. It counts the episodes the config plans (:func:`tasks.bipa.budget.planned_work`)
and prices each at the tool-loop episode cost of ``benchmarks/findings_budget.py`` (the P6 rerun's
rollout rate on 2 idle AMD EPYC cores: react-python-skill, batched). With ``--measured RUN`` it
also prices them at the seconds per episode that run's steps took (``bipa/timing.json``, e.g. a
``--quick`` run: small batches, so an upper side). Not priced: freezing, the engine's start, the
proposer's rewrites (one generate call per round).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.findings_budget import unit_costs  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config", nargs="?")
    ap.add_argument("--quick", action="store_true", help="the config's --quick sizes")
    ap.add_argument("--smoke", action="store_true", help="configs/p2-findings.yaml --quick, its row appended")
    ap.add_argument("--measured", type=Path, help="a finished run folder of a BiPA findings config")
    ap.add_argument("--append", action="store_true", help="append the row to benchmarks/results/bipa_budget.jsonl")
    args = ap.parse_args()
    if args.smoke:
        args.config, args.quick, args.append = "configs/p2-findings.yaml", True, True
    if not args.config:
        ap.error("name a config (or --smoke)")
    from tasks.bipa.budget import planned_work
    from tasks.bipa.config import load_bipa_config

    cfg = load_bipa_config(args.config, quick=args.quick)
    w = planned_work(cfg)
    unit = unit_costs()["sample_tool"]
    out = {"config": args.config, "quick": args.quick, "smoke": args.smoke, **w, "s_per_episode_p6": round(unit, 3),
           "estimate_s": round(w["episodes"] * unit, 1), "estimate_min": round(w["episodes"] * unit / 60, 1)}
    if args.measured is not None:
        timing = json.loads((args.measured / "bipa" / "timing.json").read_text())
        steps = [json.loads(p.read_text()) for p in sorted((args.measured / "bipa" / "steps").glob("*.json"))]
        eps = sum(r["kind"] == "episode" for s in steps for r in s["rows"])
        rate = timing["seconds"] / eps
        out.update(measured_run=str(args.measured), measured_episodes=eps, measured_s=timing["seconds"],
                   s_per_episode_measured=round(rate, 3), estimate_measured_min=round(w["episodes"] * rate / 60, 1))
    if args.append:
        from benchmarks._results import report

        report("bipa_budget", {"kind": "estimate", **out})
    else:
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
