"""Fan-out of rollout episodes over a Prefect task runner.

The episodes of one :func:`tasks.rollout.runner.run_records` call are cut into *shards*: by
harness (ordered by harness name), then consecutive chunks of records (ordered by ``record_id``),
every sample of a record in the same shard. Each shard is one call of
:func:`tasks.rollout.harness.run_episodes`, run as one Prefect task run on the configured task
runner (``rollout.task_runner``):

- ``serial``: the shards run one after another in the calling thread, without Prefect (the
  reference path);
- ``thread``: Prefect's ``ThreadPoolTaskRunner`` with ``rollout.workers`` threads in this process.
  The policy is shared; its ``generate`` calls are serialised by a process-wide lock (the engine
  seeds torch's global RNG), so what overlaps is the harness work: tool runs in the sandbox,
  parsing, grading;
- ``dask``: ``prefect_dask.DaskTaskRunner``. With ``rollout.dask_address`` (``tcp://host:8786``)
  the shards run on that existing scheduler's workers; without it, on a ``distributed.LocalCluster``
  of ``rollout.workers`` worker processes (one thread each), started for the call and closed
  after. When the calling process already has a default Dask client
  (``distributed.get_client()``), prefect-dask runs the shards on that client's cluster instead.
- ``ray``: ``prefect_ray.RayTaskRunner``. With ``rollout.ray_address`` (``host:6379`` or
  ``ray://host:10001``) the shards run on that existing Ray cluster; without it, on a local Ray
  instance of ``rollout.workers`` CPUs started for the call. One shard is one Ray task (1 CPU).

On ``dask`` and ``ray`` each worker process loads the policy once (:func:`cached_policy`) from a
:class:`PolicySource`. A worker process that dies mid-shard (killed, out of memory) is handled by
the engine: the Dask scheduler reschedules the shard on a live worker (up to its
``distributed.scheduler.allowed-failures``, default 3, then ``KilledWorker``), Ray resubmits the
task (``max_retries``, default 3). A shard is a pure function of its input, so a rerun gives the
same rows. An exception raised by a shard is not retried: it fails the call, naming the shard.

Results are merged in shard order, so the rows are identical whatever the runner and the worker
count. The shard layout is a function of (records, samples, ``rollout.shard_size``) only, and the
engine seed of every shard is the one the whole harness gets (``seed_from(seed, tag,
harness_id)``): with ``shard_size`` unset (one shard per harness) the rows are those of the
pre-fan-out engine. What ``run_episodes`` must guarantee for this: see :func:`run_shard`.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from tasks.config import RolloutConfig, RunConfig, SandboxConfig
from tasks.rollout.cluster import DEFAULT_WORKER_TIMEOUT_S, await_shard
from tasks.harnesses.spec import HarnessSpec
from tasks.hashing import seed_from, sha256_dir, sha256_json
from tasks.rollout.engines import close_policy

log = logging.getLogger("harnessrl.rollout")

RUNNERS = ("serial", "thread", "dask", "ray")


class ShardError(RuntimeError):
    """A shard of episodes failed on its worker; the message names the shard (index, harness,
    records, episode count) and the runner, and the worker's exception is chained."""


@dataclass(frozen=True)
class PolicySource:
    """How to load a policy in any process: the run config (its ``policy`` section is what
    :func:`tasks.rollout.engines.load_policy` reads) and an optional adapter folder.

    ``adapter_sha256`` is the SHA-256 of the adapter folder (:func:`tasks.hashing.sha256_dir`),
    taken when the source is made, so a worker that finds other files under the same path fails
    instead of sampling from another policy.
    """

    cfg: RunConfig
    adapter_dir: str | None = None
    adapter_sha256: str = ""

    @classmethod
    def of(cls, cfg: RunConfig, adapter_dir: str | Path | None = None) -> "PolicySource":
        """The source of ``cfg.policy`` with the adapter in ``adapter_dir`` (None: base model).

        Raises:
            FileNotFoundError: ``adapter_dir`` is given and is not a directory.
        """
        if adapter_dir is None:
            return cls(cfg)
        return cls(cfg, str(Path(adapter_dir).resolve()), sha256_dir(adapter_dir))

    @property
    def key(self) -> str:
        """Cache key: SHA-256 of the policy config section and the adapter's content hash."""
        return sha256_json({"policy": self.cfg.policy.model_dump(mode="json"), "adapter_dir": self.adapter_dir,
                            "adapter_sha256": self.adapter_sha256})

    def load(self) -> Any:
        """Load the policy (``tasks.rollout.engines.load_policy``).

        Raises:
            ValueError: the adapter folder's content changed since the source was made.
        """
        from tasks.rollout.engines import load_policy

        if self.adapter_dir is not None and sha256_dir(self.adapter_dir) != self.adapter_sha256:
            raise ValueError(f"policy adapter {self.adapter_dir}: files changed since the rollout was planned "
                             f"(sha256 {self.adapter_sha256[:12]} expected)")
        return load_policy(self.cfg, adapter_dir=Path(self.adapter_dir) if self.adapter_dir else None)


