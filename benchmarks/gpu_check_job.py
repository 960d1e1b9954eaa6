"""The GPU check's own job (benchmarks/gpu_check.py): a replica run by a Pollux launcher.

``probe``: print this replica's CUDA_VISIBLE_DEVICES, device and device name, join the job's
process group with the backend `pollux.train` picks (NCCL on a GPU, gloo on a CPU slot; with
one replica a group of one, which the library would not make), all-reduce a tensor and check
the sum. ``example ARGS``: print the same identity, then run examples/elastic_classifier.py
with ARGS in this process; on a GPU, print its peak CUDA memory when it exits. ``idle``: wait
for SIGTERM (a job that only takes a GPU). Each record is one line, a tag and a JSON object.

    python gpu_check_job.py probe | example ARGS... | idle
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import signal
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import pollux.train as pt
from pollux.train.distributed import default_device

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "elastic_classifier.py"
PROBE_TAG = "GPUCHECK_PROBE"
EXAMPLE_TAG = "GPUCHECK_EXAMPLE"
MEMORY_TAG = "GPUCHECK_MEMORY"
ALLREDUCE_BYTES_GPU = 256 << 20
"""Size of the timed all-reduce on GPUs (fp32), large enough to show NCCL's bandwidth."""
ALLREDUCE_BYTES_CPU = 4 << 20
TIMED_ALLREDUCES = 5


def emit(tag: str, record: dict[str, Any]) -> None:
    """Print one record: the tag, a space, the JSON object."""
    print(f"{tag} {json.dumps(record, sort_keys=True)}", flush=True)


def identity(env: pt.TrainEnv, device: torch.device) -> dict[str, Any]:
    """Who and where this replica is, as the launcher set it and torch sees it."""
    record: dict[str, Any] = {
        "generation": env.allocation_gen,
        "rank": env.rank,
        "world": env.world_size,
        "local_rank": env.local_rank,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "device": str(device),
        "device_name": "",
        "torch": torch.__version__,
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        record |= {
            "device_name": torch.cuda.get_device_name(device),
            "device_memory_gib": round(props.total_memory / 2**30, 1),
            "cuda": torch.version.cuda,
            "visible_device_count": torch.cuda.device_count(),
        }
    return record


def probe() -> int:
    """Identity, then one all-reduce checked and a few timed, over the job's replicas."""
    env = pt.TrainEnv.from_environ()
    device = default_device(env)
    record = identity(env, device)
    if env.distributed:
        pt.init(env)  # the library chooses the backend
    else:  # pt.init makes no group for one replica: the same choice, made here
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            init_method=f"tcp://{env.master_addr}:{env.master_port}",
            rank=env.rank,
            world_size=env.world_size,
            timeout=timedelta(seconds=120),
        )
    comm = device if dist.get_backend() == "nccl" else torch.device("cpu")
    world = dist.get_world_size()
    expected = world * (world + 1) / 2
    small = torch.full((1024,), float(dist.get_rank() + 1), device=comm)
    dist.all_reduce(small)
    ok = bool(torch.all(small == expected).item())
    size = (ALLREDUCE_BYTES_GPU if comm.type == "cuda" else ALLREDUCE_BYTES_CPU) // 4
    big = torch.ones(size, dtype=torch.float32, device=comm)
    dist.all_reduce(big)  # warm-up (NCCL builds its rings on the first call)
    _sync(comm)
    started = time.perf_counter()
    for _ in range(TIMED_ALLREDUCES):
        dist.all_reduce(big)
    _sync(comm)
    seconds = (time.perf_counter() - started) / TIMED_ALLREDUCES
    ok = ok and bool(torch.all(big == float(world) ** (TIMED_ALLREDUCES + 1)).item())
    nccl = None
    if comm.type == "cuda":
        nccl = ".".join(map(str, torch.cuda.nccl.version()))  # type: ignore[no-untyped-call]
    record |= {
        "backend": str(dist.get_backend()),
        "group_world": world,
        "allreduce_ok": ok,
        "allreduce_mib": size * 4 / 2**20,
        "allreduce_ms": round(seconds * 1e3, 3),
        "allreduce_algbw_gbps": round(size * 4 / seconds / 1e9, 2),
        "nccl": nccl,
    }
    emit(PROBE_TAG, record)
    dist.barrier(device_ids=[comm.index] if comm.type == "cuda" else None)
    dist.destroy_process_group()
    return 0 if ok else 1


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def example(args: list[str]) -> None:
    """Run the sample elastic job in this process, after saying where it runs."""
    env = pt.TrainEnv.from_environ()
    device = default_device(env)
    emit(EXAMPLE_TAG, identity(env, device))
    if device.type == "cuda":

        def peak() -> None:
            peak_bytes = torch.cuda.max_memory_allocated(device)
            emit(
                MEMORY_TAG,
                {"generation": env.allocation_gen, "rank": env.rank, "bytes": peak_bytes},
            )

        atexit.register(peak)
    sys.argv = [str(EXAMPLE), *args]
    runpy.run_path(str(EXAMPLE), run_name="__main__")  # exits (0, or 143 when stopped)


def idle() -> int:
    """Hold the job's GPU until stopped."""

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(143)

    signal.signal(signal.SIGTERM, stop)
    while True:
        time.sleep(0.2)


def main(argv: list[str]) -> int:
    """Dispatch on the mode."""
    mode = argv[0] if argv else ""
    if mode == "probe":
        return probe()
    if mode == "example":
        example(argv[1:])
        return 0
    if mode == "idle":
        return idle()
    print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
