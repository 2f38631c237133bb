"""The report's tables stay readable in a 1400 px window: long cells become notes, wide tables
split into column groups that repeat the row labels, and nothing is lost."""

from tasks.analysis.report import LONG_CELL, TABLE_BUDGET_PX, _col_px, _table, inline_figures


def test_long_cells_become_numbered_notes_and_repeat_once():
    reason = "5 point(s): an R^2 needs >= 5 (two points always fit a line exactly)"
    out = _table(["target", "R^2", "why"], [["gain", "n/a", reason], ["return", "n/a", reason], ["x", "0.5", ""]])
    assert out[2] == "| gain | n/a | [1] |" and out[3] == "| return | n/a | [1] |"
    assert out[-1] == f"[1] {reason}  " and sum(reason in line for line in out) == 1
    assert len("[1]") <= LONG_CELL < len(reason)


def test_a_wide_table_splits_into_groups_that_repeat_the_labels():
    header = ["checkpoint", "harness"] + [f"statistic {i}" for i in range(12)]
    rows = [["final", "react-python"] + [f"{0.1 * i:.3f}" for i in range(12)]]
    out = _table(header, rows, "ll" + "r" * 12, keep=2)
    tables = [ln for ln in out if ln.startswith("| checkpoint | harness |")]
    assert len(tables) >= 2  # split
    cells = [c.strip() for ln in out if ln.startswith("| final") for c in ln.strip("|").split("|")]
    assert cells.count("final") == len(tables) and [c for c in cells if c not in ("final", "react-python")] == rows[0][2:]
    for ln in tables:  # each group within the budget
        cols = [c.strip() for c in ln.strip("|").split("|")]
        assert sum(_col_px([c, "0.000"]) for c in cols) <= TABLE_BUDGET_PX
    assert len([ln for ln in _table(header[:5], [r[:5] for r in rows]) if ln.startswith("| checkpoint")]) == 1


def test_inline_figures_embeds_pngs_and_says_when_one_is_missing():
    png = b"\x89PNG\r\n\x1a\n" + b"x" * 10
    md = "a\n\n![R^2 comparison](plots/r2.png)\n\n![gone](plots/gone.png)\n"
    out = inline_figures(md, lambda rel: png if rel == "plots/r2.png" else None)
    assert "![R^2 comparison](data:image/png;base64,iVBORw0KGgp4eHh4eHh4eHh4)" in out
    assert "plots/r2.png" not in out and "figure plots/gone.png is missing" in out
    assert "not inlined" in inline_figures(md, lambda rel: png, max_bytes=4)
