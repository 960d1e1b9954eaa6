"""What a node offers the scheduler: its GPUs, or CPU "GPU slots" when it has none.

A node with NVIDIA GPUs is found with ``nvidia-smi --query-gpu=index,name`` (the index is what
`CUDA_VISIBLE_DEVICES` takes, the name is the node's `gpu_type`). A node without GPUs — a
laptop, a CI runner, an e2e test — serves an explicit number of CPU slots (``gpus = N``), so the
whole control plane runs unchanged without CUDA. Parsing is a pure function so it is tested on
captured nvidia-smi output rather than on whatever machine runs the tests.
"""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass

CPU_SLOT = "cpu-slot"
"""gpu_type of a node that serves CPU slots instead of GPUs."""

NVIDIA_SMI_ARGS = ("--query-gpu=index,name", "--format=csv,noheader")


class GpuDetectionError(Exception):
    """No usable accelerator inventory: the node cannot register."""


@dataclass(frozen=True, slots=True)
class Inventory:
    """The slots a node offers, one replica each.

    Attributes:
        slots: Device indices (nvidia-smi numbering) or, for CPU slots, 0..N-1.
        gpu_type: GPU model name, or "cpu-slot".
        cuda: Whether the slots are real GPUs (then replicas get CUDA_VISIBLE_DEVICES=<index>).
    """

    slots: tuple[int, ...]
    gpu_type: str
    cuda: bool

    @property
    def count(self) -> int:
        """Number of slots (the node's registered `gpus`)."""
        return len(self.slots)


def cpu_slots(count: int) -> Inventory:
    """An inventory of `count` CPU slots (for nodes without GPUs)."""
    if count < 1:
        raise GpuDetectionError(f"gpus: {count} CPU slots requested; must be >= 1")
    return Inventory(tuple(range(count)), CPU_SLOT, cuda=False)


def parse_nvidia_smi(output: str) -> Inventory:
    """Parse ``nvidia-smi --query-gpu=index,name --format=csv,noheader`` output.

    A node with mixed GPU models registers the most common model's name: the scheduler
    models one `gpu_type` per node, and the common model is what most replicas run on.

    Raises:
        GpuDetectionError: If the output lists no GPUs or a line does not parse.
    """
    indices: list[int] = []
    names: list[str] = []
    for number, raw in enumerate(output.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        index, sep, name = line.partition(",")
        if not sep or not index.strip().isdigit() or not name.strip():
            raise GpuDetectionError(f"nvidia-smi line {number} is not 'index, name': {line!r}")
        indices.append(int(index.strip()))
        names.append(name.strip())
    if not indices:
        raise GpuDetectionError("nvidia-smi lists no GPUs")
    if len(set(indices)) != len(indices):
        raise GpuDetectionError(f"nvidia-smi lists duplicate GPU indices: {indices}")
    gpu_type = Counter(names).most_common(1)[0][0]
    return Inventory(tuple(sorted(indices)), gpu_type, cuda=True)


def detect(gpus: int | None, *, timeout_s: float = 20.0) -> Inventory:
    """The node's inventory: `gpus` CPU slots when given, else the GPUs nvidia-smi lists.

    An explicit count always means CPU slots, so a test or a CPU-only deployment behaves the
    same on a machine that happens to have GPUs.

    Raises:
        GpuDetectionError: Neither a slot count nor working nvidia-smi, with what to do.
    """
    if gpus is not None:
        return cpu_slots(gpus)
    binary = shutil.which("nvidia-smi")
    if binary is None:
        raise GpuDetectionError(
            "gpus: no GPUs detected (nvidia-smi not found); set gpus = N (or --gpus N) to "
            "serve N CPU slots"
        )
    try:
        result = subprocess.run(
            [binary, *NVIDIA_SMI_ARGS],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise GpuDetectionError(f"gpus: nvidia-smi failed: {error}") from error
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip()
        raise GpuDetectionError(f"gpus: nvidia-smi exited {result.returncode}: {detail}")
    try:
        return parse_nvidia_smi(result.stdout)
    except GpuDetectionError as error:
        raise GpuDetectionError(f"gpus: {error}") from error
