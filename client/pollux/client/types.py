"""Public types of the Pollux client: frozen dataclasses over the private ``pollux.v1`` protos.

Callers build a `JobSpec` and get back `Job`, `Explanation` and `ClusterStatus` values; they
never see protobuf messages (Temporal's layering). Enumerations are plain strings
("PENDING", "adascale") so that values print, compare and serialise without ceremony. Times are
timezone-aware UTC `datetime` objects, or None where the server did not set them.

Job files (YAML, JSON or TOML) are flat mappings whose keys are the `JobSpec` field names
(docs/job-file.md); `JobSpec.from_mapping` reads every key and checks the values by the
job-spec contract the scheduler applies (`pollux.jobspec`), so a spec the server would refuse
is refused before it is sent, every problem at once, each naming its key in the server's words.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import shlex
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import yaml

from pollux import checks, jobspec
from pollux.checks import described
from pollux.client.errors import JobSpecError
from pollux.jobspec import Kind, Mount, wire
from pollux.terminal import quoted

ScalingRule = Literal["adascale", "linear", "sqrt", "none"]
"""How the training library scales the learning rate with the batch size."""

SCALING_RULES: tuple[str, ...] = jobspec.SCALING_RULES
"""The values of `ScalingRule` (a test holds the two together)."""

JOB_STATES: tuple[str, ...] = (
    "PENDING",
    "ALLOCATED",
    "RUNNING",
    "RESCALING",
    "SUCCEEDED",
    "FAILED",
    "CANCELLED",
)
"""Every job state, in lifecycle order (docs/architecture.md §8)."""

TERMINAL_STATES: frozenset[str] = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
"""States a job never leaves."""


@dataclass(frozen=True)
class JobSpec:
    """What a user submits; immutable once accepted.

    Zero in a numeric field means "the server's default", as in the API: `max_batch_size` 0 is
    `initial_batch_size` (a fixed-batch job), `max_failures` 0 is 3, `stop_grace_s` 0 is the
    launcher's 30 s. The server validates the spec completely and names every bad field.
    """

    name: str
    """1-63 characters of [a-z0-9-], starting with a letter. Not unique."""
    command: tuple[str, ...]
    """The replica's argv, run without a shell."""
    initial_batch_size: int
    """Total batch size M0 the learning rate was tuned for; >= 1."""
    _: KW_ONLY
    env: Mapping[str, str] = field(default_factory=dict, hash=False)
    """Extra environment of every replica; POLLUX_* names are reserved."""
    working_dir: str = ""
    """Working directory of every replica; empty means the launcher's default."""
    max_batch_size: int = 0
    """Largest total batch the agent may choose; 0 means `initial_batch_size`."""
    min_local_batch_size: int = 0
    """Smallest per-GPU batch per step; 0 means 1."""
    max_local_batch_size: int = 0
    """Largest per-GPU batch per step (GPU memory bound); 0 means `max_batch_size`."""
    scaling_rule: ScalingRule = "adascale"
    """Learning-rate scaling rule the job's training loop uses."""
    max_replicas: int = 0
    """Most GPUs the job may hold; 0 means no limit beyond the cluster."""
    max_failures: int = 0
    """Failed replica exits tolerated before the job fails; 0 means 3."""
    stop_grace_s: int = 0
    """Seconds between SIGTERM and SIGKILL when replicas stop; 0 means 30."""
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    """Free-form labels, shown by the CLI and usable as list filters."""
    secret_env: Mapping[str, str] = field(default_factory=dict, hash=False, repr=False)
    """Environment whose values are secret: given to every replica, never shown by the API
    (a job read back shows "<secret>")."""
    image: str = ""
    """OCI image every replica runs in (``[registry/]name[:tag][@sha256:digest]``); empty runs
    `command` as a plain process. The node's launcher must have a container runtime."""
    shm_size_mb: int = 0
    """Size of the container's /dev/shm in MiB; 0 means the runtime's default (64)."""
    mounts: tuple[Mount, ...] = ()
    """Extra host directories mounted into the container (each allowed by the launcher)."""

    def __post_init__(self) -> None:
        # Accept any sequence and mapping, but store our own immutable-by-convention copies so
        # that a caller mutating its list or dict cannot change a spec after the fact.
        object.__setattr__(self, "command", tuple(self.command))
        object.__setattr__(self, "env", dict(self.env))
        object.__setattr__(self, "labels", dict(self.labels))
        object.__setattr__(self, "secret_env", dict(self.secret_env))
        object.__setattr__(self, "mounts", tuple(self.mounts))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> JobSpec:
        """Build a spec from a job file's mapping, checking every key.

        `command` may be a list of strings or one string (split like a POSIX shell would, but
        still run without one). `env` values may be strings or numbers; booleans are refused
        because YAML's ``true`` would silently become ``"True"``. Each `mounts` entry is
        ``"SRC:DST[:ro]"`` or a mapping with ``host_path``, ``container_path`` and optionally
        ``read_only``.

        Raises:
            JobSpecError: Listing every unknown, missing or ill-typed key and every value the
                server would refuse (the same rules), each by its key path, all at once.
        """
        return _spec_from_mapping(data)

    @classmethod
    def from_file(cls, path: str | Path) -> JobSpec:
        """Read a YAML (.yaml/.yml), JSON (.json) or TOML (.toml) job file.

        Raises:
            JobSpecError: The file cannot be read or parsed, or its content is not a valid spec.
        """
        return cls.from_mapping(read_job_file(path))


