"""Data-parallel training with torch.distributed: which groups each process trains on, starting
the processes (torch's own launcher) or joining ``torchrun``'s, and gathering what every process
needs from the others.

The global batch keeps its meaning (docs/methods/index.md, "Common ground"): a mini-batch of
``train.batch_size`` whole groups is split across the ``world_size`` processes by whole groups
(:func:`shard_groups`), each process computes its share's loss with the *mini-batch's* global
denominators (tokens or sequences) scaled by ``world_size``, and DDP averages the gradients, so
the averaged gradient is the one-process gradient of the whole mini-batch. Advantages are
normalised per group, and a group is never split, so they are unaffected. Every process holds the
same parameters and takes the same AdamW step; only rank 0 writes the adapter, the resumable
state and the snapshots.
"""

from __future__ import annotations

import os
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence


@dataclass(frozen=True)
class DistContext:
    """This process's place in the process group: ``rank`` in ``[0, world_size)``."""

    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        """True on rank 0, the process that writes artifacts."""
        return self.rank == 0


def context() -> DistContext:
    """The current process group's rank and size (rank 0 of 1 when none is initialised)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return DistContext(rank=dist.get_rank(), world_size=dist.get_world_size())
    return DistContext()


def shard_groups(groups: Sequence[Sequence[int]], weights: Sequence[float], world_size: int) -> list[list[int]]:
    """Assign whole groups to ``world_size`` processes, balancing ``weights`` (e.g. tokens).

    Greedy: groups by decreasing weight (ties: earlier first) each to the least-loaded process
    (ties: the lowest rank). A pure function of its arguments, so every process computes the same
    assignment. Returns, per rank, the indices into ``groups`` it trains on, in ascending order;
    a rank may get none when there are fewer groups than processes.

    Raises:
        ValueError: ``world_size`` < 1 or ``weights`` not one per group.
    """
    if world_size < 1:
        raise ValueError(f"shard_groups: world_size={world_size} must be >= 1")
    if len(weights) != len(groups):
        raise ValueError(f"shard_groups: {len(weights)} weights for {len(groups)} groups")
    load = [0.0] * world_size
    out: list[list[int]] = [[] for _ in range(world_size)]
    for g in sorted(range(len(groups)), key=lambda g: (-float(weights[g]), g)):
        r = min(range(world_size), key=lambda r: (load[r], r))
        out[r].append(g)
        load[r] += float(weights[g])
    return [sorted(o) for o in out]


def my_share(indices: Sequence[int], group_of: Callable[[int], Any], weight_of: Callable[[int], float],
             ctx: DistContext) -> list[int]:
    """The part of ``indices`` (sequence indices of whole groups) that rank ``ctx.rank`` trains on:
    its groups under :func:`shard_groups` (groups in order of first appearance, weighted by the sum
    of ``weight_of`` over their members), in the order of ``indices``. ``indices`` itself, unchanged,
    on one process."""
    if ctx.world_size == 1:
        return list(indices)
    order: dict[Any, list[int]] = {}
    for i in indices:
        order.setdefault(group_of(i), []).append(i)
    keys = list(order)
    shards = shard_groups([order[k] for k in keys], [sum(weight_of(i) for i in order[k]) for k in keys],
                          ctx.world_size)
    mine = {keys[g] for g in shards[ctx.rank]}
    return [i for i in indices if group_of(i) in mine]


def gather_dict(part: dict[Any, Any], ctx: DistContext) -> dict[Any, Any]:
    """The union of every rank's ``part`` (``torch.distributed.all_gather_object``; keys are
    disjoint across ranks, e.g. sequence index -> 1-D CPU tensor). ``part`` itself on one process."""
    if ctx.world_size == 1:
        return part
    import torch.distributed as dist

    parts: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(parts, part)
    out: dict[Any, Any] = {}
    for p in parts:
        out.update(p)
    return out


def barrier(ctx: DistContext) -> None:
    """Wait for every rank (a no-op on one process)."""
    if ctx.world_size > 1:
        import torch.distributed as dist

        dist.barrier()


def under_torchrun() -> bool:
    """True when this process was started by ``torchrun`` (or another launcher setting ``RANK`` and
    ``WORLD_SIZE``) as one of several."""
    return "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1


def check_backend(backend: str, world_size: int) -> None:
    """Refuse what cannot run here, in one line.

    Raises:
        RuntimeError: ``nccl`` without CUDA, or with fewer CUDA devices than ``world_size`` on
            this host; torch.distributed unavailable; an unknown backend.
    """
    import torch
    import torch.distributed as dist

    if not dist.is_available():
        raise RuntimeError("train.distributed: this torch build has no torch.distributed")
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise RuntimeError("train.distributed.backend='nccl' needs CUDA, and no CUDA device is available; use "
                               "backend 'gloo'")
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        if torch.cuda.device_count() < local:
            raise RuntimeError(f"train.distributed: {local} nccl processes on this host but only "
                               f"{torch.cuda.device_count()} CUDA device(s)")
    elif backend != "gloo":
        raise RuntimeError(f"train.distributed.backend={backend!r} is not one of gloo, nccl")


def join(backend: str, timeout_s: float | None = None) -> DistContext:
    """Join the process group described by the environment (``torchrun``: ``RANK``,
    ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) unless already in one;
    with ``nccl`` the process uses CUDA device ``LOCAL_RANK``. ``timeout_s``: how long a
    collective waits for the other ranks (None: ``HARNESSRL_DIST_TIMEOUT_S``, default 86400 s,
    because under ``torchrun`` the other ranks wait while rank 0 runs freeze and rollout).

    Raises:
        RuntimeError: see :func:`check_backend`.
    """
    import torch
    import torch.distributed as dist

    import datetime

    world = int(os.environ.get("WORLD_SIZE", "1"))
    check_backend(backend, world)
    if not dist.is_initialized():
        if torch.cuda.is_available() and backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        if timeout_s is None:
            timeout_s = float(os.environ.get("HARNESSRL_DIST_TIMEOUT_S", "86400"))
        timeout = datetime.timedelta(seconds=timeout_s)
        dist.init_process_group(backend=backend, init_method="env://", timeout=timeout)
    return context()


def send_job(fn: Callable[..., Any], args: tuple) -> None:
    """Rank 0 under ``torchrun``: hand ``fn(*args)`` to the other ranks, waiting in :func:`follow`
    (``broadcast_object_list``); rank 0 then runs the same call itself."""
    import torch.distributed as dist

    dist.broadcast_object_list([(fn, args)], src=0)


def follow(backend: str) -> int:
    """A rank other than 0 under ``torchrun``: join the group, then run every job rank 0 sends
    (:func:`send_job`) until it sends the end (:func:`finish`); leave the group. Returns the number
    of jobs run.

    Raises:
        RuntimeError: see :func:`check_backend`; whatever a job raises.
    """
    import torch.distributed as dist

    join(backend)
    n = 0
    try:
        while True:
            box: list[Any] = [None]
            dist.broadcast_object_list(box, src=0)
            if box[0] is None:
                return n
            fn, args = box[0]
            fn(*args)
            n += 1
    finally:
        dist.destroy_process_group()


def finish() -> None:
    """Rank 0 under ``torchrun``: tell the ranks in :func:`follow` that no job follows, and leave
    the group (a no-op outside one)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        if dist.get_rank() == 0:
            dist.broadcast_object_list([None], src=0)
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(local_rank: int, world_size: int, backend: str, port: int, fn: Callable[..., Any], args: tuple,
            result_path: str) -> None:
    """One spawned process: join the group (MASTER_ADDR 127.0.0.1), run ``fn(*args)``, rank 0
    saves its return value to ``result_path``."""
    import logging

    import torch
    import torch.distributed as dist

    if local_rank == 0 and not logging.getLogger().handlers:  # rank 0's log lines reach the launcher's stderr
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s [rank 0]: %(message)s")
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(local_rank),
                       "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world_size),
                       "LOCAL_WORLD_SIZE": str(world_size)})
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    join(backend, timeout_s=1800.0)  # torch's default: the ranks start together, nothing waits long
    try:
        out = fn(*args)
        if local_rank == 0:
            torch.save(out, result_path)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def launch(fn: Callable[..., Any], args: tuple, world_size: int, backend: str) -> Any:
    """Run ``fn(*args)`` in ``world_size`` new processes on this host, one process group
    (``torch.multiprocessing.start_processes``, start method ``spawn``; rendezvous at
    ``127.0.0.1`` on a free port), and return rank 0's return value. ``fn`` must be a module-level
    function and ``args`` picklable; with ``nccl`` rank r uses CUDA device r.

    Raises:
        RuntimeError: see :func:`check_backend`.
        torch.multiprocessing.ProcessRaisedException: a process raised (the others are ended);
            the message carries its traceback.
    """
    import torch
    import torch.multiprocessing as mp

    check_backend(backend, world_size)
    with tempfile.TemporaryDirectory(prefix="harnessrl-ddp-") as tmp:
        result = str(Path(tmp) / "rank0.pt")
        mp.start_processes(_worker, args=(world_size, backend, _free_port(), fn, args, result), nprocs=world_size,
                           join=True, start_method="spawn")
        return torch.load(result, weights_only=False)


