"""P5's table, checked: which (KL estimator, placement) gives an unbiased gradient of the
sequence-level reverse KL (Shah et al., arXiv 2512.21852; P5: docs/methods/p5-kl.md).

A tabular autoregressive policy over a vocabulary of V tokens and sequences of length L (every
one of the V^L sequences is enumerable) has one logit vector per prefix. For it we compute in
float64:

- the exact gradient of KL(pi_theta || pi_ref) = sum_y pi_theta(y) sum_t [log pi_theta(y_t | y_<t) - log pi_ref(y_t | y_<t)];
- for each configuration, the gradient estimator it implies for one sampled y, and its exact
  expectation by enumeration, and a Monte-Carlo mean over N samples with its standard error.

Per-sample gradient estimators (k_t is the chosen estimator at token t, sg = stop-gradient,
rho = pi_theta(y) / pi_old(y) the sequence importance ratio for stale samples drawn from pi_old):

- ``reward``: the KL is a (negative) reward: g = sg(sum_t k_t) * grad log pi_theta(y)      (score function)
- ``loss``:   the KL is a loss term:        g = grad sum_t k_t                           (pathwise)
- ``both``:   the sum of the two;
- stale samples, no correction: the same, with y ~ pi_old;
- stale samples, importance-weighted: ``reward`` g = sg(rho sum_t k_t) grad log pi_theta(y);
  ``loss`` g = grad (rho sum_t k_t) (the ``rho * k3`` form), with y ~ pi_old.

"Unbiased" means ||E[g] - grad KL|| <= 1e-9 * (1 + ||grad KL||), computed exactly. The table also
compares E[g] with the *token-level* gradient E_y[sum_t grad KL(pi(.|y_<t) || pi_ref(.|y_<t))]
(prefix distribution held fixed), for which P5 says k2 in loss is unbiased.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from tasks.registries import KL_ESTIMATORS, PLACEMENTS, STALE_SAMPLINGS
from tasks.train.kl import importance_weighted, kl_estimate


class _Claims(Mapping[str, bool]):
    """What each registered KL estimator's source says of each configuration
    ``"<estimator>/<placement>[/stale|/stale-is]"`` (``KLEstimator.unbiased``; P5,
    docs/methods/p5-kl.md, for k1, k2, k3): True = unbiased gradient of the sequence KL. Read from
    :data:`tasks.registries.KL_ESTIMATORS` at each use: the on-policy configurations of every
    estimator in registration order, then the stale ones."""

    def _table(self) -> dict[str, bool]:
        claims = [(f"{e.name}/{conf}", v) for e in KL_ESTIMATORS.entries() for conf, v in e.unbiased.items()]
        return dict([c for c in claims if c[0].count("/") == 1] + [c for c in claims if c[0].count("/") == 2])

    def __getitem__(self, name: str) -> bool:
        return self._table()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())


PAPER_CLAIMS: Mapping[str, bool] = _Claims()


@dataclass(frozen=True)
class TabularPolicy:
    """Logits ``[P, V]``: row ``p`` is the next-token logits after prefix number ``p`` (prefixes
    of length 0..L-1 in lexicographic order)."""

    vocab: int
    length: int

    def num_prefixes(self) -> int:
        return sum(self.vocab**i for i in range(self.length))

    def sequences(self) -> torch.Tensor:
        """All V^L sequences, ``[V^L, L]`` int64, lexicographic."""
        return torch.tensor(list(itertools.product(range(self.vocab), repeat=self.length)), dtype=torch.long)

    def prefix_index(self, seqs: torch.Tensor) -> torch.Tensor:
        """``[N, L]``: the prefix row used to draw token t of each sequence."""
        n, L = seqs.shape
        idx = torch.zeros((n, L), dtype=torch.long)
        offset, code = 0, torch.zeros(n, dtype=torch.long)
        for t in range(L):
            idx[:, t] = offset + code
            offset += self.vocab**t
            code = code * self.vocab + seqs[:, t]
        return idx

    def token_logp(self, logits: torch.Tensor, seqs: torch.Tensor) -> torch.Tensor:
        """``[N, L]`` log pi(y_t | y_<t) for each sequence."""
        lp = torch.log_softmax(logits, dim=-1)  # [P, V]
        return lp[self.prefix_index(seqs), seqs]


def _per_sequence_surrogate(kind: str, placement: str, stale: str, lp: torch.Tensor, lp_ref: torch.Tensor,
                            lp_old: torch.Tensor) -> torch.Tensor:
    """``[N]`` surrogate s(y) whose gradient (y fixed) is the per-sample gradient estimate."""
    k_sum = kl_estimate(lp, lp_ref, kind).sum(-1)  # [N], differentiable
    logp_seq = lp.sum(-1)
    rho = torch.exp(logp_seq - lp_old.sum(-1))
    w = rho if stale == "is" else torch.ones_like(rho)
    out = torch.zeros_like(k_sum)
    if placement in ("reward", "both"):
        out = out + (w * k_sum).detach() * logp_seq
    if placement in ("loss", "both"):
        k = kl_estimate(lp, lp_ref, kind)
        if stale == "is":  # the trainer's own function: rho * k, differentiable through rho
            k = importance_weighted(k, lp, lp_old, torch.ones_like(lp))
        out = out + k.sum(-1)
    return out


def check_configuration(name: str, *, vocab: int = 3, length: int = 3, samples: int = 4096, seed: int = 0,
                        staleness_noise: float = 0.5) -> dict[str, Any]:
    """One row of the table for ``name`` = ``"<k>/<placement>[/stale|/stale-is]"``.

    Returns a dict: configuration, exact KL, ||grad KL||, ||E[g]||, bias norm, relative bias,
    unbiased (bool), Monte-Carlo samples, MC error norm ||mean_N(g) - E[g]||, MC standard-error
    norm (sqrt of the summed per-coordinate squared standard errors), paper claim, agrees.

    Raises:
        ValueError: a malformed configuration name.
    """
    parts = name.split("/")
    if len(parts) not in (2, 3) or parts[0] not in KL_ESTIMATORS or parts[1] not in PLACEMENTS:
        raise ValueError(f"configuration {name!r} is not '<{'|'.join(KL_ESTIMATORS)}>/<{'|'.join(PLACEMENTS)}>"
                         f"[/{'|/'.join(STALE_SAMPLINGS)}]'")
    kind, placement = parts[0], parts[1]
    stale = {2: "none", 3: {"stale": "plain", "stale-is": "is"}.get(parts[2] if len(parts) == 3 else "", "")}[len(parts)]
    if stale == "":
        raise ValueError(f"configuration {name!r}: third part must be 'stale' or 'stale-is'")
    pol = TabularPolicy(vocab, length)
    g = torch.Generator().manual_seed(seed)
    P = pol.num_prefixes()
    theta = torch.randn(P, vocab, generator=g, dtype=torch.float64).requires_grad_()
    ref_logits = torch.randn(P, vocab, generator=g, dtype=torch.float64)
    old_logits = theta.detach() + staleness_noise * torch.randn(P, vocab, generator=g, dtype=torch.float64)
    seqs = pol.sequences()
    lp_ref = pol.token_logp(ref_logits, seqs)

    # exact reverse KL and its gradient
    lp = pol.token_logp(theta, seqs)
    p = lp.sum(-1).exp()
    kl = (p * (lp - lp_ref).sum(-1)).sum()
    (grad_kl,) = torch.autograd.grad(kl, theta)

    # token-level reference: E_y[sum_t grad KL(pi(.|y_<t) || pi_ref(.|y_<t))] with the prefix
    # distribution held fixed, the gradient P5 calls "token-level" (k2 in loss is unbiased for it)
    idx = pol.prefix_index(seqs)  # [N, L]
    lpf = torch.log_softmax(theta, -1)[idx]  # [N, L, V]
    lpr = torch.log_softmax(ref_logits, -1)[idx]
    kl_tok = (lpf.exp() * (lpf - lpr)).sum(-1).sum(-1)  # [N]
    (grad_tok,) = torch.autograd.grad((p.detach() * kl_tok).sum(), theta)

    # per-sequence gradient estimates g_y, [N, P*V]
    lp = pol.token_logp(theta, seqs)
    lp_old = pol.token_logp(old_logits, seqs)
    s = _per_sequence_surrogate(kind, placement, stale, lp, lp_ref, lp_old)
    per_seq = torch.stack([torch.autograd.grad(s[i], theta, retain_graph=True)[0].flatten() for i in range(len(seqs))])
    q = (lp_old.sum(-1) if stale != "none" else lp.sum(-1)).exp().detach()  # sampling distribution
    expected = (q[:, None] * per_seq).sum(0)
    bias = float((expected - grad_kl.flatten()).norm())
    tok_bias = float((expected - grad_tok.flatten()).norm())
    gnorm = float(grad_kl.norm())

    # Monte Carlo: N sequences drawn from q with a seeded generator
    counts = torch.bincount(torch.multinomial(q, samples, replacement=True, generator=g), minlength=len(seqs)).double()
    mc_mean = (counts[:, None] * per_seq).sum(0) / samples
    second = (counts[:, None] * per_seq.square()).sum(0) / samples
    var = (second - mc_mean.square()).clamp_min(0.0) * samples / max(samples - 1, 1)
    se_norm = float((var / samples).sum().sqrt())
    unbiased = bias <= 1e-9 * (1.0 + gnorm)
    claim = PAPER_CLAIMS.get(name)
    return {
        "configuration": name, "estimator": kind, "placement": placement,
        "sampling": {"none": "on-policy", "plain": "stale", "is": "stale, importance-weighted"}[stale],
        "vocab": vocab, "length": length, "kl": float(kl.detach()), "grad_kl_norm": gnorm,
        "expected_grad_norm": float(expected.norm()), "bias_norm": bias, "relative_bias": bias / gnorm if gnorm else math.inf,
        "unbiased": unbiased, "token_level_bias_norm": tok_bias,
        "token_level_unbiased": tok_bias <= 1e-9 * (1.0 + float(grad_tok.norm())), "mc_samples": samples, "mc_error_norm": float((mc_mean - expected).norm()),
        "mc_se_norm": se_norm, "paper_unbiased": claim, "agrees_with_paper": None if claim is None else claim == unbiased,
    }


def kl_check_table(*, vocab: int = 3, length: int = 3, samples: int = 4096, seed: int = 0) -> list[dict[str, Any]]:
    """Every configuration of :data:`PAPER_CLAIMS` (every registered estimator's claims), in that
    order."""
    return [check_configuration(n, vocab=vocab, length=length, samples=samples, seed=seed) for n in PAPER_CLAIMS]
