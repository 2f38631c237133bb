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
