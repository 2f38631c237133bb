"""The analysis tables as the Prefect UI shows them: key columns first, rounded, nothing blank."""

from tasks.analysis.ui_tables import ui_rows


def test_key_columns_first_numbers_rounded_and_nothing_blank():
    rows = [{"kind": "cell", "checkpoint": "base", "train_harnesses": "", "harness_name": "direct", "held_out": False,
             "n_tasks": 16, "graded": 32, "pass_at_1": 0.2857142857142857, "pass_at_k": None, "parse_rate": 1 / 3}]
    (r,) = ui_rows("eval_cells", rows)
    assert list(r)[:4] == ["checkpoint", "harness_name", "pass_at_1", "pass_at_k"]
    assert set(r) == set(rows[0]) and list(r)[-3:] == ["train_harnesses", "n_tasks", "parse_rate"]
    assert r["pass_at_1"] == 0.286 and r["parse_rate"] == 0.333 and r["n_tasks"] == 16 and r["held_out"] is False
    assert r["pass_at_k"] == "n/a" and r["train_harnesses"] == "none"


def test_a_missing_number_points_at_the_rows_reason_and_text_is_escaped():
    rows = [{"target": "gain", "predictor": "C_minus_M", "r2": None, "ci_low": float("nan"), "n_points": 2,
             "na_reason": "2 point(s): an R^2 needs >= 5"}]
    (r,) = ui_rows("predictors", rows)
    assert list(r)[:5] == ["target", "predictor", "r2", "na_reason", "ci_low"]  # the reason beside the value
    assert r["r2"] == r["ci_low"] == "n/a (see na\\_reason)" and r["na_reason"] == "2 point(s): an R^2 needs >= 5"
    assert r["predictor"] == "C\\_minus\\_M"  # as itself in the UI's Markdown
    assert ui_rows("predictors", []) == []
