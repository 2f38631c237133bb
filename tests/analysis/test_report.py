"""The report's tables stay readable in a 1400 px window: long cells become notes, wide tables
split into column groups that repeat the row labels, and nothing is lost."""

from tasks.analysis.report import (LONG_CELL, TABLE_BUDGET_PX, ReportInputs, _col_px, _table, inline_figures,
                                   render_report)
from tasks.talkmesh.pipeline_report import talkmesh_section


def test_long_cells_become_numbered_notes_and_repeat_once():
    reason = "5 point(s): an R^2 needs >= 5 (two points always fit a line exactly)"
    out = _table(["target", "R^2", "why"], [["gain", "n/a", reason], ["return", "n/a", reason], ["x", "0.5", ""]],
                 keep=1)
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
    assert len([ln for ln in _table(header[:5], [r[:5] for r in rows], keep=2) if ln.startswith("| checkpoint")]) == 1


def test_inline_figures_embeds_pngs_and_says_when_one_is_missing():
    png = b"\x89PNG\r\n\x1a\n" + b"x" * 10
    md = "a\n\n![R^2 comparison](plots/r2.png)\n\n![gone](plots/gone.png)\n"
    out = inline_figures(md, lambda rel: png if rel == "plots/r2.png" else None)
    assert "![R^2 comparison](data:image/png;base64,iVBORw0KGgp4eHh4eHh4eHh4)" in out
    assert "plots/r2.png" not in out and "figure plots/gone.png is missing" in out
    assert "not inlined" in inline_figures(md, lambda rel: png, max_bytes=4)


def _groups(markdown: str, first: str) -> list[list[list[str]]]:
    """The tables of ``markdown`` whose header starts with the column ``first``: each a list of
    rows (header first, the separator left out), each row its stripped cells."""
    out, cur = [], None
    for ln in markdown.splitlines():
        cells = [c.strip() for c in ln.strip().strip("|").split("|")] if ln.startswith("|") else None
        if cells is None:
            cur = None
        elif cur is None:
            cur = [cells] if cells[0] == first else None
            if cur is not None:
                out.append(cur)
        elif not set(ln.replace("|", "").strip()) <= set("-: "):
            cur.append(cells)
    return out


def _inputs(**over):
    base = dict(run_name="r", config_hash="0" * 64, model="m", plan_hash="1" * 64, seal_head="2" * 64,
                episodes=[], train_steps=[], timing=[], eval_cells=[], eval_contrasts=[], mismatch=[])
    return ReportInputs(**{**base, **over})


def test_every_group_of_the_training_table_carries_arm_and_step():
    # 3 steps of two arms, each with its own tokens/s: the table is wider than the budget, so
    # tokens/s lands in a second group, which must say which arm and which step each number is
    steps = [{"arm": arm, "step": s, "reward_mean": 0.5, "loss": 0.1, "kl": 0.001, "entropy": 1.0, "clip_frac": 0.0,
              "zero_adv_frac": 0.25, "grad_norm": 1.5} for arm in ("a", "final") for s in (1, 2, 3)]
    timing = [{"arm": arm, "step": s, "tokens_per_s": 100.0 * s + (7 if arm == "a" else 0)}
              for arm in ("a", "final") for s in (1, 2, 3)]
    groups = _groups(render_report(_inputs(train_steps=steps, timing=timing)), "arm")
    training = [g for g in groups if "step" in g[0]]
    assert len(training) == 2  # split: tokens/s in the second group
    for g in training:
        assert g[0][:2] == ["arm", "step"]
    tps = training[1]
    assert tps[0] == ["arm", "step", "tokens/s"]
    assert tps[1:] == [["a", "1", "107"], ["a", "2", "207"], ["a", "3", "307"],
                       ["final", "1", "100"], ["final", "2", "200"], ["final", "3", "300"]]


def test_split_action_jsd_and_talkmesh_tables_repeat_their_whole_key():
    # checkpoint and harness names of 27-28 characters (just under LONG_CELL, so they stay in the
    # cells) make both tables wider than the budget
    ck, h = "step-000015-arm-kl-in-reward", "react-python-skill-file-long"
    assert len(f"{ck[:12]} / {h[:12]}") < len(ck) == len(h) == LONG_CELL
    jsd = [{"scope": "across_harness", "checkpoint_a": ck[:12], "harness_a": f"{h[:11]}{i}", "checkpoint_b": ck[:12],
            "harness_b": f"{h[:11]}{i + 1}", "jsd_bits": 0.1 * i, "n_a": 10, "n_b": 12} for i in range(3)]
    tables = _groups(render_report(_inputs(action_jsd=jsd)), "scope")
    assert len(tables) >= 2
    for t in tables:
        assert t[0][:3] == ["scope", "a", "b"]
        assert [r[:3] for r in t[1:]] == [["across harness", f"{ck[:12]} / {h[:11]}{i}", f"{ck[:12]} / {h[:11]}{i + 1}"]
                                          for i in range(3)]
    evals = [{"harness_name": h, "checkpoint": c, "status": "resolved", "resolved": True, "num_turns": 3,
              "eval_id": f"{c}-{i}"} for c in ("base", ck) for i in range(2)]
    mesh = _groups(talkmesh_section([], evals, [], [h]), "harness")
    assert len(mesh) >= 2
    for t in mesh:
        assert t[0][:2] == ["harness", "checkpoint"] and [r[:2] for r in t[1:]] == [[h, "base"], [h, ck]]