# One policy per process: the last source loaded. Workers of one run_records call share a key, so
# a worker loads once; a new key (the next checkpoint) replaces the old model instead of keeping both.
_CACHE: dict[str, Any] = {}
_CACHE_LOCK = threading.Lock()
_GENERATE_LOCK = threading.Lock()
LOADS = [0]  # policies this process has loaded (for logs and tests)


def cached_policy(source: PolicySource) -> Any:
    """The policy of ``source``, loaded at most once per process while it is the latest one; the
    policy it replaces is closed (a vLLM engine's worker process ends with it)."""
    key = source.key
    with _CACHE_LOCK:
        if key not in _CACHE:
            for old in _CACHE.values():
                close_policy(old)
            _CACHE.clear()
            log.info("loading policy %s in this process", key[:12])
            _CACHE[key] = source.load()
            LOADS[0] += 1
        return _CACHE[key]


def release_policy(source: PolicySource) -> None:
    """Drop ``source``'s policy from this process's cache and close it (frees its weights, ends an
    engine's worker process)."""
    with _CACHE_LOCK:
        old = _CACHE.pop(source.key, None)
    if old is not None:
        close_policy(old)


class _SharedPolicy:
    """A policy shared by threads: ``generate`` under the process-wide lock (seeding torch's global
    RNG and sampling must not interleave with another thread's), and a private tokenizer copy."""

    def __init__(self, policy: Any):
        self._policy = policy
        self.tokenizer = copy.deepcopy(policy.tokenizer)

    def generate(self, prompts: list[list[int]], sampling: Any, seed: int, **states: Any) -> Any:
        """The policy's ``generate``; ``states``/``keep_states`` (the harness gives them only to a
        policy whose ``generate`` takes them: :func:`tasks.rollout.harness.takes_states`) and
        ``request_seeds`` (common random numbers) passed on when given."""
        with _GENERATE_LOCK:
            return self._policy.generate(prompts, sampling, seed, **states)

    @property
    def takes_states(self) -> bool:
        from tasks.rollout.harness import takes_states

        return takes_states(self._policy)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._policy, name)


@dataclass(frozen=True)
class Shard:
    """One unit of fan-out: consecutive records of one harness, every sample of each.

    ``index`` is the shard's position in the merge order; ``record_ids`` are sorted.
    """

    index: int
    count: int
    harness_id: str
    harness_name: str
    record_ids: tuple[str, ...]
    samples: int

    @property
    def episodes(self) -> int:
        return len(self.record_ids) * self.samples

    @property
    def label(self) -> str:
        n = len(self.record_ids)
        return (f"shard {self.index + 1}/{self.count} (harness {self.harness_name}, {n} record{'s' if n > 1 else ''} "
                f"{self.record_ids[0][:10]}..{self.record_ids[-1][:10]}, {self.episodes} episodes)")


