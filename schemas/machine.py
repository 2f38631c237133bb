"""The machine facts that decide float results, recorded in every artifact manifest.

The same config and seed give the same bytes only where the float kernels are the same: the CPU
(its vendor, model and the ISA extensions the math libraries dispatch on), torch's kernel choice
(``torch.backends.cpu.get_cpu_capability()``, its BLAS, MKL and oneDNN), numpy's (its SIMD
dispatch targets and the BLAS it loaded, with the OpenBLAS core type that library picked), the
environment variables that override those choices, and the thread counts (a reduction split over
another number of threads is summed in another order). :func:`machine_facts` gathers them for
:meth:`schemas.ArtifactStore.write`'s manifest (key ``machine``); it is not part of any hashed
content (Parquet bytes, config hash, plan hash), so two machines write the same artifact SHA-256
whenever they compute the same rows.

The facts are the writing process's: rollout shards run on a cluster's workers ran on theirs.
Everything but the thread counts is computed once per process (:func:`static_facts`, cached; torch's
facts only once the process has imported torch); the
thread counts are read at each write (the stages change torch's count while they run). The
``numpy`` part (:func:`numpy_facts`) imports no torch: ``harnessrl verify``, which recomputes
statistics with numpy only, compares it with the manifests' (:func:`numpy_kernel`).
"""

from __future__ import annotations

import functools
import os
import platform
import re
import sys
from typing import Any, Mapping

# ISA extensions that change which float kernel a library runs (fma: glibc's libm and OpenBLAS's
# Haswell kernels; avx2 / avx512f: torch's capability, OpenBLAS's Haswell vs SkylakeX kernels,
# numpy's X86_V3 / X86_V4 loops; avx512_bf16 and amx: oneDNN's bf16 paths)
ISA_FLAGS = ("fma", "avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")
# Environment variables that override a kernel choice or a thread count (recorded when set)
KERNEL_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
              "MKL_NUM_THREADS", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY",
              "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "NPY_DISABLE_CPU_FEATURES")
# The keys of threadpoolctl's threadpool_info() rows kept (``filepath`` is left out: a venv path)
_POOL_KEYS = ("user_api", "internal_api", "prefix", "version", "threading_layer", "architecture")


def cpu_facts(cpuinfo: str | None = None) -> dict[str, Any]:
    """The CPU as ``/proc/cpuinfo`` names it: ``{"vendor", "model", "flags", "arch"}``.

    ``flags`` is the sorted subset of :data:`ISA_FLAGS` the first processor lists (the ``amx_*``
    flags only on CPUs that have AMX); ``arch`` is ``platform.machine()`` (``x86_64``). Where there is
    no ``/proc/cpuinfo`` (not Linux) ``vendor`` and ``model`` come from :func:`platform.processor`
    and ``flags`` is None (unknown, not empty). ``cpuinfo``: the file's text (tests), else read.
    """
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo = f.read()
        except OSError:
            return {"vendor": platform.processor() or None, "model": platform.processor() or None, "flags": None,
                    "arch": platform.machine() or None}
    first = cpuinfo.split("\n\n", 1)[0]
    fields: dict[str, str] = {}
    for line in first.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    # x86 names the model "model name"; arm64 kernels give "CPU implementer"/"CPU part" and "Features"
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    model = fields.get("model name") or fields.get("Model") or (
        f"implementer {fields['CPU implementer']} part {fields.get('CPU part', '?')}" if "CPU implementer" in fields
        else None)
    return {"vendor": fields.get("vendor_id") or fields.get("CPU implementer"), "model": model,
            "flags": sorted(flags & set(ISA_FLAGS)), "arch": platform.machine() or None}


def _pools() -> list[dict[str, Any]]:
    """threadpoolctl's view of the native thread pools loaded in this process (BLAS and OpenMP
    libraries): one dict per library, :data:`_POOL_KEYS` plus ``num_threads``."""
    from threadpoolctl import threadpool_info

    return [{k: p.get(k) for k in (*_POOL_KEYS, "num_threads") if k in p} for p in threadpool_info()]