def shard_base_weights(root: Any, layers: Sequence[Any], keep: set[Any], device: str) -> Any:
    """Shard the frozen base weights over the process group with FSDP2
    (``torch.distributed.fsdp.fully_shard``, one 1-D mesh of all ranks): each module of ``layers``
    (the decoder layers) is one unit, all-gathered before its forward and freed after it (and
    again in the backward pass), and ``root`` (the module every forward goes through) holds the
    rest (embeddings, final norm, output projection), whole from its forward's start to its end
    (and again in the backward pass). Between passes a rank stores 1/N of the base weights.

    ``keep`` (the LoRA weights) is left out of FSDP (``ignored_params``): replicated on every rank
    like under DDP, so the adapter, its AdamW state and its checkpoints are the plain tensors of one
    process; their gradients are averaged by :func:`average_gradients`. No gradient of a sharded
    weight exists (the base is frozen), so FSDP itself reduces nothing. Every rank must then run
    the same number of forward (and backward) passes, each all-gathering the same layers: see
    :func:`max_over_ranks`.

    Returns ``root`` (now an ``FSDPModule``).
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cuda" if device == "cuda" else "cpu", (dist.get_world_size(),))
    for layer in layers:
        fully_shard(layer, mesh=mesh, ignored_params=keep)
    # the root too is freed after every forward (FSDP keeps a root whole until the backward pass by
    # default): after a no-grad pass every rank is then in the same state, whatever rank 0 alone
    # does next (saving the adapter reshards a whole root on that rank only, and the ranks' next
    # all-gathers would no longer match)
    return fully_shard(root, mesh=mesh, ignored_params=keep, reshard_after_forward=True)


def max_over_ranks(values: Sequence[int], ctx: DistContext) -> list[int]:
    """Each of ``values``' largest value over every rank (one ``all_reduce`` MAX; for 0/1 flags:
    whether any rank set it); ``values`` itself on one process."""
    if ctx.world_size == 1:
        return list(values)
    import torch
    import torch.distributed as dist

    t = torch.tensor(list(values), dtype=torch.int64, device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [int(v) for v in t.tolist()]


def average_gradients(params: Sequence[Any], ctx: DistContext) -> None:
    """Replace each parameter's gradient by its mean over the ranks, in one ``all_reduce`` of the
    gradients flattened together (a missing gradient counts as zeros and is filled in). What DDP
    does for the replicated parameters; a no-op on one process."""
    if ctx.world_size == 1 or not params:
        return
    import torch
    import torch.distributed as dist

    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= ctx.world_size
    off = 0
    for p, g in zip(params, grads):
        n = g.numel()
        p.grad = flat[off:off + n].view_as(p).clone()
        off += n
