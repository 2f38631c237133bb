"""The rollout stage's sections: ``sandbox`` and ``rollout``."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from tasks.config.base import LaterOptions, _Strict


class SandboxConfig(_Strict):
    """Where tool calls run: one sandbox per episode (``tasks/environments/sandbox``).

    Per command (each exec): ``wall_s`` wall-clock seconds, ``cpu_s`` CPU seconds (RLIMIT_CPU),
    ``memory_mb`` MiB of address space per process (RLIMIT_AS), ``file_size_mb`` MiB per written
    file (RLIMIT_FSIZE), ``max_open_files`` (RLIMIT_NOFILE), ``max_procs`` processes+threads
    (bwrap: RLIMIT_NPROC in the sandbox's own user namespace; docker: the container's pids cgroup),
    ``output_bytes`` bytes kept of each of stdout/stderr, ``output_kill_bytes`` bytes of
    stdout+stderr after which the command is killed (status ``output_limit``).
    Per sandbox: ``workdir_mb`` MiB of the tmpfs at /app (persists across the episode's execs),
    ``tmp_mb`` MiB of each of the tmpfs at /tmp and /dev/shm.
    docker only: ``cpus`` CPU cores (CFS quota), ``docker_image`` (None: the image that
    ``scripts/setup-docker.sh`` builds from this checkout, ``harnessrl-sandbox:<content hash>``),
    ``docker_host`` (None: ``$DOCKER_HOST`` or the default socket). The container's memory cgroup
    limit is ``memory_mb + workdir_mb + 2 * tmp_mb + 64`` MiB (commands, tmpfs pages, server).
    Engine: ``parallel`` episodes of a batch run their tool calls at the same time (threads; each
    episode has its own sandbox).
    """

    backend: Literal["bwrap", "docker"] = "bwrap"
    wall_s: float = Field(default=5.0, gt=0, le=3600)
    cpu_s: int = Field(default=5, gt=0, le=3600)
    memory_mb: int = Field(default=512, ge=64, le=65536)
    output_bytes: int = Field(default=4096, ge=256, le=64 * 1024 * 1024)
    output_kill_bytes: int = Field(default=1024 * 1024, ge=256, le=1024 * 1024 * 1024)
    max_procs: int = Field(default=64, ge=4, le=4096)
    file_size_mb: int = Field(default=16, ge=1, le=65536)
    max_open_files: int = Field(default=256, ge=16, le=65536)
    workdir_mb: int = Field(default=64, ge=1, le=65536)
    tmp_mb: int = Field(default=64, ge=1, le=65536)
    cpus: float = Field(default=1.0, gt=0, le=256)
    docker_image: str | None = Field(default=None, min_length=1)
    docker_host: str | None = Field(default=None, min_length=1)
    parallel: int = Field(default=4, ge=1, le=256)

    @model_validator(mode="after")
    def _consistent(self) -> "SandboxConfig":
        if self.output_kill_bytes < self.output_bytes:
            raise ValueError(f"sandbox.output_kill_bytes={self.output_kill_bytes} must be >= "
                             f"sandbox.output_bytes={self.output_bytes}")
        if self.backend != "docker":
            for k in ("docker_image", "docker_host"):
                if getattr(self, k) is not None:
                    raise ValueError(f"sandbox.{k}={getattr(self, k)!r} is only used by backend 'docker', "
                                     f"not {self.backend!r}")
        return self


class RolloutConfig(LaterOptions):
    """Training rollouts: ``samples_per_task`` episodes (the group size G) per train record.

    Fan-out (also used by evaluation and online sampling; see ``tasks/rollout/fanout.py``):
    episodes are cut into shards of whole records, ``shard_size`` episodes at most (None: one shard
    per harness), run on ``task_runner`` (``serial`` in this thread, ``thread`` Prefect thread pool,
    ``dask`` Dask worker processes, ``ray`` Ray tasks) with ``workers`` threads or processes.
    ``dask_address`` (``tcp://host:port``) names an existing Dask scheduler and ``ray_address``
    (``host:port`` of a Ray head, or ``ray://host:port``) an existing Ray cluster; unset, the
    runner starts a local one of ``workers`` processes for the call. ``worker_timeout_s`` (None:
    300): on ``dask`` and ``ray``, the seconds the fan-out waits with no live worker before it
    fails, naming the cluster. The runner, its address, ``workers`` and the timeout never change
    the rows, so they are left out of the cache key.
    """

    samples_per_task: int = Field(default=4, ge=1)
    task_runner: Literal["serial", "thread", "dask", "ray"] = "thread"
    workers: int = Field(default=2, ge=1, le=64)
    shard_size: int | None = Field(default=None, ge=1)
    dask_address: str | None = Field(default=None, pattern=r"^(tcp|tls|ucx|inproc)://\S+$")
    ray_address: str | None = Field(default=None, pattern=r"^(ray://\S+|auto|[A-Za-z0-9_.\[\]:-]+:\d+)$")
    worker_timeout_s: float | None = Field(default=None, gt=0)
    _later: ClassVar[tuple[str, ...]] = ("worker_timeout_s",)

    @model_validator(mode="after")
    def _address_of_its_runner(self) -> "RolloutConfig":
        for key, runner in (("dask_address", "dask"), ("ray_address", "ray")):
            if getattr(self, key) is not None and self.task_runner != runner:
                raise ValueError(f"rollout.{key}={getattr(self, key)!r} is only used by task_runner {runner!r}, not "
                                 f"{self.task_runner!r}")
        return self