@dataclass(frozen=True)
class Transition:
    """One entry of a job's history: the state it entered, when, and why."""

    state: str
    time: datetime | None
    reason: str


@dataclass(frozen=True)
class Allocation:
    """The GPUs a job holds: replica ``i`` runs on ``nodes[i]``, one GPU each."""

    nodes: tuple[str, ...]
    """Node of each replica, by rank."""
    generation: int
    """Increases on every change of `nodes`; replicas and checkpoints carry it."""
    time: datetime | None
    """When the scheduler committed it."""
    round: int
    """Scheduling round that chose it."""

    @property
    def gpus(self) -> int:
        """Number of GPUs (= replicas)."""
        return len(self.nodes)

    @property
    def node_count(self) -> int:
        """Number of distinct nodes."""
        return len(set(self.nodes))


@dataclass(frozen=True)
class Job:
    """A submitted job and its current status."""

    id: str
    spec: JobSpec
    request_id: str
    """Idempotency key the job was submitted with."""
    state: str
    """One of `JOB_STATES` (or ``"UNSPECIFIED"``/``"STATE_<n>"`` from a newer server)."""
    history: tuple[Transition, ...]
    """Every transition, oldest first."""
    create_time: datetime | None
    finish_time: datetime | None
    """Set when the job entered a terminal state."""
    cancel_requested: bool
    restarts: int
    """Planned restarts (re-allocations) so far."""
    failures: int
    """Failed replica exits so far."""
    allocation: Allocation | None
    """Current GPUs, or None when the job holds none."""
    attained_gpu_seconds: float = 0.0
    """GPU-seconds held up to `allocation.time` (what Tiresias prioritises by)."""
    owner: str = ""
    """Who submitted it ("local" on a cluster without authentication)."""
    tenant: str = ""
    """The owner's tenant at submission ("" is the default tenant)."""
    estimated_completion: datetime | None = None
    """Predicted completion (declared remaining work ÷ predicted goodput on its current GPUs),
    as of the read; None when unknown (no GPUs, no declared size or no model yet)."""

    @property
    def gpus(self) -> int:
        """GPUs the job holds now."""
        return self.allocation.gpus if self.allocation else 0

    @property
    def is_terminal(self) -> bool:
        """Whether the job has finished (succeeded, failed or been cancelled)."""
        return self.state in TERMINAL_STATES


