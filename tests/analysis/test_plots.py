"""The report's figures: an axis of optimizer steps has ticks on whole steps only."""

import pytest

import tasks.analysis.plots as plots


@pytest.fixture()
def drawn(monkeypatch):
    """The figures the plot functions draw, kept before they are rendered and closed."""
    figs = []
    real = plots._png

    def keep(fig):
        figs.append([(ax.get_xlabel(), list(ax.get_xticks()), ax.get_xlim()) for ax in fig.axes])
        return real(fig)

    monkeypatch.setattr(plots, "_png", keep)
    return figs


def _steps(n):
    return [{"arm": "final", "step": s, "reward_mean": 0.1 * s, "kl": 0.01, "entropy": 0.8, "grad_norm": 0.1,
             "clip_frac": 0.0} for s in range(1, n + 1)]


@pytest.mark.parametrize("n_steps", [2, 3, 7])
def test_step_axes_tick_whole_steps(drawn, n_steps):
    curve = [{"arm": "final", "harness_name": "direct", "step": s, "pass_at_1": 0.2, "ci_low": 0.1, "ci_high": 0.3}
             for s in (0, n_steps)]
    assert plots.learning_curves(_steps(n_steps)) and plots.learning_vs_step(curve, _steps(n_steps))
    axes = [a for fig in drawn for a in fig if "step" in a[0]]
    assert len(axes) == 5 + 2  # five panels of the learning curves, both panels of learning vs step
    for label, ticks, (lo, hi) in axes:
        shown = [t for t in ticks if lo <= t <= hi]
        assert shown and all(float(t).is_integer() for t in shown), (label, shown)


def _png_size(png: bytes) -> tuple[int, int]:
    """(width, height) in pixels from a PNG's IHDR chunk."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def test_ceiling_vs_return_wraps_many_checkpoints_into_rows_of_panels(monkeypatch):
    """Ten checkpoints x five harnesses (P4 v2) draw ten panels of five bars, five a row: a figure
    about twice as wide as tall, not a strip of fifty bars many times wider than tall."""
    hs = ["answer-tag-1shot", "calculator-demo", "direct", "json-answer", "python-demo"]
    rows = [{"checkpoint": f"arm@s{c}", "harness_name": h, "pass_at_1": 0.1 * (i % 5), "ceiling": 0.6,
             "ceiling_k": 2, "ceiling_kl_soft": 0.5} for c in range(10) for i, h in enumerate(hs)]
    panels = []
    real = plots._png

    def keep(fig):
        panels.append([(ax.get_title(), [t.get_text() for t in ax.get_xticklabels()]) for ax in fig.axes
                       if ax.get_visible() and ax.axison])
        return real(fig)

    monkeypatch.setattr(plots, "_png", keep)
    w, h = _png_size(plots.ceiling_vs_return(rows))
    assert [t for t, _ in panels[0]] == [f"arm@s{c}" for c in range(10)]
    assert all(labels == hs for _, labels in panels[0])
    assert 1.2 < w / h < 3.5, (w, h)
    # the KL-soft marker only on a later panel: the figure's legend still names it
    seen = []
    monkeypatch.setattr(plots, "_png", lambda fig: seen.append([t.get_text() for lg in fig.legends
                                                                 for t in lg.get_texts()]) or real(fig))
    plots.ceiling_vs_return([dict(r, ceiling_kl_soft=None if r["checkpoint"] == "arm@s0" else 0.5) for r in rows])
    assert "KL-soft ceiling" in seen[0]
    monkeypatch.setattr(plots, "_png", keep)
    # one checkpoint: one panel
    w1, h1 = _png_size(plots.ceiling_vs_return(rows[:5]))
    assert len(panels[1]) == 1 and w1 < w


def test_learning_vs_step_legend_sits_beside_the_plot_and_steps_plot_has_no_blank_rows(monkeypatch):
    """Forty-five (arm, harness) lines: the legend is drawn beside the held-out axes, not over
    them; the steps figure's first and last cells touch its axes' top and bottom."""
    seen = {}
    real = plots._png

    def keep(fig):
        fig.canvas.draw()
        seen["fig"] = [(ax.get_window_extent(), ax.get_legend().get_window_extent() if ax.get_legend() else None,
                        ax.get_ylim()) for ax in fig.axes]
        return real(fig)

    monkeypatch.setattr(plots, "_png", keep)
    curve = [{"arm": f"arm{a}", "harness_name": f"h{h}", "step": s, "pass_at_1": 0.5, "ci_low": 0.4, "ci_high": 0.6}
             for a in range(9) for h in range(5) for s in (0, 8)]
    plots.learning_vs_step(curve, _steps(8))
    axes_box, legend_box, _ = seen["fig"][1]
    assert legend_box.x0 >= axes_box.x1  # to the right of the plot: it hides no line
    rows = [{"harness_name": "direct", "checkpoint": f"c{i}", "mean_turns_solved": 1.0, "mean_turns_failed": 1.0,
             "failed": 2, "failed_submitted": 2, "failed_max_turns": 0, "failed_max_tokens": 0,
             "failed_format_error": 0, "failed_timeout": 0} for i in range(50)]
    plots.steps_plot(rows)
    assert seen["fig"][0][2] == (49.5, -0.5)  # first cell on top, nothing blank above or below