def numpy_facts() -> dict[str, Any]:
    """numpy's kernel choice, without importing torch: ``{"version", "simd", "blas"}``.

    ``simd``: numpy's dispatch targets this CPU enables (after ``NPY_DISABLE_CPU_FEATURES``), e.g.
    ``["X86_V3", "X86_V4"]`` (None when this numpy does not say); ``blas``: the BLAS libraries
    threadpoolctl finds in numpy's folder (a wheel's ``numpy.libs``; every BLAS loaded in the process
    when none is there, e.g. a numpy linked to the system's): ``internal_api`` (``openblas`` or
    ``mkl``), ``version``, ``architecture`` (the OpenBLAS core type it picked, e.g. ``Haswell``,
    ``SkylakeX``), ``threading_layer``.
    """
    import numpy as np

    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
        simd: list[str] | None = [f for f in __cpu_dispatch__ if __cpu_features__.get(f)]
    except ImportError:  # a numpy without the dispatch tables: unknown
        simd = None
    from threadpoolctl import threadpool_info

    blas = [p for p in threadpool_info() if p.get("user_api") == "blas"]
    # numpy's own: the library under numpy's folder or its wheel's numpy.libs (scipy may load another)
    home = os.path.dirname(os.path.realpath(np.__file__))
    own = [p for p in blas if os.path.realpath(str(p.get("filepath", ""))).startswith((home + os.sep,
                                                                                        home + ".libs" + os.sep))]
    blas = [{k: p.get(k) for k in ("internal_api", "version", "architecture", "threading_layer")} for p in own or blas]
    return {"version": np.__version__, "simd": simd, "blas": blas}


def torch_facts() -> dict[str, Any]:
    """torch's kernel choice (imports torch): ``{"version", "cpu_capability", "blas", "lapack",
    "mkl", "mkldnn"}``. ``cpu_capability`` is ``torch.backends.cpu.get_cpu_capability()``
    (``DEFAULT``, ``AVX2``, ``AVX512``, ...; ``ATEN_CPU_CAPABILITY`` lowers it); ``blas`` and
    ``lapack`` the ``BLAS_INFO`` / ``LAPACK_INFO`` of ``torch.__config__.show()`` (``mkl``,
    ``open``, ...); ``mkl`` and ``mkldnn`` the version lines it prints (None when not built in)."""
    import torch

    shown = torch.__config__.show()

    def grab(pattern: str) -> str | None:
        m = re.search(pattern, shown)
        return m.group(1).strip() if m else None

    return {"version": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "blas": grab(r"BLAS_INFO=([^,\s]+)"), "lapack": grab(r"LAPACK_INFO=([^,\s]+)"),
            "mkl": grab(r"Math Kernel Library Version ([^\n]+?)(?: for |\n)"),
            "mkldnn": grab(r"MKL-DNN (v[0-9][^\s]*)")}


def libm_facts() -> str | None:
    """The C library whose libm Python's ``math`` calls (``log``, ``exp``: glibc picks an FMA or a
    plain variant by CPU), e.g. ``glibc 2.36``; None when Python cannot tell."""
    name, version = platform.libc_ver()
    return f"{name} {version}" if name else None


@functools.lru_cache(maxsize=1)
def light_facts() -> dict[str, Any]:
    """:func:`machine_facts` without torch and the thread counts, computed once per process and
    without importing torch: ``{"cpu", "numpy", "libm", "env"}`` (what :func:`numpy_kernel`
    reads)."""
    return {"cpu": cpu_facts(), "numpy": numpy_facts(), "libm": libm_facts(),
            "env": {k: os.environ[k] for k in KERNEL_ENV if k in os.environ}}


@functools.lru_cache(maxsize=1)
def _torch_facts_cached() -> dict[str, Any]:
    return torch_facts()


