"""Each job's user and directories on this node: claimed, made private, swept after retention.

A root launcher runs each job's replicas under the job's own uid (claimed in etcd,
job_users.py) with a private HOME and TMPDIR; the job's checkpoint, log and scratch
directories are that uid's, mode 0700, and are removed by the sweep once the job is over and
``file_retention_s`` has passed (job_files.py), which also releases the uid. The sweep checks
the roots' free space too: a full one is said in one ``disk_full`` line and the
``pollux_launcher_root_full`` gauge until space returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import prometheus_client
import structlog

from pollux.launcher import job_files, job_users
from pollux.launcher.config import LauncherConfig
from pollux.launcher.job_policy import RunAs
from pollux.service.store import Store, StoreError
from pollux.v1 import types_pb2 as pb

ROOT_FULL = prometheus_client.Gauge(
    "pollux_launcher_root_full",
    "1 while a root of the launcher (checkpoint, log, scratch) has no space left for jobs.",
    ["root"],
)
FILES_REMOVED = prometheus_client.Counter(
    "pollux_launcher_job_dirs_removed_total",
    "Job directories removed after their retention (or reclaimed from a released uid).",
)
FULL_BYTES = 1024 * 1024
"""A root with less than this available to jobs counts as full."""
GENERATION_FILE = ".pollux-generation"
"""The checkpoint directory's fence file (docs/architecture.md §7): the newest generation
started on it. pollux.train refuses to write a checkpoint for an older generation."""
_TERMINAL = frozenset({pb.JOB_STATE_SUCCEEDED, pb.JOB_STATE_FAILED, pb.JOB_STATE_CANCELLED})


def fence_checkpoint_dir(directory: Path, generation: int) -> None:
    """Record `generation` as the owner of `directory`, unless a newer one already is.

    Written before the generation's replicas start (atomically: temporary name, rename), so a
    replica of an older generation that is still running somewhere can no longer overwrite
    the checkpoint the new generation resumes from.

    The directory belongs to the replica user (job_policy), who may have planted a link or a
    FIFO under either name: no name is followed, read past 64 bytes, or opened blocking.
    """
    path = directory / GENERATION_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            regular = stat.S_ISREG(os.fstat(fd).st_mode)
            current = int(os.read(fd, 64).strip()) if regular else -1
        finally:
            os.close(fd)
    except (OSError, ValueError):
        current = -1
    if current >= generation:
        return
    tmp = directory / f"{GENERATION_FILE}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as out:
        out.write(f"{generation}\n")
    os.replace(tmp, path)


@dataclass(frozen=True, slots=True)
class JobDirs:
    """A job's directories on this node (job_files.py)."""

    checkpoint: Path
    home: Path
    tmp: Path
    ca: Path | None