@dataclass(frozen=True)
class JobDecision:
    """A job's part of one scheduling round."""

    job_id: str
    nodes: tuple[str, ...]
    """Node of each replica chosen in the round (empty: no GPUs)."""
    speedup: float
    """Predicted speedup of the chosen allocation (1 = the normalising allocation)."""
    restart_penalty: float
    """Restart penalty factor applied (1 = none)."""
    reason: str
    changed: bool
    """Whether the round changed the job's allocation."""
    move_factor: float | None = None
    """The restart factor any re-allocation was charged that round, moved or not: a new
    allocation's speedup counted times it (1 = free); None when the server does not say."""
    speedup_one_more: float | None = None
    """Predicted speedup with one GPU more, as the round valued it; None: past the limit."""
    gpu_limit: int = 0
    """Most GPUs the round could give the job (0: not said)."""
    reference_gpus: int = 0
    """GPUs of the allocation speedup 1.0 stands for (its fair share; 0: not said)."""
    reference_nodes: int = 0
    """Nodes of that reference allocation."""
    model_time: datetime | None = None
    """When the model the round valued the job with was published; None: no model yet
    (linear scaling assumed)."""


@dataclass(frozen=True)
class RoundInfo:
    """Which scheduling round a decision came from."""

    round: int
    time: datetime | None
    policy: str
    objective: float
    snapshot_revision: int
    """etcd revision of the snapshot the round used."""
    scheduler_id: str
    """Scheduler replica that ran it."""
    placement: bool = False
    """True: an event's placement round, which planned only jobs that never ran, on free GPUs;
    False: a full round, which re-planned every job."""
    idle_gpus: int = 0
    """GPUs no job held once the round's decision was applied."""


@dataclass(frozen=True)
class BatchConfig:
    """Batch configuration a job trains with on an allocation."""

    local_batch_size: int
    """Per-GPU batch per micro-step."""
    accum_steps: int
    """Micro-steps per optimizer step."""
    total_batch_size: int
    predicted_speedup: float
    """Predicted goodput relative to one GPU at the initial batch (0 until modelled)."""


@dataclass(frozen=True)
class ThroughputParams:
    """The seven fitted throughput-model parameters (seconds; `gamma` dimensionless)."""

    alpha_c: float
    beta_c: float
    alpha_n: float
    beta_n: float
    alpha_r: float
    beta_r: float
    gamma: float
    sync_model: str
    """``"ring"`` or ``"linear"``."""


@dataclass(frozen=True)
class ModelSummary:
    """A job's fitted goodput model as its agent last published it."""

    agent_id: str
    observations: int
    """Number of observations the fit used."""
    max_profiled_replicas: int
    throughput: ThroughputParams | None
    """None until the first fit."""
    grad_sqr: float
    """Smoothed squared gradient norm."""
    grad_var: float
    """Smoothed trace of the per-sample gradient covariance."""
    initial_batch_size: int
    max_batch_size: int
    min_local_batch_size: int
    max_local_batch_size: int
    update_time: datetime | None
    progress: float | None = None
    """Training progress, M0-steps (optimizer steps of the initial batch); None: not reported."""
    remaining_work: float | None = None
    """Declared work left, M0-steps; None when the job declares no size."""
    rescale_pause_s: float | None = None
    """Seconds from SIGTERM to the first step of its latest rescale; None before one."""
    seeded_from: str = ""
    """The earlier run whose step times and fit the model started from; "" when none."""


@dataclass(frozen=True)
class JobEstimate:
    """When a job would complete if submitted now (`Client.estimate`)."""

    predicted_jct_s: float
    """Seconds from now to the predicted completion."""
    predicted_completion: datetime | None
    reference_job_id: str
    """The earlier run whose measured goodput model and size the estimate borrowed."""
    work: float
    """The size assumed, M0-steps (the reference's progress + declared remaining work)."""
    rounds: int
    """Rounds the forecast played."""


