"""Adding to the trainer is one registration, in this file: a toy KL estimator, a toy loss
aggregation and a toy advantage estimator are registered here (tasks/registries) and nowhere else,
and the config, the trainer, the ``kl_check`` contract and ``harnessrl kl-check`` accept them
while they are registered, and refuse them once they are not."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
import torch
from pydantic import ValidationError
from typer.testing import CliRunner

from flows.cli import app
from schemas import ArtifactError, ArtifactStore
from tasks.config import RunConfig
from tasks.registries import (ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, LOSS_AGGREGATIONS, AdvantageEstimator,
                              KLEstimator, LossAggregation, Registry)
from tasks.train.advantages import group_advantages
from tasks.train.batches import plan_groups
from tasks.train.kl import kl_estimate
from tasks.train.kl_check import PAPER_CLAIMS, check_configuration, kl_check_table
from tasks.train.losses import agg_loss, policy_loss
from tasks.train.sequences import TrainSequence
from tasks.train.trainer import Trainer

# k1 shifted by one nat per token. Its claims follow by hand: in the reward a constant per token
# adds L * grad log pi(y), whose expectation is 0 (on-policy, and importance-weighted), so it is
# unbiased where k1 is; in the loss the constant has no gradient, so it is k1's pathwise term,
# whose expectation is 0 (biased), and both = reward + loss is unbiased again.
K_TOY = KLEstimator("k_toy", lambda log_r: -log_r + 1.0, summary="k1 + 1 nat", unbiased={
    "reward": True, "loss": False, "both": True, "reward/stale": False, "reward/stale-is": True})
# every masked term summed, no denominator
TOKEN_SUM = LossAggregation("token_sum", lambda v, m, *, max_len, num_tokens, num_seqs: v.sum(), source="toy")
# every masked term summed over max_len: needs train.max_len
TOKEN_SUM_NORM = LossAggregation("token_sum_norm", lambda v, m, *, max_len, num_tokens, num_seqs: v.sum() / max_len,
                                 needs_max_len=True, source="toy sum")
# leave-one-out baseline (RLOO, Ahmadian et al. 2024): A_i = r_i - mean_{j != i} r_j
RLOO = AdvantageEstimator("rloo", lambda rg, eps: (rg - (rg.sum() - rg) / (rg.numel() - 1)), source="RLOO")


@pytest.fixture
def toys():
    with KL_ESTIMATORS.added(K_TOY), LOSS_AGGREGATIONS.added(TOKEN_SUM), LOSS_AGGREGATIONS.added(TOKEN_SUM_NORM), \
            ADVANTAGE_ESTIMATORS.added(RLOO):
        yield


def _cfg(model_dir="smollm2-135m-instruct", **train):
    t = {"lr": 0.05, "micro_batch_size": 3, "lora": {"r": 4, "alpha": 8}, **train}
    return RunConfig.model_validate({"name": "t", "suites": [{"name": "basic_arithmetic", "size": 2}],
                                     "harnesses": ["direct"], "policy": {"model": str(model_dir)}, "train": t})


def _seqs(n=6, group=3):
    """``n`` sequences in groups of ``group``, rewards 1, 0, 0, 1, 0, 0, ..."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        prompt, comp = torch.randint(5, 500, (4 + i % 3,), generator=g).tolist(), \
            torch.randint(5, 500, (2 + (i * 5) % 7,), generator=g).tolist()
        out.append(TrainSequence(
            episode_id=f"e{i}", ids=prompt + comp, mask=[0] * len(prompt) + [1] * len(comp),
            behaviour_logp=[0.0] * len(prompt) + [-2.0] * len(comp), reward=float(i % 3 == 0), task_id=f"t{i // group}",
            task_hash=f"h{i // group}", harness_id="H", sampling_key=(1.0, 0, 1.0), policy_version=0))
    return out


def _first_step(model_dir, **train):
    tr = Trainer(_cfg(model_dir, **train), model_dir, log=lambda _m: None)
    b = tr.new_batch(_seqs())
    row, _ = tr.step(b, b.layout[0])
    return row


def test_the_config_accepts_a_registered_name_and_refuses_it_once_removed(toys):
    tc = _cfg(kl={"estimator": "k_toy"}, agg="token_sum", advantage_scale="rloo").train
    assert (tc.kl.estimator, tc.agg, tc.advantage_scale) == ("k_toy", "token_sum", "rloo")
    with pytest.raises(ValidationError, match=r"train.agg='token_sum_norm' \(toy sum\) needs train.max_len"):
        _cfg(agg="token_sum_norm")
    assert _cfg(agg="token_sum_norm", max_len=64).train.max_len == 64
    KL_ESTIMATORS.unregister("k_toy")
    try:
        with pytest.raises(ValidationError, match=r"train.kl.estimator='k_toy' is not one of \('k1', 'k2', 'k3'\)"):
            _cfg(kl={"estimator": "k_toy"})
    finally:
        KL_ESTIMATORS.register(K_TOY)


def test_without_the_toys_the_config_refuses_them():
    for train, key in (({"kl": {"estimator": "k_toy"}}, "train.kl.estimator"), ({"agg": "token_sum"}, "train.agg"),
                       ({"advantage_scale": "rloo"}, "train.advantage_scale")):
        with pytest.raises(ValidationError, match=key.replace(".", r"\.")):
            _cfg(**train)


