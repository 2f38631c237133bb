"""Loss aggregations (``train.agg``): how per-token loss terms become one scalar, the same for the
policy loss and the in-loss KL term (:func:`tasks.train.losses.agg_loss` masks and calls them).

Notation (docs/methods/index.md): L the per-token terms, m_t the loss mask (1 = a token the policy
generated).

- ``token_mean``: sum_{i,t} m L / sum_{i,t} m (DAPO);
- ``seq_mean_token_mean``: mean_i (sum_t m L / sum_t m) (original GRPO, GSPO);
- ``seq_mean_token_sum_norm``: mean_i (sum_t m L / max_len) (Dr. GRPO, arXiv 2503.20783).

To add one: ``LOSS_AGGREGATIONS.register(LossAggregation("mine", fn, source="..."))``; the config
(``train.agg``) and the trainer then accept it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from tasks.registries.registry import Registry

if TYPE_CHECKING:
    import torch


class Aggregate(Protocol):
    def __call__(self, v: "torch.Tensor", m: "torch.Tensor", *, max_len: int | None,
                 num_tokens: "torch.Tensor | None", num_seqs: "torch.Tensor | None") -> "torch.Tensor": ...


@dataclass(frozen=True)
class LossAggregation:
    """One loss aggregation.

    Attributes:
        name: the value of ``train.agg``.
        aggregate: ``(v, m, *, max_len, num_tokens, num_seqs) -> scalar``: ``v`` ``[B, T]`` the
            per-token terms, 0 wherever the mask is; ``m`` ``[B, T]`` the mask in ``v``'s dtype;
            ``num_tokens`` / ``num_seqs`` 0-dim tensors in ``v``'s dtype overriding the
            denominators with global counts (the whole mini-batch's masked tokens / sequences
            with a masked token: micro-batch losses then sum to the mini-batch's), or None (this
            batch's own counts). A sequence with no masked token counts in no denominator.
        needs_max_len: whether it divides by ``train.max_len`` (the config refuses it unset).
        source: where it comes from (``"Dr. GRPO"``), as messages name it.
    """

    name: str
    aggregate: Aggregate
    needs_max_len: bool = False
    source: str = ""


def _token_mean(v: "torch.Tensor", m: "torch.Tensor", *, max_len: int | None, num_tokens: "torch.Tensor | None",
                num_seqs: "torch.Tensor | None") -> "torch.Tensor":
    denom = m.sum() if num_tokens is None else num_tokens
    return v.sum() / denom.clamp_min(1.0)


def _mean_over_sequences(per_seq: "torch.Tensor", m: "torch.Tensor", num_seqs: "torch.Tensor | None"
                         ) -> "torch.Tensor":
    """``[B]`` per-sequence values -> their mean over the sequences with a masked token."""
    live = (m.sum(-1) > 0).to(per_seq.dtype)
    n_seqs = live.sum() if num_seqs is None else num_seqs
    return (per_seq * live).sum() / n_seqs.clamp_min(1.0)


def _seq_mean_token_mean(v: "torch.Tensor", m: "torch.Tensor", *, max_len: int | None,
                         num_tokens: "torch.Tensor | None", num_seqs: "torch.Tensor | None") -> "torch.Tensor":
    return _mean_over_sequences(v.sum(-1) / m.sum(-1).clamp_min(1.0), m, num_seqs)


def _seq_mean_token_sum_norm(v: "torch.Tensor", m: "torch.Tensor", *, max_len: int | None,
                             num_tokens: "torch.Tensor | None", num_seqs: "torch.Tensor | None") -> "torch.Tensor":
    if max_len is None or max_len <= 0:
        raise ValueError("agg='seq_mean_token_sum_norm' (Dr. GRPO) needs max_len > 0")
    return _mean_over_sequences(v.sum(-1) / float(max_len), m, num_seqs)


LOSS_AGGREGATIONS: Registry[LossAggregation] = Registry("loss aggregation", "train.agg")
LOSS_AGGREGATIONS.register(LossAggregation("token_mean", _token_mean, source="DAPO"))
LOSS_AGGREGATIONS.register(LossAggregation("seq_mean_token_mean", _seq_mean_token_mean, source="GRPO, GSPO"))
LOSS_AGGREGATIONS.register(LossAggregation("seq_mean_token_sum_norm", _seq_mean_token_sum_norm, needs_max_len=True,
                                           source="Dr. GRPO"))
