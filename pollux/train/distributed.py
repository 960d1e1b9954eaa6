"""The job's process group: joining and leaving it, and what the replicas do in it together.

`init` reads the environment contract and joins the group; `shutdown` leaves it. `Replicas`
is one replica's view of the group (rank, size, nodes, devices) with the few collectives the
trainer issues outside DDP: a flag from any replica, an object from rank 0, the SUM all-reduce
that carries an agreement, and the gradient sum of an epoch's irregular last step. With one
replica each of them is a local no-op, so every caller is the same code at any size.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

import structlog
import torch
import torch.distributed as dist

# Imported before any process group can exist: `torch.distributed.nn` gives its functions the
# default ``group=group.WORLD``, evaluated at import, so importing it later (DDP does, through
# torch._dynamo) pins the world group for good. `destroy_process_group` could then no longer
# free it, and its communication threads would run on into interpreter shutdown, where they
# can abort a replica that finished its work ("terminate called without an active exception").
import torch.distributed.nn
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from pollux.train.data import MicroBatchInfo
from pollux.train.env import TrainEnv
from pollux.train.errors import InvalidValueError

log = structlog.get_logger(__name__)


def default_device(env: TrainEnv) -> torch.device:
    """The device a replica trains on: its GPU when CUDA is usable, else the CPU.

    With one visible GPU (the launcher's usual ``CUDA_VISIBLE_DEVICES``) that GPU is used;
    with several, the replica's ``LOCAL_RANK`` selects one.
    """
    if env.cuda_visible_devices == () or not torch.cuda.is_available():
        return torch.device("cpu")
    count = torch.cuda.device_count()
    index = env.local_rank if count > 1 else 0
    if index >= count:
        raise InvalidValueError(
            "LOCAL_RANK",
            f"{env.local_rank} selects GPU {index} but only {count} are visible; "
            "check CUDA_VISIBLE_DEVICES",
        )
    return torch.device("cuda", index)


def init(
    env: TrainEnv | None = None, *, backend: str | None = None, timeout_s: float = 300.0
) -> TrainEnv:
    """Read the environment contract and join the job's process group.

    Binds ``job_id`` and ``rank`` into structlog's context for this process. With one replica no
    process group is created. Calling it again is harmless.

    Args:
        env: The contract; default: read from the environment.
        backend: ``"nccl"`` or ``"gloo"``; default nccl when the replica has a GPU, else gloo.
        timeout_s: How long collectives (and the rendezvous) may wait for other replicas.

    Returns:
        The contract in effect.
    """
    env = env if env is not None else TrainEnv.from_environ()
    structlog.contextvars.bind_contextvars(job_id=env.job_id, rank=env.rank)
    if not env.distributed or dist.is_initialized():
        return env
    device = default_device(env)
    if backend is None:
        backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    started = time.perf_counter()
    dist.init_process_group(
        backend,
        init_method=f"tcp://{env.master_addr}:{env.master_port}",
        rank=env.rank,
        world_size=env.world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    log.info(
        "process_group_ready",
        backend=backend,
        world_size=env.world_size,
        seconds=round(time.perf_counter() - started, 3),
    )
    return env


def shutdown() -> None:
    """Leave the job's process group, if this process is in one (harmless otherwise).

    Call it once training is over, after `ElasticTrainer.close`: it joins the group's
    communication threads while the interpreter is still whole, so none outlives it into
    shutdown, where one can abort the process and turn a finished replica into a failed one.
    """
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        log.info("process_group_left")


def any_replica(flag: bool, *, world_size: int, device: torch.device) -> bool:
    """Whether `flag` is set on any replica; a collective (every replica calls it) when K > 1.

    Args:
        flag: This replica's flag.
        world_size: Replicas K.
        device: Where the collective's tensor lives (the backend's device).
    """
    if world_size == 1:
        return flag
    tensor = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(tensor)
    return bool(tensor.item() > 0)


@dataclass(frozen=True, slots=True)
class PendingSum:
    """A SUM all-reduce in flight (`Replicas.start_sum`); `result` waits for it."""

    work: Any
    """torch's handle, or None when there was nothing to wait for (one replica)."""
    buffer: torch.Tensor

    def result(self) -> list[float]:
        """The summed values, once every replica has contributed."""
        if self.work is not None:
            self.work.wait()
        return cast(list[float], self.buffer.tolist())


