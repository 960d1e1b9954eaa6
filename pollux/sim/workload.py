"""Workload files: which jobs arrive when (format in data/pollux-osdi21/README.md)."""

from __future__ import annotations

import csv
import hashlib
import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from pollux.sim.traces import TraceFormatError

HEADER = ["name", "time", "application", "num_replicas", "batch_size"]


@dataclass(frozen=True, slots=True)
class WorkloadJob:
    """One job of a workload.

    Attributes:
        name: Unique job name, e.g. "cifar10-3".
        submission_time: Seconds from the start of the workload.
        application: Name of the application whose traces drive the job.
        num_replicas: Tuned GPU count (used by Tiresias).
        batch_size: Tuned total batch size (used by Optimus and Tiresias).
        tenant: The tenant it belongs to ("" : none; see `assign_tenants`).
        owner: The user who submitted it ("": the published workloads' one user; see
            `assign_owners` and `Flood`).
    """

    name: str
    submission_time: float
    application: str
    num_replicas: int
    batch_size: int
    tenant: str = ""
    owner: str = ""


def load_workload(path: Path | str) -> list[WorkloadJob]:
    """Read a workload CSV; jobs come back in submission order."""
    path = Path(path)
    if not path.is_file():
        raise TraceFormatError(path, "workload file not found")
    jobs = []
    with path.open(newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header != HEADER:
            raise TraceFormatError(path, f"header must be {','.join(HEADER)}, got {header}", 1)
        for line, row in enumerate(reader, start=2):
            if not row:
                continue
            if len(row) != len(HEADER):
                raise TraceFormatError(path, f"expected {len(HEADER)} columns", line)
            name, time, app, replicas, batch = row
            try:
                job = WorkloadJob(name, float(time), app, int(replicas), int(batch))
            except ValueError:
                raise TraceFormatError(
                    path, "time, num_replicas, batch_size must be numbers", line
                ) from None
            if job.submission_time < 0 or job.num_replicas < 1 or job.batch_size < 1:
                raise TraceFormatError(path, "time must be ≥ 0, replicas and batch ≥ 1", line)
            jobs.append(job)
    if not jobs:
        raise TraceFormatError(path, "no jobs")
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        raise TraceFormatError(path, "job names must be unique")
    return sorted(jobs, key=lambda j: (j.submission_time, names.index(j.name)))


def assign_tenants(
    jobs: Sequence[WorkloadJob],
    tenants: Sequence[str],
    how: Literal["hash", "round_robin"] = "hash",
    shares: Sequence[float] | None = None,
) -> list[WorkloadJob]:
    """The jobs, each given to one of `tenants` (the published workloads name none).

    "hash": by CRC-32 of the job name, so a job's tenant depends on its name only (stable
    when jobs are added or removed, unlike Python's salted `hash`); "round_robin": in
    submission order, which balances job counts exactly.

    `shares` (one positive number per tenant, default equal) sets the fraction of the jobs
    each tenant gets, e.g. in proportion to its entitlement, so that a tenant's load matches
    what it is entitled to. Tenants then get their fractions to about one job (within one in
    the benchmark's configurations): "round_robin" gives each job, in submission order, to
    the tenant furthest below its fraction of the jobs so far (smooth weighted round robin);
    "hash" does the same in the order of a uniform hash of the names (`_uniform`), so that a
    job's tenant depends on the set of names only, not on submission order. Without `shares`
    both are as above.
    """
    if not tenants:
        raise ValueError("need at least one tenant name")
    if how not in ("hash", "round_robin"):
        raise ValueError(f"unknown assignment {how!r}; choose 'hash' or 'round_robin'")
    if shares is None:
        if how == "hash":
            pick = [zlib.crc32(job.name.encode()) % len(tenants) for job in jobs]
        else:
            pick = [i % len(tenants) for i in range(len(jobs))]
    else:
        pick = _weighted_picks(jobs, len(tenants), how, shares)
    return [replace(job, tenant=tenants[t]) for job, t in zip(jobs, pick, strict=True)]


def assign_owners(
    jobs: Sequence[WorkloadJob], count: int, how: Literal["hash", "round_robin"] = "round_robin"
) -> list[WorkloadJob]:
    """The jobs, each owned by one of `count` users "user-0" … (the published workloads name none).

    "round_robin": in submission order, so the users' job counts differ by at most one;
    "hash": by CRC-32 of the job name, as `assign_tenants` does.
    """
    if count < 1:
        raise ValueError(f"need at least one owner, got {count}")
    if how not in ("hash", "round_robin"):
        raise ValueError(f"unknown assignment {how!r}; choose 'hash' or 'round_robin'")
    return [
        replace(job, owner=f"user-{_pick(job.name, i, count, how)}") for i, job in enumerate(jobs)
    ]


def _pick(name: str, position: int, count: int, how: str) -> int:
    return zlib.crc32(name.encode()) % count if how == "hash" else position % count


@dataclass(frozen=True, slots=True)
class Flood:
    """A user who submits a backlog at once: `jobs` jobs at `at` seconds, as `owner`.

    The jobs copy the workload's own, in submission order (cycled when `jobs` is larger),
    named "<owner>-0", "<owner>-1", …: the same job mix, all queued at one moment.
    """

    jobs: int
    at: float = 0.0
    owner: str = "flood"

    def __post_init__(self) -> None:
        if self.jobs < 1 or not (math.isfinite(self.at) and self.at >= 0):
            raise ValueError(f"a flood needs ≥ 1 job at a time ≥ 0, got {self.jobs} at {self.at}")
        if not self.owner:
            raise ValueError("a flood needs a non-empty owner")

    @classmethod
    def parse(cls, text: str) -> Flood:
        """A flood from "COUNT[@SECONDS]", e.g. "100@3600".

        Raises:
            ValueError: `text` is not of that form or out of range.
        """
        count, _, at = text.partition("@")
        try:
            return cls(int(count), float(at or 0.0))
        except ValueError as err:
            raise ValueError(f"flood {text!r}: expected COUNT[@SECONDS] ({err})") from None

    def added_to(self, jobs: Sequence[WorkloadJob]) -> list[WorkloadJob]:
        """`jobs` with the flood's jobs, in submission order (the flood after jobs of its time)."""
        if not jobs:
            raise ValueError("a flood copies the workload's jobs: the workload has none")
        names = {job.name for job in jobs}
        flood = [
            replace(
                jobs[i % len(jobs)],
                name=f"{self.owner}-{i}",
                submission_time=self.at,
                owner=self.owner,
            )
            for i in range(self.jobs)
        ]
        clash = sorted(names & {job.name for job in flood})
        if clash:
            raise ValueError(
                f"the workload already has jobs named {clash[:3]}: choose another owner"
            )
        return sorted([*jobs, *flood], key=lambda job: job.submission_time)


def _weighted_picks(
    jobs: Sequence[WorkloadJob], count: int, how: str, shares: Sequence[float]
) -> list[int]:
    """Each job's tenant index when tenants get `shares` of the jobs (see `assign_tenants`)."""
    if len(shares) != count:
        raise ValueError(f"need one share per tenant: {len(shares)} shares for {count} tenants")
    if not all(math.isfinite(x) and x > 0 for x in shares):
        raise ValueError(f"shares must be positive numbers, got {list(shares)}")
    total = sum(shares)
    fractions = [x / total for x in shares]
    order = list(range(len(jobs)))
    if how == "hash":
        order.sort(key=lambda i: (_uniform(jobs[i].name), jobs[i].name))
    given = [0] * count
    pick = [0] * len(jobs)
    for n, i in enumerate(order, start=1):
        t = max(range(count), key=lambda u: (fractions[u] * n - given[u], -u))
        given[t] += 1
        pick[i] = t
    return pick


def _uniform(name: str) -> float:
    """A number in [0, 1) that depends on `name` only, uniform over names.

    BLAKE2b and not CRC-32: CRC-32 is linear, so names that differ in a few characters
    ("cifar10-3", "cifar10-13") get values whose high bits are far from uniform.
    """
    digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64
