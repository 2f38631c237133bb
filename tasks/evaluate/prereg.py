"""Pre-registration: what the evaluation will measure, sealed at freeze time, before any training.

The freeze stage writes ``freeze/preregistration.json`` -- the evaluation harnesses, the held-out
ones, the contrasts (the configured list, or ``"default"``: :func:`default_contrasts` over the
run's checkpoints) and ``alpha`` -- and signs its SHA-256 with the run's Ed25519 key
(``freeze/preregistration.sig``, :mod:`tasks.evaluate.signing`). The evaluate stage refuses a plan
that differs from it (:func:`differences`, naming the field and both values) and records its hash
in the plan, so the plan's signature covers it; ``harnessrl verify`` checks the file's hash, its
signature and the plan against it again. Changing them means a new run (freeze again).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tasks.evaluate.seal import SealError
from tasks.hashing import sha256_json

if TYPE_CHECKING:
    from schemas import ArtifactStore
    from tasks.config import RunConfig

PREREG = "freeze/preregistration.json"
PREREG_SIG = "freeze/preregistration.sig"


def default_contrasts(checkpoints: list[dict[str, Any]], harnesses: list[str],
                      seeded: dict[str, list[str]] | None = None) -> list[dict[str, Any]]:
    """``<checkpoint> - base`` for every trained checkpoint (``final``, or each training arm) under
    each evaluation harness, named ``<checkpoint>-vs-base:<harness>``, checkpoint-major in the
    checkpoints' order (none when ``base`` is absent). ``seeded``: arm -> its seed checkpoints
    (:func:`arm_seeds`); those checkpoints stand as their arm, one contrast per arm."""
    arm_of = {ck: arm for arm, cks in (seeded or {}).items() for ck in cks}
    names = list(dict.fromkeys(arm_of.get(c["name"], c["name"]) for c in checkpoints))
    if "base" not in names:
        return []
    return [{"name": f"{n}-vs-base:{h}", "a": {"checkpoint": n, "harness": h}, "b": {"checkpoint": "base", "harness": h}}
            for n in names if n != "base" for h in harnesses]


def arm_seeds(cfg: "RunConfig") -> dict[str, list[str]]:
    """Each arm trained under several seeds (``train.seeds``) -> its seed checkpoints
    (``<arm>@s<seed>``), in config order; empty when no arm sets ``seeds``."""
    return {arm: cks for arm, cks in cfg.arm_groups().items() if cks != [arm]}


def preregistration(cfg: "RunConfig") -> dict[str, Any]:
    """The pre-registered evaluation of ``cfg``: ``{"version", "harnesses", "held_out",
    "contrasts" (list of contrast dicts, or "default"), "alpha"}`` and, when the config names
    findings, ``"findings"`` (each headline with its verdict rule) and ``"findings_rule"`` (the
    version of the rule that decides them, :data:`tasks.evaluate.findings.FINDINGS_RULE`), when
    an arm trains under several seeds, ``"arm_seeds"`` (:func:`arm_seeds`: the seeds are fixed
    before any run, not added until an interval clears 0), and when it sets
    ``evaluate.max_infra_error_fraction``, that threshold."""
    from tasks.evaluate.findings import FINDINGS_RULE

    contrasts = "default" if cfg.evaluate.contrasts is None else [c.model_dump(mode="json")
                                                                   for c in cfg.evaluate.contrasts]
    pre = {"version": 1, "harnesses": sorted(cfg.eval_harnesses()), "held_out": sorted(cfg.held_out_harnesses()),
           "contrasts": contrasts, "alpha": cfg.evaluate.alpha}
    if cfg.evaluate.findings:  # only when set: pre-registrations without findings keep their hash
        pre["findings"] = [f.model_dump(mode="json") for f in cfg.evaluate.findings]
        pre["findings_rule"] = FINDINGS_RULE
    if arm_seeds(cfg):  # likewise
        pre["arm_seeds"] = arm_seeds(cfg)
    if cfg.evaluate.max_infra_error_fraction is not None:  # likewise: only when set
        pre["max_infra_error_fraction"] = cfg.evaluate.max_infra_error_fraction
    return pre


def write_preregistration(store: "ArtifactStore", cfg: "RunConfig") -> str:
    """Write and sign the pre-registration of ``cfg`` (see the module docstring); returns its
    SHA-256. Raises ValueError for an unusable signing key (:func:`~tasks.evaluate.signing.load_or_create_key`)."""
    from tasks.evaluate.signing import load_or_create_key, sign

    pre = preregistration(cfg)
    h = sha256_json(pre)
    store.write_json(PREREG, pre)
    sign(store, PREREG_SIG, h, load_or_create_key())
    return h


def differences(pre: dict[str, Any], plan: dict[str, Any]) -> list[str]:
    """How ``plan`` departs from the pre-registration ``pre``: one line per field (empty: none)."""
    out = []
    for k in ("harnesses", "held_out", "alpha", "findings", "findings_rule", "arm_seeds", "max_infra_error_fraction"):
        if plan.get(k) != pre.get(k):
            out.append(f"{k}: plan {plan.get(k)!r}, pre-registered {pre.get(k)!r}")
    want = default_contrasts(plan["checkpoints"], pre["harnesses"], plan.get("arm_seeds")) \
        if pre.get("contrasts") == "default" \
        else pre.get("contrasts")
    if plan.get("contrasts") != want:
        got = [c.get("name") for c in plan.get("contrasts") or []]
        out.append(f"contrasts: plan {got}, pre-registered {[c.get('name') for c in want or []]}"
                   + ("" if got != [c.get("name") for c in want or []] else " (same names, other definitions)"))
    return out


def read_preregistration(store: "ArtifactStore") -> tuple[dict[str, Any], str] | None:
    """``(pre-registration, its SHA-256)``, or None when the run has none (frozen before
    pre-registration existed, or its tables were written without the freeze stage)."""
    if not store.exists(PREREG):
        return None
    pre = store.read_json(PREREG)
    return pre, sha256_json(pre)


def check_preregistration(store: "ArtifactStore", plan: dict[str, Any]) -> None:
    """For a plan that names a pre-registration: the file is there, hashes to the recorded value,
    its signature verifies with the run's public key, and the plan does not depart from it.

    Raises:
        SealError: naming the file or the first difference.
    """
    from tasks.evaluate.signing import check_signature

    want = plan.get("preregistration")
    if want is None:
        return
    got = read_preregistration(store)
    if got is None:
        raise SealError(f"{PREREG}: missing (the plan was made against pre-registration {want[:16]}...)")
    pre, h = got
    if h != want:
        raise SealError(f"{PREREG}: hash {h[:16]}... != {want[:16]}... recorded in the plan (edited after freeze)")
    check_signature(store, PREREG_SIG, h)
    diff = differences(pre, plan)
    if diff:
        raise SealError(f"plan departs from the pre-registration: {diff[0]}")
