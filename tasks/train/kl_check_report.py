"""``harnessrl kl-check``'s output: P5's table of each KL (estimator, placement)'s gradient bias,
printed with rich and written as ``kl_check/kl_check.parquet`` (:mod:`tasks.train.kl_check`
computes it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def print_kl_check(out: Path, samples: int, seed: int, vocab: int, length: int, say: Any) -> bool:
    """Compute the table (:func:`tasks.train.kl_check.kl_check_table`), print it, write it under
    ``out`` and say where. Returns whether every row agrees with the paper."""
    from rich.console import Console
    from rich.table import Table

    from schemas import ArtifactStore
    from tasks.train.kl_check import kl_check_table

    rows = kl_check_table(vocab=vocab, length=length, samples=samples, seed=seed)
    t = Table(title=f"gradient of KL(pi || pi_ref), vocabulary {vocab}, length {length}: exact vs each estimator")
    for col in ("configuration", "bias norm", "rel. bias", "unbiased", "token-level unbiased",
                f"MC error (N={samples})", "MC std. error", "paper says", "agrees"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["configuration"], f"{r['bias_norm']:.2e}", f"{r['relative_bias']:.3f}",
                  "yes" if r["unbiased"] else "no", "yes" if r["token_level_unbiased"] else "no",
                  f"{r['mc_error_norm']:.3e}", f"{r['mc_se_norm']:.3e}",
                  "unbiased" if r["paper_unbiased"] else "biased", "yes" if r["agrees_with_paper"] else "NO")
    Console(width=max(Console().width, 132)).print(t)
    say("stale = samples from an older policy; stale-is = importance-weighted by pi_theta(y) / pi_old(y)")
    ref = ArtifactStore(out).write("kl_check", "kl_check", rows, config_hash="")
    say(f"wrote {out / ref.path} ({ref.rows} rows, sha256 {ref.sha256[:16]})")
    return all(r["agrees_with_paper"] for r in rows)