@dataclass(frozen=True, slots=True)
class Replicas:
    """This replica's view of the job's process group.

    Attributes:
        rank: This replica's rank (0 leads: it polls, reports and writes checkpoints).
        world_size: Replicas K.
        num_nodes: Nodes N the replicas run on.
        device: The training device.
        comm_device: Where the collectives' tensors live (the device with NCCL, else the CPU).
    """

    rank: int
    world_size: int
    num_nodes: int
    device: torch.device
    comm_device: torch.device

    @classmethod
    def join(cls, env: TrainEnv, device: torch.device | None = None) -> Replicas:
        """The group as `init` joined it, training on `device` (default: `default_device`).

        Makes a CUDA device the current one (timing events and NCCL object collectives use
        it), and counts the nodes (a collective) unless the environment says how many.
        """
        device = device if device is not None else default_device(env)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        backend = None
        if env.world_size > 1 and dist.is_initialized():
            backend = str(dist.get_backend())
        comm = device if backend == "nccl" else torch.device("cpu")
        nodes = env.num_nodes
        if nodes is None and env.world_size == 1:
            nodes = 1
        elif nodes is None:
            names: list[Any] = [None] * env.world_size
            dist.all_gather_object(names, socket.gethostname())
            nodes = len(set(names))
        return cls(env.rank, env.world_size, nodes, device, comm)

    @property
    def leader(self) -> bool:
        """Whether this is rank 0."""
        return self.rank == 0

    def any(self, flag: bool) -> bool:
        """Whether `flag` is set on any replica; a collective (every replica calls it) if K > 1."""
        return any_replica(flag, world_size=self.world_size, device=self.comm_device)

    def from_leader(self, value: Any) -> Any:
        """Rank 0's `value` on every replica (a collective if K > 1; picklable values)."""
        if self.world_size == 1:
            return value
        box: list[Any] = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def start_sum(self, values: Sequence[float], tail: torch.Tensor | None = None) -> PendingSum:
        """Start the float64 SUM all-reduce of `values` followed by `tail`, without waiting."""
        size = len(values)
        buffer = torch.tensor(
            [*values, *([0.0] * (0 if tail is None else tail.numel()))],
            dtype=torch.float64,
            device=self.comm_device,
        )
        if tail is not None:
            buffer[size:] = tail.to(self.comm_device)
        if self.world_size == 1:
            return PendingSum(None, buffer)
        return PendingSum(dist.all_reduce(buffer, async_op=True), buffer)

    def sum_gradients(self, params: Sequence[torch.Tensor]) -> None:
        """Sum the gradients of `params` over replicas in place (no DDP bucket).

        For an epoch's irregular last step, where each replica's gradient is already weighted
        by its samples' share of the step, so the sum is the exact mean over the step's
        samples. A presence count per parameter keeps gradients that no replica produced at
        None.
        """
        if self.world_size == 1:
            return
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for p in params:
            by_dtype.setdefault(p.dtype, []).append(p)
        for dtype, group in by_dtype.items():
            pieces = [
                (_dense_grad(p) if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                for p in group
            ]
            present = torch.tensor(
                [0.0 if p.grad is None else 1.0 for p in group], dtype=dtype, device=self.device
            )
            flat = torch.cat([*pieces, present]).to(self.comm_device)
            dist.all_reduce(flat)
            flat = flat.to(self.device)
            offset = 0
            for p in group:
                n = p.numel()
                p.grad = flat[offset : offset + n].view_as(p).clone()
                offset += n
            counts = flat[offset:].tolist()
            for p, count in zip(group, counts, strict=True):
                if count == 0:
                    p.grad = None

    def wrap(
        self, module: nn.Module, ddp_kwargs: Mapping[str, Any] | None
    ) -> DistributedDataParallel | None:
        """The DDP wrapper of `module` with several replicas, else None."""
        if self.world_size == 1:
            return None
        device_ids = [self.device] if self.device.type == "cuda" else None
        return DistributedDataParallel(module, device_ids=device_ids, **dict(ddp_kwargs or {}))


def no_sync_unless_synchronising(
    ddp: DistributedDataParallel | None, info: MicroBatchInfo
) -> AbstractContextManager[Any]:
    """DDP's ``no_sync`` around every micro-batch but the one that synchronises.

    Only the last micro-batch of a regular step synchronises (DDP's bucketed all-reduce); the
    others accumulate, and an epoch's irregular last step runs the plain module, its gradients
    summed by `Replicas.sum_gradients`.
    """
    if ddp is None or (info.regular and info.is_last):
        return nullcontext()
    return ddp.no_sync()


def _dense_grad(param: torch.Tensor) -> torch.Tensor:
    """The gradient as a dense tensor (sparse ones, e.g. of ``Embedding(sparse=True)``)."""
    assert param.grad is not None
    return param.grad.to_dense() if param.grad.is_sparse else param.grad