def static_facts() -> dict[str, Any]:
    """Everything of :func:`machine_facts` but the thread counts, computed once per process.
    ``torch`` is None while the writing process has not imported torch (nothing it wrote went
    through torch's kernels, and importing it only to describe it would cost about 2 s per
    process); once torch is loaded its facts are computed once and recorded."""
    light = light_facts()
    torch = _torch_facts_cached() if "torch" in sys.modules else None
    return {"cpu": light["cpu"], "torch": torch, "numpy": light["numpy"], "libm": light["libm"],
            "env": light["env"]}


def thread_counts() -> dict[str, Any]:
    """The writing process's thread counts now: torch's intra-op and inter-op threads (None when
    torch is not imported) and each native pool threadpoolctl finds (``"<internal_api>:<prefix>"``
    -> threads). The stages set torch's count from ``policy.torch_threads`` (worker processes
    pin their own, see :func:`tasks.rollout.fanout.pin_torch_threads`)."""
    torch = sys.modules.get("torch")
    out: dict[str, Any] = {"torch": torch.get_num_threads() if torch else None,
                           "torch_interop": torch.get_num_interop_threads() if torch else None}
    for p in _pools():
        out[f"{p.get('internal_api')}:{p.get('prefix')}"] = p.get("num_threads")
    return out


def machine_facts() -> dict[str, Any]:
    """The manifest's ``machine`` block: ``{"cpu", "torch", "numpy", "libm", "env", "threads"}``
    (see :func:`cpu_facts`, :func:`torch_facts`, :func:`numpy_facts`, :func:`libm_facts`,
    :func:`thread_counts`; ``env``: the variables of :data:`KERNEL_ENV` that are set).
    JSON-serialisable, key order fixed."""
    return {**static_facts(), "threads": thread_counts()}


def numpy_kernel(machine: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The part of a ``machine`` block (:func:`machine_facts` or :func:`light_facts`) that decides
    the float64 results of numpy and Python's ``math`` (what ``harnessrl verify`` recomputes with):
    CPU vendor, model and ISA flags, numpy's version and SIMD targets, its BLAS libraries (api,
    version, core type), the C library, and the environment variables that reach numpy's BLAS or
    SIMD dispatch. None for None (a manifest written before machines were recorded)."""
    if not machine:
        return None
    cpu, np_ = machine.get("cpu") or {}, machine.get("numpy") or {}
    env = {k: v for k, v in (machine.get("env") or {}).items() if k.startswith(("OPENBLAS_CORETYPE", "NPY_"))}
    return {"vendor": cpu.get("vendor"), "model": cpu.get("model"), "flags": cpu.get("flags"),
            "numpy": np_.get("version"), "simd": np_.get("simd"),
            "blas": [{k: b.get(k) for k in ("internal_api", "version", "architecture")} for b in np_.get("blas") or []],
            "libm": machine.get("libm"), "env": env}


def describe(machine: Mapping[str, Any] | None) -> str:
    """A machine in a few words, for one line of output: the CPU model, its widest vector ISA, and
    numpy's BLAS and core type, e.g. ``AMD EPYC (avx512f; numpy OpenBLAS 0.3.31 SkylakeX)``.
    ``an unrecorded machine`` for None."""
    k = numpy_kernel(machine)
    if k is None:
        return "an unrecorded machine"
    flags = k["flags"] or []
    isa = next((f for f in ("amx_tile", "avx512f", "avx2") if f in flags), "no avx2" if k["flags"] is not None
               else "ISA unknown")
    blas = ", ".join(f"{b['internal_api'] or '?'} {b['version'] or '?'} {b['architecture'] or ''}".strip()
                     for b in k["blas"]) or "no BLAS found"
    env = "".join(f"; {n}={v}" for n, v in sorted(k["env"].items()))
    return f"{k['model'] or 'unknown CPU'} ({isa}; numpy {blas}{env})"