@dataclass(frozen=True)
class Explanation:
    """Why a job has what it has: its last decision, that round, its model and batch."""

    job: Job
    decision: JobDecision | None
    """None before the job's first round."""
    round: RoundInfo | None
    model: ModelSummary | None
    """None until the job's agent publishes a model."""
    batch: BatchConfig | None
    """What the agent would give the current allocation; None if unmodelled."""
    last_change: Transition | None = None
    """The transition that last changed its GPUs; None while it never held any."""
    alternatives: tuple[Alternative, ...] = ()
    """Its speedup and goodput at one GPU fewer, its count and one more (active jobs)."""
    holders: tuple[Holder, ...] = ()
    """The jobs whose last GPU is worth least to them, cheapest first."""
    batch_choice: BatchChoice | None = None
    """The model's batch choice on the current allocation; None without model or GPUs."""
    queue_position: int = 0
    """1-based place among pending jobs by submission time; 0 when not pending."""
    pending_jobs: int = 0
    """Pending jobs in the cluster."""
    objective: str = ""
    """What the scheduler's policy maximises, in words; "" if the server does not say."""
    allocation_decision: JobDecision | None = None
    """The job's part of the round that chose its current allocation, when that is not
    `decision` itself (what the policy predicted then); None when not among the records."""
    allocation_round: RoundInfo | None = None
    """That round."""


@dataclass(frozen=True)
class Alternative:
    """A GPU count for a job and what the policy predicts of it."""

    gpus: int
    nodes: int
    """Nodes they span (the fewest that hold them)."""
    speedup: float
    """Goodput relative to the job's fair share of the cluster (dimensionless)."""
    goodput: float
    """M0-equivalent training samples per second (0 without a model)."""


@dataclass(frozen=True)
class Holder:
    """A job holding GPUs and what its last GPU is worth to it."""

    job_id: str
    gpus: int
    speedup: float
    speedup_without_one: float
    name: str = ""
    """Its name when the caller may see the job; "" for another user's job."""

    @property
    def last_gpu_worth(self) -> float:
        """Speedup the job would lose by giving one GPU up."""
        return self.speedup - self.speedup_without_one


@dataclass(frozen=True)
class BatchChoice:
    """The batch size a job's model chooses on its allocation, and why (units in names)."""

    batch_size: int
    local_batch_size: int
    accum_steps: int
    throughput: float
    """Training samples per second."""
    efficiency: float
    """Statistical efficiency relative to the initial batch size (1 = as efficient)."""
    goodput: float
    """throughput × efficiency, M0-equivalent samples per second."""


@dataclass(frozen=True)
class NodeStatus:
    """A registered GPU node and the jobs placed on it."""

    name: str
    address: str
    """host:port of the node's launcher."""
    gpus: int
    gpu_type: str
    labels: Mapping[str, str] = field(hash=False)
    register_time: datetime | None
    allocated_gpus: int
    jobs: tuple[str, ...]
    """Job id per allocated GPU."""

    @property
    def free_gpus(self) -> int:
        """GPUs not allocated to any job."""
        return max(self.gpus - self.allocated_gpus, 0)


@dataclass(frozen=True)
class Member:
    """A live service process: a scheduler replica or an agent."""

    id: str
    address: str


@dataclass(frozen=True)
class ClusterStatus:
    """The cluster as one scheduler replica sees it."""

    nodes: tuple[NodeStatus, ...]
    agents: tuple[Member, ...]
    leader_id: str
    """Empty when no replica leads."""
    leader_address: str
    total_gpus: int
    allocated_gpus: int
    jobs_by_state: Mapping[str, int] = field(hash=False)
    last_round: int
    answered_by: str
    """Scheduler replica that answered."""
    warnings: tuple[str, ...] = ()
    """What is wrong with the cluster's state store now (etcd out of space), one line each."""
    dashboard_url: str = ""
    """The answering replica's web dashboard; empty when it serves none."""

    @property
    def free_gpus(self) -> int:
        """GPUs not allocated to any job."""
        return max(self.total_gpus - self.allocated_gpus, 0)


# ---- job files -------------------------------------------------------------------------------

SPEC_KEYS: tuple[str, ...] = jobspec.KEYS
"""Keys a job file may contain (the `JobSpec` field names; a test holds the two together)."""

_RENAMED = {
    "batch_size": "initial_batch_size",
    "workdir": "working_dir",
    "stop_grace": "stop_grace_s",
    "shm_size": "shm_size_mb",
    "label": "labels",
    "mount": "mounts",
}
"""Names a user may reach for (former flags, singulars) and the key meant."""

Problems = list[tuple[str, str]]
"""(key path, what to fix) pairs, in the order found."""


