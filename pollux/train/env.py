"""The environment contract between a NodeLauncher and a training replica (architecture §7).

The launcher starts every replica with its identity (job, allocation generation, rank) and the
rendezvous address in environment variables. `TrainEnv.from_environ` reads and validates them
once, so that a malformed value fails at start with the variable's name rather than deep
inside `torch.distributed`. Every variable has a default, so a script also runs as a plain
single-process program (`python train.py`) or under `torchrun`, which sets the torch subset.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pollux import checks
from pollux.train.errors import EnvVarError

DEFAULT_JOB_ID = "local"
DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = 29500


@dataclass(frozen=True, slots=True)
class TrainEnv:
    """What a replica knows about itself and its job.

    Attributes:
        job_id: ``POLLUX_JOB_ID``; ``"local"`` outside the cluster.
        agent_addr: ``POLLUX_AGENT_ADDR`` (host:port of the job's agent), or None when there is
            no control plane (metrics then stay local).
        checkpoint_dir: ``POLLUX_CHECKPOINT_DIR``, or None to disable checkpointing.
        allocation_gen: ``POLLUX_ALLOCATION_GEN``, the allocation generation this replica was
            started for; increases by one per re-allocation. 0 outside the cluster.
        rank: ``RANK``, this replica's global rank in [0, world_size).
        world_size: ``WORLD_SIZE``, the number of replicas K.
        local_rank: ``LOCAL_RANK``, the replica's index on its node (selects the GPU).
        master_addr: ``MASTER_ADDR``, host of rank 0's rendezvous store.
        master_port: ``MASTER_PORT``, port of rank 0's rendezvous store.
        cuda_visible_devices: ``CUDA_VISIBLE_DEVICES`` split on commas, or None when unset
            (every GPU visible). An empty tuple means no GPU.
        num_nodes: ``POLLUX_NUM_NODES``, the number of distinct nodes N of the allocation, or
            None when unset; the trainer then counts distinct host names across replicas.
        job_credential: ``POLLUX_JOB_CREDENTIAL``, what proves this job to its agent on a
            cluster with TLS (the launcher's; valid for this job only), or None.
        tls_ca: ``POLLUX_TLS_CA``, the CA file the agent's certificate is checked against;
            set with TLS, None on a plaintext cluster.
    """

    job_id: str = DEFAULT_JOB_ID
    agent_addr: str | None = None
    checkpoint_dir: Path | None = None
    allocation_gen: int = 0
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    master_addr: str = DEFAULT_MASTER_ADDR
    master_port: int = DEFAULT_MASTER_PORT
    cuda_visible_devices: tuple[str, ...] | None = None
    num_nodes: int | None = None
    job_credential: str | None = None
    tls_ca: Path | None = None

    def __post_init__(self) -> None:
        _check_identity(self)

    @property
    def distributed(self) -> bool:
        """Whether this replica is one of several (K > 1)."""
        return self.world_size > 1

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> TrainEnv:
        """Read the contract from `environ` (default `os.environ`).

        Raises:
            EnvVarError: A variable is set but malformed (not a number, out of range, rank not
                below world size, ...). The message names the variable.
        """
        env = os.environ if environ is None else environ
        cvd = env.get("CUDA_VISIBLE_DEVICES")
        return cls(
            job_id=_text(env, "POLLUX_JOB_ID") or DEFAULT_JOB_ID,
            agent_addr=_text(env, "POLLUX_AGENT_ADDR"),
            checkpoint_dir=_path(env, "POLLUX_CHECKPOINT_DIR"),
            allocation_gen=_int(env, "POLLUX_ALLOCATION_GEN", 0, minimum=0),
            rank=_int(env, "RANK", 0, minimum=0),
            world_size=_int(env, "WORLD_SIZE", 1, minimum=1),
            local_rank=_int(env, "LOCAL_RANK", 0, minimum=0),
            master_addr=_text(env, "MASTER_ADDR") or DEFAULT_MASTER_ADDR,
            master_port=_int(env, "MASTER_PORT", DEFAULT_MASTER_PORT, minimum=1, maximum=65535),
            cuda_visible_devices=None
            if cvd is None
            else tuple(d.strip() for d in cvd.split(",") if d.strip()),
            num_nodes=_optional_int(env, "POLLUX_NUM_NODES", minimum=1),
            job_credential=_text(env, "POLLUX_JOB_CREDENTIAL"),
            tls_ca=_file(env, "POLLUX_TLS_CA"),
        )


def _check_identity(e: TrainEnv) -> None:
    if e.world_size < 1:
        raise EnvVarError("WORLD_SIZE", str(e.world_size), "must be ≥ 1")
    if not 0 <= e.rank < e.world_size:
        raise EnvVarError(
            "RANK", str(e.rank), f"must be in [0, WORLD_SIZE={e.world_size}); check the launcher"
        )
    if e.local_rank < 0:
        raise EnvVarError("LOCAL_RANK", str(e.local_rank), "must be ≥ 0")
    if not 1 <= e.master_port <= 65535:
        raise EnvVarError("MASTER_PORT", str(e.master_port), "must be a TCP port in [1, 65535]")
    if e.allocation_gen < 0:
        raise EnvVarError("POLLUX_ALLOCATION_GEN", str(e.allocation_gen), "must be ≥ 0")
    if e.num_nodes is not None and not 1 <= e.num_nodes <= e.world_size:
        raise EnvVarError(
            "POLLUX_NUM_NODES",
            str(e.num_nodes),
            f"must be in [1, WORLD_SIZE={e.world_size}]: every node holds at least one replica",
        )
    if not e.job_id or any(c.isspace() for c in e.job_id):
        raise EnvVarError("POLLUX_JOB_ID", e.job_id, "must be non-empty and contain no spaces")


def _text(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    if value is None:
        return None
    value = value.strip()
    return value or None


def _path(env: Mapping[str, str], name: str) -> Path | None:
    value = _text(env, name)
    if value is None:
        return None
    path = Path(value).expanduser()
    if path.exists() and not path.is_dir():
        raise EnvVarError(name, value, "exists and is not a directory")
    return path


def _file(env: Mapping[str, str], name: str) -> Path | None:
    value = _text(env, name)
    if value is None:
        return None
    path = Path(value).expanduser()
    if not path.is_file():
        raise EnvVarError(name, value, "is not a readable file")
    return path


def _int(
    env: Mapping[str, str], name: str, default: int, *, minimum: int, maximum: int | None = None
) -> int:
    value = _optional_int(env, name, minimum=minimum, maximum=maximum)
    return default if value is None else value


def _optional_int(
    env: Mapping[str, str], name: str, *, minimum: int, maximum: int | None = None
) -> int | None:
    raw = _text(env, name)
    if raw is None:
        return None
    try:
        value = int(raw, 10)
    except ValueError:
        raise EnvVarError(name, raw, "must be a whole decimal number") from None
    return checks.whole_number(
        value,
        least=minimum,
        most=maximum,
        error=lambda problem: EnvVarError(name, raw, problem.requirement),
    )
