"""The confidence head and its calibration (P3: docs/methods/p3-talkmesh.md, our reconstruction).

c(problem, answer) = sigmoid(w . h + b), where h is the base model's final hidden state (the last
layer, after its final norm, ``hidden_states[-1]``) at the last token of the text "<chat prompt of
the problem> Answer: <answer>", standardised with the training features' mean and standard
deviation. (w, b) are fitted by L-BFGS on the binary cross-entropy against graded correctness of
training rollouts, with an L2 penalty ``l2 * |w|^2``. No class reweighting: reweighting would
bias the probabilities the head must report.

Expected calibration error (Naeini et al., AAAI 2015; Guo et al., ICML 2017, eq. 3) with B
equal-width bins on [0, 1]: ECE = sum_b (n_b / n) * |acc_b - conf_b|, where bin b holds the
predictions in [(b-1)/B, b/B) (the last bin also holds 1.0), acc_b is the fraction correct and
conf_b the mean confidence in it; empty bins contribute 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch


def expected_calibration_error(conf: Sequence[float], correct: Sequence[bool | float], bins: int = 10) -> float:
    """ECE with ``bins`` equal-width bins (module docstring).

    Raises:
        ValueError: no predictions, lengths differ, ``bins`` < 1, or a confidence outside [0, 1].
    """
    if bins < 1:
        raise ValueError(f"bins={bins} must be >= 1")
    if len(conf) != len(correct):
        raise ValueError(f"conf has {len(conf)} entries but correct has {len(correct)}")
    if not conf:
        raise ValueError("expected_calibration_error: no predictions")
    bad = [c for c in conf if not 0.0 <= c <= 1.0]
    if bad:
        raise ValueError(f"confidences outside [0, 1]: {bad[:5]}")
    n_b = [0] * bins
    acc = [0.0] * bins
    cs = [0.0] * bins
    for c, y in zip(conf, correct):
        b = min(int(c * bins), bins - 1)
        n_b[b] += 1
        acc[b] += float(y)
        cs[b] += float(c)
    return sum(abs(acc[b] - cs[b]) / len(conf) for b in range(bins) if n_b[b])


def answer_text(answer: str) -> str:
    """The assistant text scored for an answer."""
    return f"Answer: {answer}"


class HiddenStates:
    """Final hidden states ``[N, H]`` (float32) of a transformers causal LM for (problem, answer)
    texts, cached by (question, answer).

    Args:
        model, tokenizer: the base model (eval mode) and its tokenizer.
        system: the system prompt of the chat prompt.
        batch_size: texts per forward pass; ``device``: where the model is.
    """

    def __init__(self, model: Any, tokenizer: Any, system: str, *, batch_size: int = 16, device: str = "cpu"):
        from tasks.rollout.generation import ChatFormat

        self.model, self.tok, self.system = model.eval(), tokenizer, system
        self.chat = ChatFormat(tokenizer)
        self.batch_size, self.device = batch_size, device
        self.pad_id = int(tokenizer.pad_token_id)
        self._cache: dict[tuple[str, str], torch.Tensor] = {}

    def ids(self, question: str, answer: str) -> list[int]:
        """Token ids: the chat prompt of ``question`` followed by :func:`answer_text`."""
        return self.chat.initial(self.system, question) + self.tok.encode(answer_text(answer), add_special_tokens=False)

    def __call__(self, items: Sequence[tuple[str, str]]) -> torch.Tensor:
        todo = list(dict.fromkeys(it for it in items if it not in self._cache))
        for s in range(0, len(todo), self.batch_size):
            chunk = todo[s:s + self.batch_size]
            seqs = [self.ids(q, a) for q, a in chunk]
            w = max(len(x) for x in seqs)
            ids = torch.full((len(seqs), w), self.pad_id, dtype=torch.long)
            attn = torch.zeros((len(seqs), w), dtype=torch.long)
            for r, x in enumerate(seqs):  # left padding: the last position is every row's last token
                ids[r, w - len(x):] = torch.tensor(x)
                attn[r, w - len(x):] = 1
            with torch.inference_mode():
                out = self.model(input_ids=ids.to(self.device), attention_mask=attn.to(self.device),
                                 position_ids=(attn.cumsum(-1) - 1).clamp_min(0).to(self.device),
                                 output_hidden_states=True)
            h = out.hidden_states[-1][:, -1].float().cpu()
            for it, v in zip(chunk, h):
                self._cache[it] = v.clone()
        if not items:
            return torch.zeros((0, 0))
        return torch.stack([self._cache[it] for it in items])


@dataclass
class ConfidenceHead:
    """A fitted head: ``weight [H]``, ``bias``, feature ``mean [H]`` and ``std [H]`` (float32)."""

    weight: torch.Tensor
    bias: float
    mean: torch.Tensor
    std: torch.Tensor

    def predict(self, feats: torch.Tensor) -> list[float]:
        """Confidences in [0, 1] for features ``[N, H]``."""
        if feats.numel() == 0:
            return []
        z = ((feats - self.mean) / self.std) @ self.weight + self.bias
        return [float(x) for x in torch.sigmoid(z)]


def fit_head(feats: torch.Tensor, labels: Sequence[bool | float], *, l2: float = 1e-2, steps: int = 100,
             seed: int = 0) -> ConfidenceHead:
    """Fit the linear head by full-batch L-BFGS on mean BCE + ``l2 * |w|^2`` (module docstring).

    Args:
        feats: ``[N, H]`` float features; labels: N correctness labels (0/1).
        steps: L-BFGS iterations; seed: the weights' initialisation (zeros; the seed is recorded
            for reproducibility of the torch RNG around the fit).

    Raises:
        ValueError: empty or mismatched inputs, labels outside {0, 1}, ``steps`` < 1, ``l2`` < 0.
    """
    if feats.ndim != 2 or feats.shape[0] == 0:
        raise ValueError(f"fit_head: features must be [N>0, H], got {tuple(feats.shape)}")
    if len(labels) != feats.shape[0]:
        raise ValueError(f"fit_head: {feats.shape[0]} feature rows but {len(labels)} labels")
    if any(float(y) not in (0.0, 1.0) for y in labels):
        raise ValueError("fit_head: labels must be 0 or 1")
    if steps < 1 or l2 < 0:
        raise ValueError(f"fit_head: steps={steps} must be >= 1 and l2={l2} >= 0")
    torch.manual_seed(seed)
    x = feats.double()
    mean = x.mean(0)
    std = x.std(0, unbiased=False).clamp_min(1e-6)
    x = (x - mean) / std
    y = torch.tensor([float(v) for v in labels], dtype=torch.float64)
    w = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
    p = y.mean().clamp(1e-4, 1 - 1e-4)
    b = torch.tensor(float(torch.log(p / (1 - p))), dtype=torch.float64, requires_grad=True)  # the base rate
    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=steps, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(x @ w + b, y) + l2 * (w * w).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return ConfidenceHead(weight=w.detach().float(), bias=float(b.detach()), mean=mean.float(), std=std.float())