class Workspaces:
    """The users and directories of the jobs this node runs or ran.

    Args:
        config: The launcher configuration (roots, job policy, retention).
        store: The cluster state (uid claims, job records for retention).
        uid: The launcher's effective uid.
        live: Whether a job still runs or is allocated here (its files must stay).
    """

    def __init__(
        self, config: LauncherConfig, store: Store, *, uid: int, live: Callable[[str], bool]
    ) -> None:
        self.config = config
        self.store = store
        self._live = live
        self._uid = uid
        policy = config.job_policy
        self.per_job_uids = policy.per_job_uids(uid)
        """Whether each job's replicas run under the job's own uid (job_users.py)."""
        self.run_as = None if self.per_job_uids else policy.run_as(uid)
        """Whom every replica runs as when jobs share a user (``--insecure``); None when each
        job has its own (`job_user`) or replicas run as the launcher's user."""
        self._users: dict[str, RunAs] = {}
        """Each job's claimed user, once read or claimed."""
        self._reclaimed: set[str] = set()
        """Jobs whose uid's leftovers of other jobs were removed on this node."""
        self._full_roots: set[str] = set()
        self._log = structlog.get_logger(__name__).bind(node_id=config.node_name)

    def warn_about_replica_user(self) -> None:
        """Say at every start whom replicas run as; loudly when jobs are not isolated."""
        policy = self.config.job_policy
        problem = policy.isolation_problem(self._uid)
        if problem:
            self._log.warning(
                "replicas_not_isolated",
                reason=f"started with --insecure: {problem}",
                uid=self._uid if self.run_as is None else self.run_as.uid,
            )
            return
        low, high = policy.job_uids[0], policy.job_uids[1]
        self._log.info("replicas_run_as_job_uids", low=low, high=high)
        taken = sorted(e.pw_name for e in pwd.getpwall() if low <= e.pw_uid <= high)
        if taken:
            self._log.warning(
                "job_uids_overlap_accounts",
                accounts=taken[:10],
                reason="these accounts' uids are in job_policy.job_uids: a job given one of "
                "them could read that account's files; move the range",
            )

    def roots(self) -> dict[str, Path]:
        """The launcher's roots by setting name."""
        config = self.config
        return {
            "checkpoint_root": config.checkpoint_root,
            "log_root": config.log_root,
            "scratch_root": config.scratch_root,
        }

    def make_roots(self) -> None:
        """Create the roots with their modes (job_files.ROOT_MODES)."""
        for name, path in self.roots().items():
            job_files.make_root(path, job_files.ROOT_MODES[name])

    async def job_user(self, job_id: str) -> RunAs | None:
        """Whom the job's replicas run as: its own uid (claimed in etcd), or the shared user.

        Raises:
            job_users.NoFreeUid: Every uid of the range is claimed.
            ValueError: The job's uid, claimed by another launcher, is outside this one's range.
            StoreError: etcd failed (the launch is retried on the next pass).
        """
        if not self.per_job_uids:
            return self.run_as
        known = self._users.get(job_id)
        if known is None:
            low, high = self.config.job_policy.job_uids[0], self.config.job_policy.job_uids[1]
            uid = await job_users.claim(self.store, job_id, (low, high))
            if not low <= uid <= high:
                raise ValueError(
                    f"job {job_id} runs as uid {uid}, claimed by a launcher with another "
                    f"job_policy.job_uids than this one's [{low}, {high}]: give every launcher "
                    "the same range"
                )
            known = RunAs(uid, uid)
            self._users[job_id] = known
        return known

    def prepare_dirs(
        self, job_id: str, generation: int, owner: RunAs | None, ca_pem: bytes, *, scratch: bool
    ) -> JobDirs:
        """Make the job's checkpoint and (`scratch`) scratch directories, private to `owner`.

        The checkpoint directory is fenced for `generation` too. Before a uid's first use on
        this node, what other jobs left under it is removed.

        Raises:
            OSError: A directory could not be made (a full disk: the replica fails saying so).
        """
        config = self.config
        if self.per_job_uids and owner is not None and job_id not in self._reclaimed:
            roots = (config.checkpoint_root, config.log_root, config.scratch_root)
            removed = job_files.reclaim(roots, owner.uid, job_id)
            if removed:
                FILES_REMOVED.inc(len(removed))
                self._log.warning(
                    "job_uid_leftovers_removed",
                    job_id=job_id,
                    uid=owner.uid,
                    removed=[str(path) for path in removed],
                )
            self._reclaimed.add(job_id)
        checkpoint = config.checkpoint_root / job_id
        job_files.make_private_dir(checkpoint, owner)
        fence_checkpoint_dir(checkpoint, generation)
        place = config.scratch_root / job_id
        if not scratch:  # a container: its HOME and TMPDIR are the image's
            return JobDirs(checkpoint=checkpoint, home=place, tmp=place, ca=None)
        job_files.make_private_dir(place, owner)
        home = job_files.make_private_subdir(place, "home", owner)
        tmp = job_files.make_private_subdir(place, "tmp", owner)
        ca = job_files.write_file(place, "ca.pem", ca_pem) if ca_pem else None
        return JobDirs(checkpoint=checkpoint, home=home, tmp=tmp, ca=ca)

    async def run(self) -> None:
        """Check the roots' free space every resync; sweep finished jobs' files every sweep_s."""
        next_sweep = 0.0
        while True:
            try:
                await asyncio.to_thread(self.check_space)
                if time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + self.config.sweep_s
                    await self.sweep()
            except StoreError as error:
                self._log.warning("sweep_failed", error=str(error))
            except Exception:
                self._log.exception("sweep_crashed")
            await asyncio.sleep(self.config.resync_s)

    def check_space(self) -> set[str]:
        """Say in one line when a root fills up (and when it has room again); the full ones."""
        for name, path in self.roots().items():
            try:
                info = os.statvfs(path)
            except OSError:
                continue
            full = info.f_bavail * info.f_frsize < FULL_BYTES
            if full == (name in self._full_roots):
                continue
            ROOT_FULL.labels(name).set(1 if full else 0)
            if full:
                self._full_roots.add(name)
                self._log.error(
                    "disk_full",
                    root=name,
                    path=str(path),
                    available_bytes=info.f_bavail * info.f_frsize,
                    action="replicas that fail writing there fail their job; replica logs are "
                    "kept in memory only; free space and it heals by itself",
                )
            else:
                self._full_roots.discard(name)
                self._log.info("disk_space_restored", root=name, path=str(path))
        return set(self._full_roots)

    async def sweep(self) -> None:
        """Remove finished jobs' directories past their retention; release their uids."""
        roots = self.roots()
        on_disk = {
            name: await asyncio.to_thread(job_files.job_dirs, path) for name, path in roots.items()
        }
        claims = await job_users.claims(self.store)
        ids = sorted(
            {job_id for dirs in on_disk.values() for job_id in dirs}
            | {claim.value.job_id for claim in claims}
        )
        known = await self._finished(ids)
        now, retention = time.time(), self.config.file_retention_s
        for name, path in roots.items():
            for job_id in job_files.expired(on_disk[name], known, now=now, retention_s=retention):
                await asyncio.to_thread(job_files.remove, path / job_id)
                FILES_REMOVED.inc()
                self._log.info("job_files_removed", job_id=job_id, root=name, path=str(path))
        for claim in claims:
            job_id = claim.value.job_id
            claimed = claim.value.claim_time.ToNanoseconds() / 1e9
            over = job_files.expired({job_id: claimed}, known, now=now, retention_s=retention)
            if over and await job_users.release(self.store, claim):
                self._log.info("job_uid_released", job_id=job_id, uid=claim.value.uid)
        for job_id in list(self._users):
            if not known.get(job_id, job_files.Finished(live=False)).live:
                self._users.pop(job_id, None)
                self._reclaimed.discard(job_id)

    async def _finished(self, ids: list[str]) -> dict[str, job_files.Finished]:
        """What the sweep knows of each job: live here or allocated, and when it finished."""
        keys = self.store.keys
        records = await self.store.get_many([keys.job(job_id) for job_id in ids], pb.Job)
        allocated = await self.store.get_many(
            [keys.allocation(job_id) for job_id in ids], pb.Allocation
        )
        known: dict[str, job_files.Finished] = {}
        for job_id, record, allocation in zip(ids, records, allocated, strict=True):
            live = allocation is not None or self._live(job_id)
            if record is None:
                known[job_id] = job_files.Finished(live=live, gone=True)
            elif record.value.state in _TERMINAL:
                finish = record.value.finish_time.ToNanoseconds() / 1e9
                known[job_id] = job_files.Finished(live=live, finish_time=finish)
            else:
                known[job_id] = job_files.Finished(live=live)
        return known
