"""Analysis tables read from the run's rows and its config, without a model: the Within vs Cross
leakage rows, what the report shows of each training arm, and the KL-soft ceiling's beta."""

from __future__ import annotations

from typing import Any

from tasks.config import RunConfig

#: the grouping rules the ``leakage`` table compares
RULES = ("within", "cross")


def kl_beta(cfg: RunConfig) -> float | None:
    """The beta of the KL-soft ceiling: ``analyze.kl_beta`` (default 1.0, chosen for the ceiling;
    never the trainer's ``train.kl.beta``; None: no soft ceiling)."""
    return cfg.analyze.kl_beta


def leakage_rows(episodes: list[dict[str, Any]], cfg: RunConfig) -> list[dict[str, Any]]:
    """Rows of the ``leakage`` artifact: per grouping rule, the zero-advantage groups of the
    training rollouts and the harness-identity leakage (null with a note when not computable)."""
    from tasks.analysis.leakage import harness_leakage, zero_advantage_fractions

    scale = cfg.train.advantage_scale
    zero = {z["rule"]: z for z in zero_advantage_fractions(episodes, rules=RULES, scale=scale, seed=cfg.analyze.seed)}
    out = []
    for rule in RULES:
        z = zero[rule]
        row: dict[str, Any] = {"rule": rule, "n_groups": z["n_groups"], "zero_groups": z["zero_groups"],
                               "zero_group_fraction": z["fraction"], "zero_sample_fraction": z["sample_fraction"],
                               "n_samples": z["n_samples"], "folds": cfg.analyze.leakage.folds,
                               "permutations": cfg.analyze.leakage.permutations, "note": ""}
        try:
            lk = harness_leakage(episodes, rule, folds=cfg.analyze.leakage.folds,
                                 permutations=cfg.analyze.leakage.permutations, seed=cfg.analyze.seed, scale=scale)
        except ValueError as e:
            row.update({k: None for k in ("n_classes", "chance", "accuracy", "null_mean", "null_sd", "leakage_pp",
                                          "ci_low", "ci_high", "p_value")})
            row["note"] = f"leakage not computable: {e}"
        else:
            row.update({k: lk[k] for k in ("n_classes", "chance", "accuracy", "null_mean", "null_sd", "leakage_pp",
                                           "p_value", "folds")})
            row.update({"ci_low": lk["ci_low_pp"], "ci_high": lk["ci_high_pp"]})
        out.append(row)
    return out


def arm_spec(name: str, tc: Any) -> dict[str, Any]:
    """What the report shows of a training arm: objective, KL estimator and placement, beta,
    sampling regime, and the row of P5's estimator table (``kl_check``) that describes it."""
    stale = tc.mode == "online" and tc.max_staleness > 0
    kl_on = tc.kl.beta > 0
    config = (f"{tc.kl.estimator}/{tc.kl.placement}" + ("/stale-is" if stale and tc.kl.importance_weighted else
                                                        "/stale" if stale else "")) if kl_on else ""
    return {"arm": name, "algorithm": tc.algorithm, "grouping": tc.grouping, "estimator": tc.kl.estimator if kl_on else "",
            "placement": tc.kl.placement if kl_on else "", "beta": tc.kl.beta, "mode": tc.mode,
            "max_staleness": tc.max_staleness, "importance_weighted": tc.kl.importance_weighted, "kl_config": config}