TRICKY = ["*", "-", "- x", "+", "1. first", "2)", "## h", "> q", "---", "a|b", "a\\b", "x_y_z", "*em*", "_u_",
          "`code`", "~~s~~", "<think>", "a &amp; b"]


def test_md_cell_renders_as_its_text_alone_and_in_a_table_cell():
    import html

    from markdown_it import MarkdownIt

    from tasks.analysis.report import md_cell

    md = MarkdownIt("commonmark").enable("table").enable("strikethrough")
    for t in TRICKY:
        alone = md.render(md_cell(t))
        assert alone == f"<p>{html.escape(t, quote=False)}</p>\n", (t, alone)  # a paragraph of the text itself
    assert [md_cell(t) for t in ("-0.5", "[0.1, 0.3]", "1.5", "n/a")] == ["-0.5", "[0.1, 0.3]", "1.5", "n/a"]
    assert md_cell("a\nb ") == "a b"
    rendered = md.render("\n".join(_table(["name", "value"], [[t, "1"] for t in TRICKY], keep=1)))
    cells = [c.split("</td>")[0] for c in rendered.split("<td>")[1:]]  # the value cells are <td style=...>
    assert cells == [html.escape(t, quote=False) for t in TRICKY]


def test_report_cells_escape_data_and_keep_their_own_markdown():
    stability = [{"arm": "k3_*", "steps": 2, "first_reward": 0.1, "final_reward": 0.2, "final_kl": 0.01, "max_kl": 0.02,
                  "stable": False, "reason": "KL > 1 | nan"}]
    md = render_report(_inputs(stability=stability))
    rows = [ln for ln in md.splitlines() if ln.startswith("| k3")]  # the table splits: one row per group
    assert len(rows) == 2 and all(r.startswith("| k3\\_\\* |") for r in rows)
    assert rows[-1].endswith("| **no**: KL > 1 \\| nan |")


def test_the_rollout_table_shows_pass_at_1_parse_rate_and_accuracy_given_parsed():
    def ep(h, success, parsed):
        return {"harness_name": h, "reward": float(success), "success": success, "answer_parsed": parsed, "num_turns": 1}

    # direct declares the last-number fallback: one success is graded from an unparsed answer
    eps = [ep("direct", True, True), ep("direct", False, True), ep("direct", False, True), ep("direct", True, False),
           ep("boxed", True, False), ep("boxed", False, False)]
    table = _groups(render_report(_inputs(episodes=eps)), "harness")[0]  # the first: training rollouts
    header, *rows = table
    got = {r[0]: dict(zip(header, r)) for r in rows}
    assert header[3:6] == ["pass@1", "parse rate", "accuracy given parsed"]
    assert [got["direct"][k] for k in header[3:6]] == ["0.500", "0.750", "0.333"]
    # nothing parsed: accuracy given parsed is undefined, not 0
    assert [got["boxed"][k] for k in header[3:6]] == ["0.500", "0.000", "n/a (no answer parsed)"]


def _pred(target, predictor, reason, r2=None):
    return {"target": target, "predictor": predictor, "n_points": 2, "r2": r2, "ci_low": None, "ci_high": None,
            "slope": None, "na_reason": reason}


def test_an_undefined_statistic_says_why_and_a_note_is_printed_once():
    """The R^2 table of undefined R^2s: every cell n/a with its numbered reason (no blank interval or
    slope); the rank table reuses the R^2 table's notes instead of printing them again."""
    reason = "2 point(s): an R^2 needs >= 5 (two points always fit a line exactly)"
    points = [{"checkpoint": "final", "harness_name": h, "reference": "base", "ref_pass_at_1": 0.1, "C": c,
               "C_kl_soft": c, "M": 0.1, "M_step": None, "C_minus_M": 0.1, "C_minus_M_step": None, "gain": g,
               "trained_return": 0.2} for h, c, g in (("direct", 0.3, 0.1), ("react", 0.2, -0.1))]
    report = render_report(_inputs(predictors=[_pred("gain", "C", reason)], p1_points=points))
    r2 = _groups(report, "target")[0]
    assert r2[0] == ["target", "predictor", "points", "R^2", "interval", "slope"]
    assert r2[1] == ["gain", "C", "2", "n/a [1]", "n/a [1]", "n/a [1]"]
    assert report.count("an R^2 needs") == 1
    assert report.count("[1] 2 point(s)") == 1 and "[1]: see the note above" in report
    assert not [ln for ln in report.splitlines() if ln.startswith("|") and "|  |" in ln]


def test_the_leakage_table_has_no_blank_note_column():
    row = {"rule": "within", "zero_groups": 3, "n_groups": 8, "zero_group_fraction": 0.375, "accuracy": None,
           "null_mean": None, "leakage_pp": None, "ci_low": None, "ci_high": None, "p_value": None,
           "note": "leakage not computable: one class only"}
    ok = {**row, "rule": "cross", "accuracy": 0.6, "null_mean": 0.5, "leakage_pp": 10.0, "ci_low": 1.0,
          "ci_high": 20.0, "p_value": 0.03, "note": ""}
    groups = _groups(render_report(_inputs(leakage=[row, ok])), "rule")
    table = [sum((g[i][1:] for g in groups[1:]), groups[0][i]) for i in range(3)]  # the column groups side by side
    assert table[0] == ["rule", "zero groups", "fraction", "accuracy", "null", "leakage (pp)", "interval", "p"]
    assert table[1][:3] == ["within", "3/8", "0.375"] and set(table[1][3:]) == {"n/a [1]"}
    assert table[2] == ["cross", "3/8", "0.375", "0.600", "0.500", "10.00", "[1.00, 20.00]", "0.030"]