def plan_shards(records: list[dict[str, Any]], specs: dict[str, HarnessSpec], samples: int,
                shard_size: int | None) -> list[Shard]:
    """Cut ``records`` x ``samples`` into shards: harnesses by name, records by id, then chunks of
    ``max(1, shard_size // samples)`` records (``shard_size`` None: one shard per harness).

    A shard never splits a record's samples (a sampling group stays in one batch), so a shard holds
    at most ``max(shard_size, samples)`` episodes. The layout does not depend on the runner or the
    worker count.

    Raises:
        ValueError: a record names a harness missing from ``specs``, or ``samples`` < 1.
    """
    if samples < 1:
        raise ValueError(f"samples={samples}: need at least one episode per record")
    missing = sorted({r["harness_id"] for r in records} - set(specs))
    if missing:
        raise ValueError(f"records name harness ids with no frozen spec: {[m[:12] for m in missing]}")
    per = None if shard_size is None else max(1, shard_size // samples)
    parts: list[tuple[str, tuple[str, ...]]] = []
    for hid in sorted({r["harness_id"] for r in records}, key=lambda h: (specs[h].name, h)):
        ids = sorted(r["record_id"] for r in records if r["harness_id"] == hid)
        step = per or len(ids)
        parts += [(hid, tuple(ids[i:i + step])) for i in range(0, len(ids), step)]
    return [Shard(i, len(parts), hid, specs[hid].name, ids, samples) for i, (hid, ids) in enumerate(parts)]


def episode_jobs(records: list[dict[str, Any]], tasks: dict[str, dict[str, Any]], samples: int, seed: int,
                 tag: str, policy_id: str) -> list[Any]:
    """The ``EpisodeJob`` list of ``records`` (in the given order) x ``samples``: episode id =
    ``sha256_json([record_id, tag, policy_id, sample, seed])[:32]``, episode seed =
    ``seed_from(seed, record_id, sample)``. Neither depends on the shard layout. A record with a
    ``noise_key`` (common random numbers) gives its jobs ``noise_seed = seed_from(seed, noise_key,
    sample)``: records of two harnesses with the same key draw the same sampler noise."""
    from tasks.rollout.harness import EpisodeJob

    return [EpisodeJob(sha256_json([r["record_id"], tag, policy_id, i, seed])[:32], r, tasks[r["task_id"]], i,
                       seed_from(seed, r["record_id"], i),
                       seed_from(seed, r["noise_key"], i) if r.get("noise_key") else None)
            for r in records for i in range(samples)]


@dataclass(frozen=True)
class ShardInput:
    """Everything a worker needs for one shard (picklable)."""

    shard: Shard
    spec: HarnessSpec
    records: list[dict[str, Any]]
    tasks: dict[str, dict[str, Any]]
    seed: int
    tag: str
    sandbox: SandboxConfig
    torch_threads: int


def run_shard(inp: ShardInput, policy: Any, on_turns: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Run one shard: ``run_episodes`` over its jobs with the harness's engine seed.

    ``policy`` is a :class:`PolicySource` (loaded through this process's cache) or a policy
    object; ``on_turns`` is passed to ``run_episodes`` (its turn slots add up to
    :func:`turn_slots` of the shard). Returns ``{"policy_id": str, "episodes": [...], "turns":
    [...]}`` as ``run_episodes`` returns them.

    What this needs from ``run_episodes(policy, spec, jobs, sandbox_cfg, seed=)``:

    1. A pure function of (policy weights, spec, the jobs in order, sandbox config, ``seed``): no
       dependence on the process, the thread, earlier calls or any global RNG state left by them
       (it seeds whatever it draws from; a policy object reused across shards keeps no state).
    2. ``episodes`` in job order, ``turns`` grouped by episode in job order, then by ``turn_idx``.
    With these, rows are byte-identical for any runner and worker count at a fixed shard layout.
    The process's torch intra-op thread count is pinned to ``inp.torch_threads`` first: it changes
    CPU reduction order, and so bf16 log-probs (measured on SmolLM2: 4 of 24 turns differ between
    1 and 2 threads); Dask's workers start with ``OMP_NUM_THREADS=1``.

    Raises:
        tasks.environments.sandbox.limits.HostLimitError: the hard RLIMIT_NOFILE of this process
            cannot hold the shard's sandboxes (checked before the policy loads).
    """
    from tasks.rollout.harness import run_episodes
    from tasks.environments.sandbox.limits import ensure_descriptors, episode_sandboxes

    # the shard's sandboxes are all open at once (a dask/ray worker process has not been checked)
    ensure_descriptors(episode_sandboxes(inp.spec, [inp.tasks[r["task_id"]] for r in inp.records], inp.shard.samples),
                       inp.sandbox.backend, f"{inp.tag}: {inp.shard.label}")
    pin_torch_threads(inp.torch_threads)
    if isinstance(policy, PolicySource):
        policy = cached_policy(policy)

    jobs = episode_jobs(inp.records, inp.tasks, inp.shard.samples, inp.seed, inp.tag, policy.policy_id)
    eps, turns = run_episodes(policy, inp.spec, jobs, inp.sandbox,
                              seed=seed_from(inp.seed, inp.tag, inp.shard.harness_id), on_turns=on_turns)
    return {"policy_id": policy.policy_id, "episodes": eps, "turns": turns}


def turn_slots(inp: ShardInput) -> int:
    """A shard's progress units: ``spec.max_turns`` per episode (see ``run_episodes``)."""
    return inp.shard.episodes * inp.spec.max_turns


def pin_torch_threads(n: int) -> None:
    """Set torch's intra-op thread count of this process to ``n`` (>= 1) if it differs."""
    import torch

    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


def torch_threads(cfg: RunConfig) -> int:
    """Threads every shard's process runs torch with: ``policy.torch_threads``, else this process's
    current count (so worker processes compute exactly as the calling process would)."""
    import torch

    return cfg.policy.torch_threads or torch.get_num_threads()


def _shard_task() -> Any:
    from prefect import task
    from prefect.cache_policies import NO_CACHE

    def rollout_shard(inp: ShardInput, policy: Any, on_turns: Callable[[int], None] | None = None) -> dict[str, Any]:
        if isinstance(policy, PolicySource):
            policy = cached_policy(policy)
        return run_shard(inp, _SharedPolicy(policy), on_turns)

    return task(rollout_shard, name="rollout-shard", task_run_name="rollout-shard-{inp.shard.index}",
                cache_policy=NO_CACHE, persist_result=False, retries=0)


def _task_runner(rc: RolloutConfig) -> Any:
    if rc.task_runner == "thread":
        from prefect.task_runners import ThreadPoolTaskRunner

        return ThreadPoolTaskRunner(max_workers=rc.workers)
    if rc.task_runner == "dask":
        from prefect_dask import DaskTaskRunner

        if rc.dask_address is not None:
            return DaskTaskRunner(address=rc.dask_address)
        return DaskTaskRunner(cluster_class="distributed.LocalCluster",
                              cluster_kwargs={"n_workers": rc.workers, "threads_per_worker": 1, "processes": True,
                                              "dashboard_address": ":0", "silence_logs": logging.WARNING})
    if rc.task_runner == "ray":
        try:
            from prefect_ray import RayTaskRunner
        except ImportError:
            raise ValueError("rollout.task_runner='ray' needs prefect-ray and ray: pip install -e '.[ray]'") from None

        if rc.ray_address is not None:
            return RayTaskRunner(address=rc.ray_address, init_kwargs={"log_to_driver": False})
        return RayTaskRunner(init_kwargs={"num_cpus": rc.workers, "include_dashboard": False, "log_to_driver": False})
    raise ValueError(f"rollout.task_runner={rc.task_runner!r}: not one of {RUNNERS}")


@contextlib.contextmanager
def _shared_api(rc: RolloutConfig) -> Iterator[None]:
    """With no ``PREFECT_API_URL`` this process talks to Prefect's temporary local server; worker
    processes, given this process's settings, would each start a server of their own on the same
    database. Name this process's server in the settings the workers receive instead."""
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED, temporary_settings

    if rc.task_runner not in ("dask", "ray") or PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        yield
        return
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()  # one per process: the one this process's client already uses
    server.start()
    with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
        yield


def fan_out(inputs: list[ShardInput], policy: Any, rc: RolloutConfig) -> list[dict[str, Any]]:
    """:func:`iter_fan_out` as a list: every shard's result, in shard order."""
    return list(iter_fan_out(inputs, policy, rc))


def iter_fan_out(inputs: list[ShardInput], policy: Any, rc: RolloutConfig) -> Iterator[dict[str, Any]]:
    """Run every shard on ``rc.task_runner`` and yield their results in shard order, each as soon
    as it and the shards before it are done (the caller can write one shard's rows before the
    next arrives; on ``dask`` and ``ray`` every shard is submitted at once).

    Args:
        inputs: the shards, in merge order.
        policy: a :class:`PolicySource`, or a policy object (``serial`` and ``thread`` only: a
            policy that exists only in this process cannot reach worker processes).
        rc: the rollout config (``task_runner``, ``workers``, ``dask_address``, ``ray_address``).

    Raises:
        ValueError: a policy object with the ``dask`` or ``ray`` runner.
        ShardError: a shard failed; the first failure in shard order, naming it.
    """
    from tasks.progress import progress, run_logger

    # the bar counts turn slots (max_turns per episode, an episode that ends early frees the rest),
    # turn by turn on the in-process runners, shard by shard where shards run in other processes
    total = sum(turn_slots(inp) for inp in inputs)
    n_eps = sum(inp.shard.episodes for inp in inputs)
    tag = inputs[0].tag if inputs else "rollout"
    if rc.task_runner == "serial":
        run_logger().info("%s: %d episodes in %d shards (serial)", tag, n_eps, len(inputs))
        with progress(f"{tag}: {n_eps} episodes", total, "turn slots") as advance:
            for inp in inputs:
                used = _Counted(advance)
                try:
                    res = run_shard(inp, policy, used)
                except Exception as e:
                    raise ShardError(f"rollout {inp.shard.label} failed (runner serial): {type(e).__name__}: {e}") from e
                advance(turn_slots(inp) - used.n)
                yield res
        return
    if rc.task_runner != "thread" and not isinstance(policy, PolicySource):
        raise ValueError(f"rollout.task_runner={rc.task_runner!r} loads the policy in worker processes and needs a "
                         f"PolicySource; policy {getattr(policy, 'policy_id', policy)!r} exists only in this process "
                         "(use task_runner 'thread' or 'serial')")
    shard_task = _shard_task()
    where = _where(rc)
    run_logger().info("%s: %d episodes in %d shards (%s)", tag, n_eps, len(inputs), where)
    with progress(f"{tag}: {n_eps} episodes", total, "turn slots") as advance, \
            _shared_api(rc), _task_runner(rc) as runner:
        if rc.task_runner == "dask":  # a reused worker reports to this run's Prefect API, not an earlier one's
            from prefect.settings import PREFECT_API_URL

            from tasks.rollout.cluster import follow_api_url

            runner.client.run(follow_api_url, PREFECT_API_URL.value())
        counters = [_Counted(advance) if rc.task_runner == "thread" else None for _ in inputs]
        futures = [runner.submit(shard_task, {"inp": inp, "policy": policy, "on_turns": c})
                   for inp, c in zip(inputs, counters)]
        timeout = rc.worker_timeout_s or DEFAULT_WORKER_TIMEOUT_S
        for inp, fut, used in zip(inputs, futures, counters):
            if rc.task_runner in ("dask", "ray"):
                await_shard(fut, runner, rc.task_runner, where, timeout)  # NoWorkersError: one line, no shard named
            try:
                res = fut.result()
            except Exception as e:
                raise ShardError(f"rollout {inp.shard.label} failed (runner {where}): {type(e).__name__}: {e}") from e
            advance(turn_slots(inp) - (used.n if used is not None else 0))
            yield res


class _Counted:
    """``advance`` that also counts what it was given (a shard's slots so far)."""

    def __init__(self, advance: Callable[[int], None]) -> None:
        self.advance, self.n = advance, 0

    def __call__(self, n: int) -> None:
        self.n += n
        self.advance(n)


def check_cluster(rc: RolloutConfig, timeout_s: float = 5.0) -> None:
    """Refuse, in one line, a ``rollout.dask_address`` / ``ray_address`` where nothing answers: a
    TCP connection to its host and port within ``timeout_s`` (Dask's client would otherwise retry
    for 30 s and end in about 1,000 lines of tracebacks). Addresses without a host and port
    (``auto``, ``inproc://``, ``ucx://``) and runners without an address are not checked.

    Raises:
        ValueError: nothing accepts a connection there (the key, the value and the reason)."""
    import socket

    key, addr, kind = (("dask_address", rc.dask_address, "Dask scheduler") if rc.task_runner == "dask" else
                       ("ray_address", rc.ray_address, "Ray head") if rc.task_runner == "ray" else ("", None, ""))
    if addr is None or addr == "auto" or addr.startswith(("inproc://", "ucx://")):
        return
    hostport = addr.split("://", 1)[-1].split("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        return
    host = host.strip("[]")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return
    except OSError as e:
        why = e.strerror or (f"no answer in {timeout_s:g} s" if isinstance(e, TimeoutError) else type(e).__name__)
    start = f"dask scheduler --port {port}" if kind == "Dask scheduler" else f"ray start --head --port {port}"
    raise ValueError(f"rollout.{key}={addr!r}: no {kind} answers at {host}:{port} ({why}); start one "
                     f"(`{start}`) or unset rollout.{key} to start a local cluster")


def _where(rc: RolloutConfig) -> str:
    """The runner as error messages and log lines name it."""
    if rc.task_runner == "dask" and rc.dask_address:
        return f"dask at {rc.dask_address}"
    if rc.task_runner == "ray" and rc.ray_address:
        return f"ray at {rc.ray_address}"
    return f"{rc.task_runner}, {rc.workers} worker{'s' if rc.workers != 1 else ''}"
