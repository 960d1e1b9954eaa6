"""Step-time overhead of `pollux.train` over a plain PyTorch (DDP) loop on a small model.

The library adds per-step learning-rate scaling, step-time marks, the metrics reporter thread,
gradient hooks and, every `--stats-interval` M0-batches, the gradient noise scale (a few passes
over the gradients and, with several replicas, one small all-reduce). This script measures that
against the same model trained by a plain loop (`DistributedDataParallel`, ``no_sync`` for
accumulation, `DistributedSampler` + `DataLoader`) in the same processes, the loops alternating
in ABBA segments; the overhead is the median over rounds of the ratio of the segments' median
step times, which cancels most of a shared machine's drift. Configurations: 1 and 2 processes
(gloo on CPU; NCCL with a GPU per process), with and without accumulation, one CPU thread
each. Figures: docs/results.md, "Step-time overhead".

Usage: python benchmarks/train_overhead.py [--steps N] [--rounds R] [--stats-interval I] ...
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import torch
import torch.distributed as dist
from torch import nn
from torch.multiprocessing.spawn import start_processes as _start_processes
from torch.nn import functional
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import pollux.train as pt

start_processes: Callable[..., object] = _start_processes
"""torch's process launcher, typed (torch leaves it unannotated)."""


@dataclass(frozen=True)
class Case:
    """One measured configuration."""

    replicas: int
    local_bsz: int
    accum_steps: int

    @property
    def label(self) -> str:
        """Short description for the table."""
        return f"K={self.replicas} m={self.local_bsz} s={self.accum_steps}"


def make_model(features: int, hidden: int, classes: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(features, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, classes),
    )


