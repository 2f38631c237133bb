"""P5's table by enumeration (tasks/train/kl_check.py) and the `harnessrl kl-check` command."""

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from flows.cli import app
from tasks.train.kl_check import PAPER_CLAIMS, check_configuration, kl_check_table

UNBIASED = {"k1/reward", "k1/both", "k3/both", "k1/reward/stale-is", "k3/loss/stale-is"}


@pytest.fixture(scope="module")
def table():
    return {r["configuration"]: r for r in kl_check_table(vocab=3, length=3, samples=20000, seed=1)}


def test_exactly_the_papers_unbiased_configurations_are_unbiased(table):
    assert {n for n, r in table.items() if r["unbiased"]} == UNBIASED
    for n, r in table.items():
        assert r["agrees_with_paper"] is True, n
        if n not in UNBIASED:
            assert r["relative_bias"] > 0.05, n  # biased by a margin, not by rounding


def test_k1_in_loss_has_zero_expected_gradient(table):
    r = table["k1/loss"]
    assert r["expected_grad_norm"] < 1e-12 and r["relative_bias"] == pytest.approx(1.0)


def test_k2_in_loss_is_unbiased_at_token_level_only(table):
    assert table["k2/loss"]["token_level_unbiased"] and not table["k2/loss"]["unbiased"]
    assert {n for n, r in table.items() if r["token_level_unbiased"]} == {"k2/loss"}


def test_monte_carlo_agrees_with_the_exact_expectation(table):
    for n, r in table.items():
        assert r["mc_error_norm"] < 5 * r["mc_se_norm"] + 1e-12, n


def test_the_verdicts_hold_for_other_policies():
    for seed in (3, 4):
        for n in PAPER_CLAIMS:
            r = check_configuration(n, vocab=4, length=2, samples=100, seed=seed)
            assert r["unbiased"] == (n in UNBIASED), (n, seed)


def test_bad_configuration_name():
    with pytest.raises(ValueError, match="k5/loss"):
        check_configuration("k5/loss")


def test_cli_prints_and_writes_parquet(tmp_path):
    res = CliRunner().invoke(app, ["kl-check", "--out", str(tmp_path), "--samples", "500"])
    assert res.exit_code == 0, res.output
    assert "k3/loss/stale-is" in res.output
    t = pq.read_table(tmp_path / "kl_check/kl_check.parquet").to_pylist()
    assert len(t) == len(PAPER_CLAIMS) and {r["configuration"] for r in t if r["unbiased"]} == UNBIASED
