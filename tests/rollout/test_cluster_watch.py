"""Scale-out that fails loudly: a fan-out whose every Dask worker is gone fails after
rollout.worker_timeout_s with one line naming the cluster, and a reused worker follows the
current run's Prefect API instead of reporting to the first run's."""

import time
from types import SimpleNamespace

import pytest

from tasks.rollout import cluster
from tasks.rollout.cluster import NoWorkersError, await_shard, follow_api_url


class _Service:
    drained: list[float] = []

    @classmethod
    def drain_all(cls, timeout=None):
        cls.drained.append(timeout)


def test_a_worker_drains_its_prefect_services_only_when_the_api_url_changes(monkeypatch):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    monkeypatch.setattr(cluster, "_API_URL_SEEN", [])
    _Service.drained = []
    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:1111/api"}):
        assert follow_api_url(services=(_Service,)) is False  # the first run this worker serves
        assert follow_api_url(services=(_Service,)) is False  # the same run's next shard
    assert _Service.drained == []
    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:2222/api"}):
        assert follow_api_url(services=(_Service,)) is True  # a later run: the first run's services are stopped
        assert follow_api_url(services=(_Service,)) is False
    assert _Service.drained == [5.0]
    # the fan-out passes the run's URL to every Dask worker (client.run), whatever the worker's settings
    assert follow_api_url("http://127.0.0.1:3333/api", services=(_Service,)) is True
    assert follow_api_url("http://127.0.0.1:3333/api", services=(_Service,)) is False
    assert _Service.drained == [5.0, 5.0]


@pytest.fixture
def one_worker():
    import distributed

    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0") as cl, \
            distributed.Client(cl) as client:
        yield cl, client


def test_a_shard_on_a_live_worker_is_awaited_and_one_whose_workers_all_died_fails_naming_the_cluster(one_worker):
    cl, client = one_worker
    runner = SimpleNamespace(client=client)
    quick = SimpleNamespace(wrapped_future=client.submit(sum, [1, 2]))
    await_shard(quick, runner, "dask", "dask at tcp://sched:8786", timeout_s=5.0, poll_s=0.2)
    assert quick.wrapped_future.result() == 3
    assert cluster.live_workers(runner, "dask") == 1
    slow = SimpleNamespace(wrapped_future=client.submit(time.sleep, 120, pure=False))
    cl.scale(0)  # every worker gone (the scheduler keeps the shard, waiting for one)
    t0 = time.monotonic()
    with pytest.raises(NoWorkersError) as e:
        await_shard(slow, runner, "dask", "dask at tcp://sched:8786", timeout_s=2.0, poll_s=0.2)
    waited = time.monotonic() - t0
    assert 2.0 <= waited < 30.0
    msg = str(e.value)
    assert "no live worker on dask at tcp://sched:8786 for 2 s (rollout.worker_timeout_s)" in msg and "\n" not in msg


def test_a_worker_count_that_cannot_be_read_never_fails_the_wait(monkeypatch):
    """A failed query (None) is "cannot tell", not "no workers": only a count of 0 runs the clock."""
    clock = iter(range(0, 1000, 10))
    checks = iter([False, False, False, True])
    monkeypatch.setattr(cluster, "_done", lambda fut, kind, t: next(checks))
    monkeypatch.setattr(cluster, "live_workers", lambda runner, kind: None)
    await_shard(object(), object(), "ray", "ray at head:6379", timeout_s=5.0, clock=lambda: next(clock))
    monkeypatch.setattr(cluster, "_done", lambda fut, kind, t: False)
    monkeypatch.setattr(cluster, "live_workers", lambda runner, kind: 0)
    with pytest.raises(NoWorkersError, match="ray at head:6379 for 25 s"):
        await_shard(object(), object(), "ray", "ray at head:6379", timeout_s=25.0, clock=lambda: next(clock))


def test_the_cli_drops_the_traceback_of_a_no_workers_failure_and_keeps_others():
    import logging

    from flows.process_setup import NoTraceback

    f = NoTraceback((NoWorkersError,))

    def record(exc):
        try:
            raise exc
        except BaseException:
            import sys
            return logging.LogRecord("prefect.task_runs", logging.ERROR, __file__, 1, "failed", None, sys.exc_info())

    def wrapped():
        try:
            raise NoWorkersError("no live worker")
        except NoWorkersError as e:
            raise RuntimeError("flow failed") from e

    ours = record(NoWorkersError("no live worker"))
    assert f.filter(ours) and ours.exc_info is None and ours.getMessage() == "failed"
    chained = record(RuntimeError("x"))
    try:
        wrapped()
    except RuntimeError:
        import sys
        chained.exc_info = sys.exc_info()
    assert f.filter(chained) and chained.exc_info is None  # raised from one: dropped too
    other = record(ValueError("a bug"))
    assert f.filter(other) and other.exc_info is not None  # any other error keeps its traceback
