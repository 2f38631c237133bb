"""A Dask or Ray address where nothing answers is refused in one line (exit 2) before any stage
runs, instead of Dask's 30 s of retries ending in about 1,000 lines of tracebacks."""

import socket
import time

import pytest

from tasks.config import RolloutConfig
from tasks.rollout.fanout import check_cluster


def _closed_port() -> int:
    with socket.socket() as s:  # bound, then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("runner,key,value,kind", [
    ("dask", "dask_address", "tcp://127.0.0.1:{port}", "Dask scheduler"),
    ("ray", "ray_address", "127.0.0.1:{port}", "Ray head"),
])
def test_cli_refuses_an_unreachable_cluster_in_one_line_before_any_stage(monkeypatch, tmp_path, runner, key, value,
                                                                          kind):
    from typer.testing import CliRunner

    import flows.pipeline
    from flows.cli import app

    ran = []
    monkeypatch.setattr(flows.pipeline, "pipeline", lambda *a, **k: ran.append(a))
    for k in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    port = _closed_port()
    address = value.format(port=port)
    t0 = time.perf_counter()
    r = CliRunner().invoke(app, ["run", "-c", "configs/default.yaml", "--run-dir", str(tmp_path / "run"),
                                 "--set", f"rollout.task_runner={runner}", "--set", f"rollout.{key}={address}"])
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1, r.output
    assert lines[0].startswith(f"rollout.{key}='{address}': no {kind} answers at 127.0.0.1:{port} ("), lines[0]
    assert f"or unset rollout.{key}" in lines[0]
    assert time.perf_counter() - t0 < 20 and not ran and not (tmp_path / "run").exists()


def test_a_listening_address_passes_and_unchecked_forms_are_left_alone():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        check_cluster(RolloutConfig(task_runner="dask", dask_address=f"tcp://127.0.0.1:{port}"))
        check_cluster(RolloutConfig(task_runner="ray", ray_address=f"ray://127.0.0.1:{port}"))
    check_cluster(RolloutConfig(task_runner="ray", ray_address="auto"))  # Ray finds it itself
    check_cluster(RolloutConfig(task_runner="dask"))  # a local cluster: nothing to reach
    with pytest.raises(ValueError, match=r"rollout.ray_address='ray://127.0.0.1:\d+': no Ray head answers"):
        check_cluster(RolloutConfig(task_runner="ray", ray_address=f"ray://127.0.0.1:{_closed_port()}"))
