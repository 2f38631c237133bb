"""P5's beta: read a finished ``configs/p5-beta-pilot.yaml`` run and apply the rule fixed before
it ran (docs/experiments/findings-rules.md, "Choosing P5's beta"; :func:`tasks.analysis.arms.choose_kl_beta`).

    .venv/bin/harnessrl run -c configs/p5-beta-pilot.yaml
    .venv/bin/python benchmarks/p5_beta_pilot.py [--run-dir runs/p5-beta-pilot-<hash>]
    .venv/bin/python benchmarks/p5_beta_pilot.py --smoke   # the pilot's --quick on the tests' tiny model (hf), then the rule
    .venv/bin/python benchmarks/p5_beta_pilot.py --config configs/p5-beta-pilot-v2.yaml   # the second pilot

Prints each arm's late KL and final reward and the chosen beta, and appends one JSON row to
``benchmarks/results/p5_beta_pilot.jsonl``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import report  # noqa: E402

CONFIG = "configs/p5-beta-pilot.yaml"
#: each pilot's rule, fixed before it ran (docs/experiments/findings-rules.md, "Choosing P5's beta"),
#: by the config's ``name``: the steps averaged per arm, the share of the anchor's drift a chosen
#: beta keeps, the least anchor drift (nats per token) at which the rule can be met
RULES = {"p5-beta-pilot": {"last": 3, "ratio": 0.5, "min_anchor_kl": 0.0},
         "p5-beta-pilot-v2": {"last": 5, "ratio": 0.5, "min_anchor_kl": 0.01}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("--run-dir", default=None, help="the pilot's run folder (default: RUN_ROOT/NAME-CONFIGHASH)")
    ap.add_argument("--anchor-beta", type=float, default=0.001)
    ap.add_argument("--smoke", action="store_true",
                    help="run the pilot's --quick version on the tests' tiny model with the hf engine first")
    args = ap.parse_args()

    from schemas import ArtifactStore
    from schemas.store import ArtifactError
    from tasks.analysis.arms import choose_kl_beta, training_stability
    from flows.naming import run_label
    from tasks.config import load_config

    if args.smoke:
        import tempfile

        from _results import tiny_model

        tmp = Path(tempfile.mkdtemp(prefix="p5-pilot-smoke-"))
        cfg = load_config(args.config, {"policy.model": str(tiny_model(tmp / "model")), "policy.engine": "hf",
                                        "run_root": str(tmp)}, quick=True)
        from flows.pipeline import pipeline

        pipeline(cfg, str(tmp / run_label(cfg)), None)
    else:
        cfg = load_config(args.config)
    run_dir = Path(args.run_dir or Path(cfg.run_root) / run_label(cfg))
    store = ArtifactStore(run_dir)
    try:
        steps = store.rows(store.ref("train", "train_steps"))
    except ArtifactError as e:
        sys.exit(f"{run_dir}: cannot read train/train_steps ({e}); has the pilot's train stage finished?")
    if cfg.name not in RULES:
        sys.exit(f"config name {cfg.name!r}: no pilot rule for it (known: {sorted(RULES)})")
    rule = RULES[cfg.name]
    beta_of = {name: tc.kl.beta for name, tc in cfg.arm_configs()}  # one arm per (beta, training seed)
    anchors = [a for a, b in beta_of.items() if b == args.anchor_beta]
    if not anchors:
        sys.exit(f"--anchor-beta {args.anchor_beta}: no arm trains at it ({beta_of})")
    got = choose_kl_beta(steps, beta_of, anchors[0], **rule)
    stable = {r["arm"]: r for r in training_stability(steps, cfg.analyze.divergence_kl)}
    arms = [{"arm": a, "beta": beta_of[a], "late_kl": got["late_kl"][a], "final_reward": stable[a]["final_reward"],
             "stable": stable[a]["stable"]} for a in beta_of]
    for b, kl in got["beta_kl"].items():
        held = got["held"].get(b)
        print(f"beta {b:g}: L {kl:.5f} nats/token" + ("" if held is None else f" ({held:.2f} x the anchor's)"))
    print(f"chosen beta {got['beta']:g}; rule met: {got['rule_met']}; anchor drifted: {got['anchor_drifted']}")
    report("p5_beta_pilot", {"config": args.config, "config_hash": cfg.config_hash(), "run_dir": str(run_dir),
                             "steps": cfg.train.steps, "anchor_beta": args.anchor_beta, "arms": arms, "rule": rule,
                             "beta_kl": {str(b): v for b, v in got["beta_kl"].items()},
                             "held": {str(b): v for b, v in got["held"].items()},
                             "anchor_drifted": got["anchor_drifted"],
                             "chosen_beta": got["beta"], "rule_met": got["rule_met"], "smoke": args.smoke})


if __name__ == "__main__":
    main()
