"""The analysis tables as the Prefect UI shows them (table artifacts): the row's key and headline
columns first, numbers rounded, nothing blank.

The UI shows a table artifact's columns in the order of the rows' keys and cuts a wide table at
the window's right edge, so what tells one row from another (checkpoint, harness, arm, ...) and
the number a reader looks for (pass@1, the estimate, R^2, ...) come first (:data:`KEY_COLUMNS`),
every other column after them in the artifact's order. A float is rounded to
:data:`DECIMALS` places; a missing number (None, NaN) is ``n/a (see <column>)`` where the row
says why in a column of its own (``na_reason``, ``note``, ``reason``: among the key columns, so
the reason is in sight), else ``n/a``; an empty text is ``none``. Every string is escaped for the
UI's Markdown (:func:`tasks.analysis.report.md_cell`).
"""

from __future__ import annotations

import math
from typing import Any

from tasks.analysis.report import md_cell

DECIMALS = 3

# artifact name -> its key and headline columns, in the order the UI shows them first
KEY_COLUMNS: dict[str, tuple[str, ...]] = {
    "eval_cells": ("checkpoint", "harness_name", "pass_at_1", "pass_at_k", "k", "graded", "planned", "held_out",
                   "counted"),
    "eval_contrasts": ("name", "estimate", "ci_low", "ci_high", "p_bonferroni", "status", "n_tasks", "mdd"),
    "suite_pass_rates": ("checkpoint", "harness_name", "suite", "pass_at_1", "ci_low", "ci_high", "n_tasks"),
    "training_stability": ("arm", "stable", "reason", "first_reward", "final_reward", "final_kl", "max_kl"),
    "kl_check": ("configuration", "unbiased", "relative_bias", "agrees_with_paper"),
    "mismatch": ("checkpoint", "harness_name", "pass_at_1", "ceiling", "mismatch", "ceiling_kl_soft",
                 "mismatch_step", "predicted_return"),
    "p1_points": ("checkpoint", "harness_name", "gain", "trained_return", "C", "M", "M_step", "C_minus_M_step"),
    "predictors": ("target", "predictor", "r2", "na_reason", "ci_low", "ci_high", "n_points"),
    "log_odds": ("checkpoint", "harness_name", "n_states", "n_pairs", "pearson_policy_ref", "pearson_shift_reward"),
    "leakage": ("rule", "leakage_pp", "ci_low", "ci_high", "p_value", "zero_group_fraction", "note"),
    "action_jsd": ("scope", "checkpoint_a", "harness_a", "checkpoint_b", "harness_b", "jsd_bits"),
    "step_failures": ("checkpoint", "harness_name", "graded", "solved", "failed", "median_turns_solved",
                      "median_turns_failed", "note"),
}
_REASONS = ("na_reason", "note", "reason")


def _cell(value: Any, reason: str) -> Any:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return md_cell(f"n/a (see {reason})" if reason else "n/a")
    if isinstance(value, float):
        return round(value, DECIMALS)
    if isinstance(value, str):
        return md_cell(value) if value.strip() else "none"
    return value


def ui_rows(name: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of the artifact ``name`` for ``prefect.artifacts.create_table_artifact``: each a
    dict whose keys are :data:`KEY_COLUMNS` of ``name`` (those the rows have), then the rest in the
    artifact's order; floats rounded to :data:`DECIMALS` places (``+inf``/``-inf`` kept), a
    missing number ``n/a (see <the row's reason column>)`` (``n/a`` where the row gives no
    reason), an empty string ``none``, every string Markdown-escaped. Other values (ints, bools)
    pass as they are."""
    if not rows:
        return []
    keys = [c for c in KEY_COLUMNS.get(name, ()) if c in rows[0]]
    order = keys + [c for c in rows[0] if c not in keys]
    out = []
    for r in rows:
        reason = next((c for c in _REASONS if isinstance(r.get(c), str) and r[c].strip()), "")
        out.append({c: _cell(r.get(c), reason) for c in order})
    return out