def read_job_file(path: str | Path) -> dict[str, Any]:
    """Parse a job file into a mapping, choosing the format by suffix (YAML by default).

    A relative ``working_dir`` is taken relative to the file's directory (as compose files do),
    so a job file that sits beside its script works from wherever it is submitted.

    Raises:
        JobSpecError: The file is unreadable, malformed, or not a mapping at the top.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as error:
        raise JobSpecError(f"cannot read job file {p}: {error.strerror or error}") from error
    suffix = p.suffix.lower()
    try:
        if suffix == ".json":
            data: Any = json.loads(text)
        elif suffix == ".toml":
            data = tomllib.loads(text)
        else:
            data = yaml.safe_load(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError, yaml.YAMLError) as error:
        raise JobSpecError(f"cannot parse job file {p}: {error}") from error
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise JobSpecError(
            f"job file {p} must hold a mapping of spec keys (got {type(data).__name__})"
        )
    working_dir = data.get("working_dir")
    if isinstance(working_dir, str) and working_dir and not Path(working_dir).is_absolute():
        data["working_dir"] = os.path.normpath(p.resolve().parent / working_dir)
    return data


def _spec_from_mapping(data: Mapping[str, Any]) -> JobSpec:
    """Read each key by its kind, then check what was read by the contract."""
    if not isinstance(data, Mapping):
        raise JobSpecError("a job spec must be a mapping", [("", f"got {described(data)}")])
    problems: Problems = []
    for key in data:
        if not isinstance(key, str) or key not in SPEC_KEYS:
            problems.append((str(key), _unknown_key(key, data[key])))
    problems.extend(
        (key, "required key is missing") for key in jobspec.REQUIRED if data.get(key) is None
    )
    read: dict[str, Any] = {}
    for spec_field in jobspec.FIELDS:
        if (value := data.get(spec_field.key)) is not None:
            read[spec_field.key] = _READERS[spec_field.kind](spec_field, value, problems)
    readable = _readable(read, problems)
    # A key left out has its default; one given but unreadable is left out, so that no rule
    # across keys guesses its value (an image given as a list is not "no image").
    unreadable = set(read) - set(readable)
    values = {**{k: v for k, v in _DEFAULTS.items() if k not in unreadable}, **readable}
    problems.extend((found.file_path, found.problem) for found in jobspec.check(values))
    if not problems and (too_large := wire.size_problem(values)):
        problems.append(("spec", too_large))
    if problems:
        keys = ", ".join(dict.fromkeys(k or "(spec)" for k, _ in problems))
        raise JobSpecError(f"invalid job spec ({keys})", problems)
    return JobSpec(**read)


_DEFAULTS: Mapping[str, Any] = {
    f.name: f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
    for f in dataclasses.fields(JobSpec)
    if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
}
"""The value of each key a job file may leave out."""


def _readable(read: Mapping[str, Any], problems: Problems) -> dict[str, Any]:
    """The keys read without a type problem: these the contract checks.

    A mapping keeps its readable entries, so only a mapping that is not one is left out; any
    other key with a problem anywhere (``mounts[2]``, ``command``) is left out whole.
    """
    bad = {path for path, _ in problems}
    return {
        key: value
        for key, value in read.items()
        if key not in bad
        and (
            jobspec.BY_KEY[key].kind is Kind.NAMES
            or not any(path.startswith((f"{key}[", f"{key}.")) for path in bad)
        )
    }


def _string(spec_field: jobspec.Field, value: Any, problems: Problems) -> str:
    try:
        return checks.text(value)
    except checks.Problem as problem:
        problems.append((spec_field.key, str(problem)))
        return ""


def _choice(spec_field: jobspec.Field, value: Any, problems: Problems) -> str:
    """A choice, case-insensitively (empty is the default)."""
    if isinstance(value, str):
        return value.lower() or str(_DEFAULTS[spec_field.key])
    choices = ", ".join(spec_field.choices)
    problems.append((spec_field.key, f"must be one of {choices}, got {described(value)}"))
    return ""


def _command(spec_field: jobspec.Field, value: Any, problems: Problems) -> tuple[str, ...]:
    """An argv: a list of strings, or one string split like a POSIX shell would."""
    if isinstance(value, str):
        try:
            return tuple(shlex.split(value))
        except ValueError as error:
            problems.append((spec_field.key, f"cannot split {quoted(value)}: {error}"))
    elif isinstance(value, list | tuple) and all(isinstance(a, str) for a in value):
        return tuple(value)
    else:
        problems.append(
            (
                spec_field.key,
                f"must be a list of strings (argv) or one command string, got {described(value)}",
            )
        )
    return ()


def _count(spec_field: jobspec.Field, value: Any, problems: Problems) -> int:
    """A whole number (its range is the contract's); `max_replicas: yes` is a mistake, not 1."""
    try:
        return checks.whole_number(value)
    except checks.Problem as problem:
        problems.append((spec_field.key, str(problem)))
        return 0


def _string_map(spec_field: jobspec.Field, value: Any, problems: Problems) -> dict[str, str]:
    key = spec_field.key
    if not isinstance(value, Mapping):
        problems.append((key, f"must be a mapping of names to strings, got {described(value)}"))
        return {}
    out: dict[str, str] = {}
    for name, item in value.items():
        path = jobspec.Violation(key, "", entry=str(name)).file_path
        if not isinstance(name, str):
            problems.append((path, "names must be strings"))
        elif isinstance(item, bool) or not isinstance(item, str | int | float):
            problems.append((path, f"must be a string, got {described(item)} (quote the value)"))
        else:
            out[name] = str(item)
    return out


def _mounts(spec_field: jobspec.Field, value: Any, problems: Problems) -> tuple[Mount, ...]:
    """Mounts: each ``SRC:DST[:ro]``, or a mapping of host_path, container_path, read_only."""
    key = spec_field.key
    if not isinstance(value, list | tuple):
        problems.append((key, f"must be a list of SRC:DST[:ro] entries, got {described(value)}"))
        return ()
    out: list[Mount] = []
    for i, item in enumerate(value):
        path = f"{key}[{i}]"
        if isinstance(item, Mount):
            out.append(item)
        elif isinstance(item, str):
            try:
                out.append(Mount.parse(item))
            except ValueError as error:
                problems.append((path, str(error)))
        elif isinstance(item, Mapping):
            unknown = sorted(set(map(str, item)) - {"host_path", "container_path", "read_only"})
            src, dst, ro = item.get("host_path"), item.get("container_path"), item.get("read_only")
            if unknown:
                problems.append((path, f"unknown keys {', '.join(unknown)}"))
            elif not isinstance(src, str) or not isinstance(dst, str):
                problems.append((path, "host_path and container_path must both be strings"))
            elif ro is not None and not isinstance(ro, bool):
                problems.append((path, f"read_only must be true or false, got {described(ro)}"))
            else:
                out.append(Mount(src, dst, read_only=bool(ro)))
        else:
            problems.append((path, f"must be SRC:DST[:ro] or a mapping, got {described(item)}"))
    return tuple(out)


_READERS: Mapping[Kind, Callable[[jobspec.Field, Any, Problems], Any]] = {
    Kind.TEXT: _string,
    Kind.ARGV: _command,
    Kind.COUNT: _count,
    Kind.CHOICE: _choice,
    Kind.NAMES: _string_map,
    Kind.MOUNTS: _mounts,
}
"""How a job file writes each kind of value: the types YAML, JSON and TOML give."""


def _unknown_key(key: object, value: Any) -> str:
    """What to say about a key a job file may not have: the key meant, if one is close."""
    text = str(key)
    normal = text.lower().replace("-", "_")
    if text == "batch" and isinstance(value, Mapping):
        return (
            "unknown key: write the batch limits at the top level "
            f"({', '.join(jobspec.BATCH_KEYS)})"
        )
    close = [normal] if normal in SPEC_KEYS else []
    close = close or ([_RENAMED[normal]] if normal in _RENAMED else [])
    close = close or difflib.get_close_matches(normal, SPEC_KEYS, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown key{hint}; known keys: {', '.join(SPEC_KEYS)}"