def make_data(samples: int, features: int, classes: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(samples, features, generator=gen)
    y = torch.randint(0, classes, (samples,), generator=gen)
    return TensorDataset(x, y)


def device_for(rank: int, replicas: int) -> torch.device:
    if torch.cuda.is_available() and torch.cuda.device_count() >= replicas:
        return torch.device("cuda", rank)
    return torch.device("cpu")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def forever(loader: DataLoader[Any], sampler: DistributedSampler[Any] | None) -> Iterator[Any]:
    epoch = 0
    while True:
        if sampler is not None:
            sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


class PlainLoop:
    """The baseline: what a user would write without Pollux."""

    def __init__(self, case: Case, data: TensorDataset, args: argparse.Namespace) -> None:
        self.case = case
        self.device = device_for(dist.get_rank() if dist.is_initialized() else 0, case.replicas)
        module = make_model(args.features, args.hidden, args.classes).to(self.device)
        self.ddp: DistributedDataParallel | None = None
        self.model: nn.Module = module
        if case.replicas > 1:
            ids = [self.device] if self.device.type == "cuda" else None
            self.ddp = DistributedDataParallel(module, device_ids=ids)
            self.model = self.ddp
        self.optimizer = torch.optim.SGD(module.parameters(), lr=0.01, momentum=0.9)
        sampler: DistributedSampler[Any] | None = None
        if case.replicas > 1:
            sampler = DistributedSampler(data, seed=0)
        loader = DataLoader(
            data, batch_size=case.local_bsz, sampler=sampler, shuffle=sampler is None
        )
        self.batches = forever(loader, sampler)

    def step(self) -> None:
        """One optimizer step (all its micro-batches)."""
        for j in range(self.case.accum_steps):
            x, y = next(self.batches)
            x, y = x.to(self.device), y.to(self.device)
            last = j == self.case.accum_steps - 1
            context: AbstractContextManager[Any] = (
                self.ddp.no_sync() if self.ddp is not None and not last else nullcontext()
            )
            with context:
                loss = functional.cross_entropy(self.model(x), y) / self.case.accum_steps
                torch.autograd.backward(loss)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


class PolluxLoop:
    """The same training through `pollux.train.ElasticTrainer` (GNS, scaling, metrics)."""

    def __init__(
        self, case: Case, data: TensorDataset, args: argparse.Namespace, env: pt.TrainEnv
    ) -> None:
        self.case = case
        device = device_for(env.rank, case.replicas)
        model = make_model(args.features, args.hidden, args.classes)
        self.sink = pt.InMemorySink()
        self.trainer = pt.ElasticTrainer(
            model,
            torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
            data,
            init_batch_size=case.local_bsz * case.replicas,
            env=env,
            batch_source=pt.FixedBatchConfig(pt.BatchConfig(case.local_bsz, case.accum_steps)),
            metrics_sink=self.sink,
            device=device,
            checkpoint=pt.CheckpointConfig(enabled=False),
            measure=pt.MeasureConfig(stats_interval=args.stats_interval, report_interval_s=1.0),
            control=pt.ControlConfig(handle_sigterm=False),
        )
        self.batches = self._forever()

    def _forever(self) -> Iterator[Any]:
        while True:
            yield from self.trainer.batches()

    def step(self) -> None:
        """One optimizer step (all its micro-batches)."""
        for _ in range(self.case.accum_steps):
            x, y = next(self.batches)
            self.trainer.step(functional.cross_entropy(self.trainer.model(x), y))


def timed_steps(loop: PlainLoop | PolluxLoop, steps: int, device: torch.device) -> list[float]:
    times = []
    for _ in range(steps):
        sync(device)
        start = time.perf_counter()
        loop.step()
        sync(device)
        times.append(time.perf_counter() - start)
    return times


def worker(rank: int, case: Case, port: int, args: argparse.Namespace, out: Path) -> None:
    torch.set_num_threads(1)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    env = pt.TrainEnv(rank=rank, world_size=case.replicas, master_port=port, job_id="bench")
    pt.init(env, backend="nccl" if device_for(rank, case.replicas).type == "cuda" else "gloo")
    data = make_data(args.samples, args.features, args.classes)
    plain = PlainLoop(case, data, args)
    pollux: PlainLoop | PolluxLoop = (
        PlainLoop(case, data, args) if args.noise_floor else PolluxLoop(case, data, args, env)
    )
    device = plain.device
    plain_times: list[float] = []
    pollux_times: list[float] = []
    timed_steps(plain, args.warmup, device)
    timed_steps(pollux, args.warmup, device)
    ratios: list[float] = []
    for r in range(args.rounds):
        # Short segments in ABBA order, so that drift of the machine's speed hits both alike;
        # the overhead is the median over rounds of the two segments' ratio.
        order = (plain, pollux) if r % 2 == 0 else (pollux, plain)
        medians = {}
        for loop in order:
            times = timed_steps(loop, args.steps, device)
            (plain_times if loop is plain else pollux_times).extend(times)
            medians[loop is plain] = statistics.median(times)
        ratios.append(medians[False] / medians[True])
        del order, loop
    if isinstance(pollux, PolluxLoop):
        pollux.trainer.close()
    del plain, pollux  # the plain loop's DDP wrapper holds the group: drop it before leaving
    if dist.is_initialized():
        dist.barrier()  # nobody tears down the group while another replica still uses it
        pt.shutdown()
    if rank == 0:
        torch.save(
            {
                "plain": plain_times,
                "pollux": pollux_times,
                "ratios": ratios,
                "device": str(device),
            },
            out,
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_case(case: Case, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.pt"
        start_processes(
            worker,
            args=(case, free_port(), args, out),
            nprocs=case.replicas,
            start_method="spawn",
        )
        result: dict[str, Any] = torch.load(out, weights_only=False)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="steps per segment")
    parser.add_argument("--rounds", type=int, default=40, help="segments per loop")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64, help="per-replica micro-batch")
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    parser.add_argument(
        "--noise-floor",
        action="store_true",
        help="time a second plain loop instead of pollux: the measurement's own noise",
    )
    parser.add_argument("--accum-steps", type=int, nargs="+", default=[1, 2])
    parser.add_argument(
        "--stats-interval",
        type=int,
        default=8,
        help="optimizer steps per gradient-statistics measurement (library default 8; "
        "1 = every step, as published)",
    )
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    cases = [Case(k, args.batch, s) for k in args.replicas for s in args.accum_steps]
    params = sum(
        p.numel() for p in make_model(args.features, args.hidden, args.classes).parameters()
    )
    print(
        f"stats_interval: {args.stats_interval}"
        + (" (noise floor: plain vs plain)" if args.noise_floor else "")
    )
    print(f"model: MLP {args.features}-{args.hidden}-{args.hidden}-{args.classes}, {params} params")
    print(f"{'configuration':<20} {'device':<8} {'plain ms':>9} {'pollux ms':>10} {'overhead':>9}")
    worst = -float("inf")
    for case in cases:
        result = run_case(case, args)
        plain = statistics.median(result["plain"]) * 1e3
        pollux = statistics.median(result["pollux"]) * 1e3
        overhead = (statistics.median(result["ratios"]) - 1.0) * 100
        worst = max(worst, overhead)
        print(
            f"{case.label:<20} {result['device']:<8} {plain:>9.3f} {pollux:>10.3f} "
            f"{overhead:>8.2f}%",
            flush=True,
        )
    print(f"overhead: {worst:.2f} %")


if __name__ == "__main__":
    main()
