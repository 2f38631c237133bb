"""The machine facts every manifest records (schemas/machine.py): what they read, that they are
live where they change (thread counts), that no hash depends on them, and that old manifests
without them still load."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from schemas import ArtifactStore
from schemas import machine as M

REPO = Path(__file__).resolve().parents[2]

INTEL_SPR = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse sse2 avx fma avx2 avx512f avx512bw avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8 hypervisor

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse avx2
"""
ZEN3 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7R13 Processor
flags\t\t: fpu sse sse2 avx fma avx2 bmi2 sha_ni
"""


def _records(n=3):
    return [{"record_id": f"r{i}", "task_id": f"t{i}", "task_hash": f"h{i}", "harness_id": "H",
             "harness_name": "direct", "split": "train", "seed": 0} for i in range(n)]


def test_cpu_facts_keep_vendor_model_and_only_the_isa_flags_that_pick_a_kernel():
    assert M.cpu_facts(INTEL_SPR) == {
        "vendor": "GenuineIntel", "model": "Intel(R) Xeon(R) Platinum 8480+", "arch": M.platform.machine(),
        "flags": ["amx_bf16", "amx_int8", "amx_tile", "avx2", "avx512_bf16", "avx512f", "fma"]}
    zen = M.cpu_facts(ZEN3)
    assert (zen["vendor"], zen["model"], zen["flags"]) == ("AuthenticAMD", "AMD EPYC 7R13 Processor", ["avx2", "fma"])


def test_describe_names_the_cpu_its_widest_isa_and_numpys_blas_core_type():
    m = {"cpu": M.cpu_facts(INTEL_SPR), "libm": "glibc 2.36", "env": {"OPENBLAS_CORETYPE": "Haswell"},
         "numpy": {"version": "2.4.6", "simd": ["X86_V3"],
                   "blas": [{"internal_api": "openblas", "version": "0.3.31", "architecture": "Haswell"}]}}
    assert M.describe(m) == ("Intel(R) Xeon(R) Platinum 8480+ (amx_tile; numpy openblas 0.3.31 Haswell; "
                             "OPENBLAS_CORETYPE=Haswell)")
    assert M.describe({**m, "cpu": M.cpu_facts(ZEN3), "env": {}}) == \
        "AMD EPYC 7R13 Processor (avx2; numpy openblas 0.3.31 Haswell)"
    assert M.describe(None) == "an unrecorded machine"
    # the thread counts and torch's facts are not part of what decides numpy's float64 results
    assert M.numpy_kernel({**m, "threads": {"torch": 1}, "torch": {"cpu_capability": "AVX2"}}) == M.numpy_kernel(m)
    assert M.numpy_kernel(m) != M.numpy_kernel({**m, "libm": "glibc 2.39"})


def test_every_manifest_records_this_machine_and_its_thread_counts_at_the_write(tmp_path):
    import threadpoolctl
    import torch

    store = ArtifactStore(tmp_path)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        store.write("freeze", "records", _records())
        one = store.manifest("freeze", "records")["machine"]
        torch.set_num_threads(2)
        store.write("freeze", "records", _records(4))
        two = store.manifest("freeze", "records")["machine"]
    finally:
        torch.set_num_threads(before)
    model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name"))
    assert one["cpu"]["model"] == model
    assert one["torch"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert one["torch"]["version"] == torch.__version__ and one["torch"]["blas"]
    openblas = [p for p in threadpoolctl.threadpool_info() if p["internal_api"] == "openblas"]
    if openblas:
        assert one["numpy"]["blas"][0]["architecture"] == openblas[0]["architecture"]
    assert (one["threads"]["torch"], two["threads"]["torch"]) == (1, 2)  # read at each write
    assert {k: v for k, v in one.items() if k != "threads"} == {k: v for k, v in two.items() if k != "threads"}


def test_the_machine_changes_no_artifact_hash(tmp_path, monkeypatch):
    import schemas.store as S

    a = ArtifactStore(tmp_path / "a").write("freeze", "records", _records())
    other = {**M.machine_facts(), "cpu": M.cpu_facts(INTEL_SPR), "threads": {"torch": 7}}
    monkeypatch.setattr(S, "machine_facts", lambda: other)
    b = ArtifactStore(tmp_path / "b").write("freeze", "records", _records())
    assert a.sha256 == b.sha256
    assert (tmp_path / "a/freeze/records.parquet").read_bytes() == (tmp_path / "b/freeze/records.parquet").read_bytes()
    ma, mb = (json.loads((tmp_path / x / "freeze/records.manifest.json").read_text()) for x in "ab")
    assert mb["machine"]["cpu"]["model"] == "Intel(R) Xeon(R) Platinum 8480+" != ma["machine"]["cpu"]["model"]
    assert {k for k in ma if ma[k] != mb[k]} <= {"machine", "created_at"}


def test_a_manifest_written_before_machines_were_recorded_still_reads(tmp_path):
    store = ArtifactStore(tmp_path)
    ref = store.write("freeze", "records", _records())
    path = tmp_path / "freeze/records.manifest.json"
    m = json.loads(path.read_text())
    del m["machine"]
    path.write_text(json.dumps(m))
    assert store.ref("freeze", "records") == ref and len(store.rows(("freeze", "records"))) == 3
    from tasks.evaluate.verify import kernels_differ, recorded_machines

    assert recorded_machines(store, ("freeze/records",)) == [None]
    assert kernels_differ(store, ("freeze/records",))  # unknown counts as another machine


def test_numpy_facts_read_the_core_type_openblas_picked_not_the_variable(tmp_path):
    import threadpoolctl

    here = [p["architecture"] for p in threadpoolctl.threadpool_info() if p["internal_api"] == "openblas"]
    if not here:
        pytest.skip("numpy's BLAS is not OpenBLAS: no core type to force")
    forced = "Sandybridge" if here[0] != "Sandybridge" else "Prescott"  # kernels every x86-64 with AVX runs
    prog = "import json; from schemas.machine import light_facts, describe; f = light_facts(); " \
           "print(json.dumps([f['numpy']['blas'][0]['architecture'], f['env'], describe(f)]))"
    from schemas.machine import KERNEL_ENV

    clean = {k: v for k, v in os.environ.items() if k not in KERNEL_ENV}  # e.g. a Dask test's OMP_NUM_THREADS=1
    out = subprocess.run([sys.executable, "-c", prog], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={**clean, "OPENBLAS_CORETYPE": forced, "OPENBLAS_L2_SIZE": "1048576"})
    assert out.returncode == 0, out.stderr
    arch, env, line = json.loads(out.stdout)
    assert arch == forced != here[0]
    assert env == {"OPENBLAS_CORETYPE": forced, "OPENBLAS_L2_SIZE": "1048576"}
    assert "openblas" in line and forced in line


def test_a_process_without_torch_records_none_and_does_not_import_it(tmp_path):
    """A manifest written by a process that never loaded torch says ``torch: None`` and the write
    does not import torch (the CLI's freeze, status and findings stay light)."""
    code = (
        "import sys, json; from pathlib import Path\n"
        "from schemas import ArtifactStore\n"
        "from tests.schemas.test_machine import _records\n"
        f"s = ArtifactStore({str(tmp_path)!r}); s.write('freeze', 'records', _records())\n"
        "print(json.dumps({'torch_loaded': 'torch' in sys.modules,"
        " 'recorded': s.manifest('freeze', 'records')['machine']['torch']}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2]).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got == {"torch_loaded": False, "recorded": None}