def test_the_math_reads_the_registry(toys):
    logp, ref = torch.tensor([[-1.0, -2.0, -0.5]]), torch.tensor([[-1.5, -1.0, -0.5]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    assert torch.equal(kl_estimate(logp, ref, "k_toy", mask=mask), (kl_estimate(logp, ref, "k1") + 1.0) * mask)
    values = torch.tensor([[1.0, 2.0, float("nan")], [4.0, 0.0, 0.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert float(agg_loss(values, m, "token_sum")) == 7.0  # the masked NaN never reaches the toy
    loss, _ = policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.tensor([1.0, -2.0]), m, agg="token_sum")
    assert float(loss) == -(2 * 1.0) + 1 * 2.0  # ratio 1: -A per masked token, summed
    r, groups = [0.0, 1.0, 1.0, 3.0, 5.0], ["a", "a", "a", "b", "b"]
    want = [0.0 - 1.0, 1.0 - 0.5, 1.0 - 0.5, 3.0 - 5.0, 5.0 - 3.0]
    assert group_advantages(r, groups, scale="rloo").tolist() == want
    plan = plan_groups(r, ["t1", "t1", "t1", "t2", "t2"], ["H"] * 5, "within", scale="rloo")
    assert plan.advantages(torch.tensor(r, dtype=torch.float64), range(5)).tolist() == want


def test_the_trainer_trains_with_the_toys(toys, tiny_model_dir):
    kl = {"placement": "loss", "beta": 0.1}
    k1, toy = (_first_step(tiny_model_dir, kl={"estimator": e, **kl}) for e in ("k1", "k_toy"))
    # one more nat per token: the token-mean KL and the loss (beta times the token mean) shift by
    # exactly that, and the gradient, which a constant does not have, is k1's
    assert toy["kl"] == pytest.approx(k1["kl"] + 1.0, abs=1e-6)
    assert toy["loss"] == pytest.approx(k1["loss"] + 0.1, abs=1e-6)
    assert toy["grad_norm"] == pytest.approx(k1["grad_norm"], rel=1e-6) and toy["grad_norm"] > 0
    # RLOO advantages and the summed aggregation: at ratio 1 the policy loss is -sum_i A_i T_i
    # (T_i the policy tokens of sample i); the KL term is beta times the summed estimate
    row = _first_step(tiny_model_dir, kl={"estimator": "k_toy", **kl}, agg="token_sum", advantage_scale="rloo")
    seqs = _seqs()
    adv = [1.0, -0.5, -0.5] * 2  # rewards 1, 0, 0 in each group: r_i - mean of the other two
    want = -sum(a * sum(s.mask[1:]) for a, s in zip(adv, seqs))
    assert want == 8.0 and row["policy_loss"] == pytest.approx(want, rel=1e-6)
    assert row["loss"] == pytest.approx(row["policy_loss"] + 0.1 * row["kl"] * row["tokens"], rel=1e-5)


def test_kl_check_verifies_the_toy_claims_and_the_contract_takes_its_rows(toys, tmp_path):
    assert [n for n in PAPER_CLAIMS if n.startswith("k_toy/")] == [f"k_toy/{c}" for c in K_TOY.unbiased]
    rows = kl_check_table(vocab=3, length=2, samples=500, seed=1)
    # the toy's rows after the built-ins' on-policy ones, and its stale ones last
    assert [r["configuration"] for r in rows][9:12] == ["k_toy/reward", "k_toy/loss", "k_toy/both"]
    assert [r["configuration"] for r in rows][-2:] == ["k_toy/reward/stale", "k_toy/reward/stale-is"]
    toy = {r["configuration"].removeprefix("k_toy/"): r for r in rows if r["estimator"] == "k_toy"}
    # by enumeration, the claims made by hand above hold
    assert {n: r["unbiased"] for n, r in toy.items()} == dict(K_TOY.unbiased)
    assert all(r["agrees_with_paper"] for r in toy.values())
    assert toy["loss"]["relative_bias"] == pytest.approx(1.0)  # the constant leaves k1's zero expected gradient
    ref = ArtifactStore(tmp_path / "a").write("kl_check", "kl_check", rows, config_hash="")
    assert ref.rows == len(rows) == 13 + 5
    res = CliRunner().invoke(app, ["kl-check", "--out", str(tmp_path / "cli"), "--samples", "300"])
    assert res.exit_code == 0, res.output
    assert "k_toy/both" in res.output
    written = pq.read_table(tmp_path / "cli/kl_check/kl_check.parquet").to_pylist()
    assert sum(r["estimator"] == "k_toy" for r in written) == 5
    KL_ESTIMATORS.unregister("k_toy")
    try:  # the contract reads the registry when it checks: without the toy its rows break it
        with pytest.raises(ArtifactError, match=r"in_set on column 'estimator': rows \[9, 10, 11, 16, 17\]"):
            ArtifactStore(tmp_path / "b").write("kl_check", "kl_check", rows, config_hash="")
        with pytest.raises(ValueError, match=r"'k_toy/reward' is not '<k1\|k2\|k3>/"):
            check_configuration("k_toy/reward")
    finally:
        KL_ESTIMATORS.register(K_TOY)


def test_a_registry_refuses_a_taken_or_malformed_name_and_a_bad_claim():
    reg: Registry[KLEstimator] = Registry("KL estimator", "train.kl.estimator")
    reg.register(K_TOY)
    with pytest.raises(ValueError, match="'k_toy' is already registered"):
        reg.register(K_TOY)
    with pytest.raises(ValueError, match="without '/'"):
        reg.register(KLEstimator("k/1", K_TOY.per_token))
    with pytest.raises(ValueError, match=r"^KL estimator 'k9' is not one of \('k_toy',\)$"):
        reg.get("k9")
    with pytest.raises(ValueError, match="claim 'loss/late'"):
        KLEstimator("k_bad", K_TOY.per_token, unbiased={"loss/late": True})
    assert reg.unregister("k_toy") is K_TOY and len(reg) == 0 and "k_toy" not in reg
