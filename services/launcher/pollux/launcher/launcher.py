"""The node's control loop: registration, allocation watch, replica start/stop, status reports.

Registration. The node is registered under a `LeasedRegistration` (pollux.service.session: the
one lease rule every lease holder shares). A lost lease (etcd answered that it expired, or no
keep-alive succeeded for a whole ttl) means the rest of the cluster already counts this node as
gone and may re-place its replicas, so the launcher stops its replicas (self-fencing) and
registers again under a new lease.

Watch. Allocations are listed at one revision and watched from the next, so no change is
missed; every change and a periodic timer trigger one reconcile pass (`reconcile`), which also
heals whatever an event could not (a barrier that cleared, a status write that failed).

Generation barrier (checkpoint safety: a job never runs two generations at once). When a
job's generation changes or its allocation is deleted, this node's replicas of the old
generation are stopped (SIGTERM, grace, SIGKILL). The new generation's replicas start only when
every replica status of an older generation of the job — on any node — is EXITED, or names
a node that is no longer registered. Starting is then made safe against races by writing the
new replicas' RUNNING statuses *before* spawning them, in one etcd transaction that requires
the allocation to be unchanged since it was read and the status keys to be unchanged since the
barrier read them: a launcher that saw a stale allocation, or that raced another node's
write, spawns nothing.

Statuses are unleased (the scheduler reads exit codes after a node is gone). A replica's exit is
written conditionally on its own last status write, so a late report from a partitioned node
never overwrites the status of a newer generation's replica of the same rank.

Containers. On a launcher with ``runtime = "podman"`` or ``"docker"``, a job naming an image
runs each replica as the runtime's ``run`` client (containers.py), supervised like any replica
process; a launcher with ``runtime = "process"`` refuses such a job (its replicas exit 127
saying so), and jobs without an image run as processes whatever the runtime.

Users and files. A root launcher runs each job's replicas under the job's own uid (claimed in
etcd, job_users.py) with a private HOME and TMPDIR; the job's checkpoint, log and scratch
directories are that uid's, mode 0700, and are removed by the launcher's sweep once the job is
over and ``file_retention_s`` has passed (job_files.py), which also releases the uid. The sweep
checks the roots' free space too: a full one is said in one ``disk_full`` line and the
``pollux_launcher_root_full`` gauge until space returns.

Orphans. A RUNNING status that names this node but no replica this process started belongs
to a previous launcher process that died without stopping it. Its process (if it still exists
and carries the job's environment) is stopped, and the status is closed as a planned stop
(143): the launcher never restarts replicas itself; the scheduler re-allocates.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import pwd
import signal
import socket
import stat
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import prometheus_client
import structlog

from pollux.launcher import job_files, job_users
from pollux.launcher.config import LauncherConfig
from pollux.launcher.containers import (
    NOBODY,
    RunRequest,
    container_env,
    find_runtime,
    mount_problems,
    remove_fenced,
    run_argv,
    runtime_is_rootless,
)
from pollux.launcher.fence import fence_margin, fence_token, kill_fenced
from pollux.launcher.gpus import Inventory
from pollux.launcher.job_policy import RunAs, checkpoint_problems
from pollux.launcher.placement import (
    PlacementError,
    ReplicaPlan,
    contract_env,
    local_ranks,
    master_ports,
    plan_replicas,
    replica_env,
)
from pollux.launcher.replica import PLANNED_STOP, LaunchSpec, Replica
from pollux.launcher.replica_log import DISK_FULL_ERRNOS
from pollux.launcher.watchdog import WatchdogLink
from pollux.service.auth import job_credential
from pollux.service.config import ConfigError
from pollux.service.job_credentials import JobKeyring
from pollux.service.keys import Kind
from pollux.service.ownership import ranked
from pollux.service.session import LeasedRegistration
from pollux.service.store import (
    Conflict,
    Entry,
    Expect,
    Put,
    Store,
    StoreError,
    WatchEvent,
    cancel_and_wait,
    decode,
)
from pollux.v1 import types_pb2 as pb

log = structlog.get_logger(__name__)

REPLICAS_STARTED = prometheus_client.Counter(
    "pollux_launcher_replicas_started_total", "Replica processes started on this node."
)
REPLICA_EXITS = prometheus_client.Counter(
    "pollux_launcher_replica_exits_total",
    "Replica exits on this node by outcome (success, planned_stop, failure).",
    ["outcome"],
)
REPLICAS_RUNNING = prometheus_client.Gauge(
    "pollux_launcher_replicas_running", "Replicas alive on this node."
)
RECONCILE_PASSES = prometheus_client.Counter(
    "pollux_launcher_reconcile_passes_total", "Reconcile passes finished (successful or not)."
)
LEASE_LOSSES = prometheus_client.Counter(
    "pollux_launcher_lease_losses_total", "Times the node registration lease was lost."
)
ROOT_FULL = prometheus_client.Gauge(
    "pollux_launcher_root_full",
    "1 while a root of the launcher (checkpoint, log, scratch) has no space left for jobs.",
    ["root"],
)
REPLICA_DISK_FULL = prometheus_client.Counter(
    "pollux_launcher_replica_disk_full_total",
    "Replicas that failed on a full disk (ENOSPC/EDQUOT); their jobs fail rather than restart.",
)
FILES_REMOVED = prometheus_client.Counter(
    "pollux_launcher_job_dirs_removed_total",
    "Job directories removed after their retention (or reclaimed from a released uid).",
)

_PORT_PROBES = 64
"""Most MASTER_PORT candidates probed before giving up and using the derived one."""


GENERATION_FILE = ".pollux-generation"
"""The checkpoint directory's fence file (docs/architecture.md §7): the newest generation
started on it. pollux.train refuses to write a checkpoint for an older generation."""


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


class NodeNameInUseError(ConfigError):
    """Another live launcher holds this node's registration: a configuration problem (exit 2).

    Attributes:
        node_name: The contested name.
        address: The other launcher's address.
    """

    def __init__(self, node_name: str, address: str) -> None:
        super().__init__(
            [
                f"node_name: {node_name!r} is registered by another launcher at {address}; "
                "give each node a unique name"
            ]
        )
        self.node_name = node_name
        self.address = address


@dataclass(frozen=True, slots=True)
class _JobDirs:
    """A job's directories on this node (job_files.py)."""

    checkpoint: Path
    home: Path
    tmp: Path
    ca: Path | None


_SESSION_VARIABLES = frozenset({"SSH_AUTH_SOCK", "DBUS_SESSION_BUS_ADDRESS", "KRB5CCNAME", "MAIL"})
"""The launcher's own session's variables, not passed on to replicas."""
_TERMINAL = frozenset({pb.JOB_STATE_SUCCEEDED, pb.JOB_STATE_FAILED, pb.JOB_STATE_CANCELLED})
FULL_BYTES = 1024 * 1024
"""A root with less than this available to jobs counts as full."""


@dataclass(frozen=True, slots=True)
class _Current:
    """A job's allocation as last seen, with the mod revision launches are conditioned on."""

    allocation: pb.Allocation
    mod_revision: int


def exit_outcome(code: int) -> str:
    """How the scheduler reads an exit code: success, planned_stop or failure."""
    if code == 0:
        return "success"
    return "planned_stop" if code == PLANNED_STOP else "failure"


class Launcher:
    """Runs this node's share of every allocation.

    Args:
        config: The launcher configuration.
        store: The cluster state.
        inventory: The node's GPUs or CPU slots.
        advertise: host:port of this launcher's gRPC service (registered as Node.address).
        environ: Environment replicas inherit (the launcher's own by default).
    """

    def __init__(
        self,
        config: LauncherConfig,
        store: Store,
        inventory: Inventory,
        *,
        advertise: str,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.inventory = inventory
        self.node_name = config.node_name
        self.advertise = advertise
        self._environ = dict(os.environ if environ is None else environ)
        self._allocations: dict[str, _Current] = {}
        self._replicas: dict[tuple[str, int, int], Replica] = {}
        self._launched: dict[str, int] = {}
        """Per job, the newest generation this node started (or found started)."""
        self._master_ports: dict[tuple[str, int], int] = {}
        self._stops: dict[tuple[str, int, int], asyncio.Task[int]] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._orphans: set[tuple[str, int, int]] = set()
        self._loops: list[asyncio.Task[None]] = []
        self._wake = asyncio.Event()
        self._waiting = False
        self.passes = 0
        """Reconcile passes finished (successful or not): what "the launcher looked" means."""
        self._scan_orphans = True
        self._uid = os.geteuid()
        policy = config.job_policy
        self.per_job_uids = policy.per_job_uids(self._uid)
        """Whether each job's replicas run under the job's own uid (job_users.py)."""
        self.run_as = None if self.per_job_uids else policy.run_as(self._uid)
        """Whom every replica runs as when jobs share a user (``--insecure``); None when each
        job has its own (`job_user`) or replicas run as the launcher's user."""
        self._job_users: dict[str, RunAs] = {}
        """Each job's claimed user, once read or claimed."""
        self._reclaimed: set[str] = set()
        """Jobs whose uid's leftovers of other jobs were removed on this node."""
        self._full_roots: set[str] = set()
        self.fence_token = fence_token(config.etcd.endpoint, config.etcd.root, self.node_name)
        self._keyring = JobKeyring(store)
        self.runtime_binary = None if config.runtime == "process" else find_runtime(config.runtime)
        """The container runtime's client (None: plain processes only, or it is missing)."""
        self.runtime_client: tuple[str, ...] = (
            ()
            if self.runtime_binary is None
            else (self.runtime_binary, *config.runtime_global_flags)
        )
        """The client's argv before a subcommand (binary and runtime_global_flags)."""
        self._runtime_rootless = self._uid != 0
        """Whether containers run without root (asked of podman at start)."""
        self.watchdog = WatchdogLink(
            self.fence_token,
            margin_s=fence_margin(config.lease_ttl_s),
            container=None if not self.runtime_client else (config.runtime, *self.runtime_client),
        )
        self._registration = LeasedRegistration(
            store,
            config.lease_ttl_s,
            self._register,
            holder="node",
            on_lost=self._lease_lost,
            on_confirmed=self._lease_confirmed,
        )
        self._closing = False
        self._log = log.bind(node_id=self.node_name)

    # -- lifecycle -----------------------------------------------------------------------------

    def node(self) -> pb.Node:
        """This node's registration record."""
        node = pb.Node(
            name=self.node_name,
            address=self.advertise,
            gpus=self.inventory.count,
            gpu_type=self.inventory.gpu_type,
            labels=self.config.label_map(),
        )
        node.register_time.GetCurrentTime()
        return node

    async def start(self, address: str) -> None:
        """Register the node as reachable at `address` and start its loops.

        Raises:
            NodeNameInUseError: Another live launcher registered this node name.
            StoreError: etcd refused the registration (the process should exit).
        """
        self.advertise = address
        for name, path in self._roots().items():
            job_files.make_root(path, job_files.ROOT_MODES[name])
        await self._claim_name()
        self._warn_about_replica_user()
        strays = kill_fenced(self.fence_token)
        if strays:
            self._log.warning("stray_replicas_killed", pids=strays)
        await self._remove_stray_containers()
        await self.watchdog.start()
        with structlog.contextvars.bound_contextvars(node_id=self.node_name):
            await self._registration.start()
            self._loops = [
                asyncio.create_task(self._watch_loop()),
                asyncio.create_task(self._reconcile_loop()),
                asyncio.create_task(self._sweep_loop()),
            ]
        self._log.info(
            "node_registered",
            address=self.advertise,
            gpus=self.inventory.count,
            gpu_type=self.inventory.gpu_type,
        )

    async def _remove_stray_containers(self) -> None:
        """Remove the containers a previous launcher process of this node left (by label)."""
        runtime = self.config.runtime
        if runtime == "process":
            return
        if self.runtime_binary is None:
            self._log.warning(
                "container_runtime_missing",
                runtime=runtime,
                reason=f"runtime = {runtime} but no {runtime} executable is on the launcher's "
                "PATH: every job naming an image fails here until it is installed",
            )
            return
        if runtime == "podman":
            rootless = await asyncio.to_thread(runtime_is_rootless, self.runtime_client)
            if rootless is not None:
                self._runtime_rootless = rootless
        names = await asyncio.to_thread(
            remove_fenced, runtime, self.runtime_client, self.fence_token
        )
        if names:
            self._log.warning("stray_containers_removed", containers=names)

    def _warn_about_replica_user(self) -> None:
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

    async def stop(self) -> None:
        """Stop every replica gracefully, report their exits, then deregister.

        The lease is kept alive until the replicas are gone: while the node is registered,
        other nodes' launchers hold the next generation back (the barrier), so its replicas
        never overlap with these.
        """
        self._closing = True
        self._wake.set()
        reconcile = self._loops[1] if self._loops else None
        if reconcile is not None:
            # Let a pass in flight finish, so no status is written without its process.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(reconcile), 4 * self.config.etcd.timeout_s)
        for task in self._loops:
            await cancel_and_wait(task)  # the watch loop may swallow a single cancel
        live = [r for r in self._replicas.values() if r.alive]
        self._log.info("launcher_stopping", replicas=len(live))
        stops = [self._stop(r, "launcher shutting down") for r in live]
        if stops:
            await asyncio.gather(*stops, return_exceptions=True)
        pending = {t for t in self._background if not t.done()}
        if pending:
            _, pending = await asyncio.wait(pending, timeout=2 * self.config.etcd.timeout_s)
        for task in pending:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._registration.close(revoke=True)
        await self.watchdog.close()
        self._log.info("node_deregistered")

    # -- registration --------------------------------------------------------------------------

    async def _claim_name(self) -> None:
        """Wait out a registration of this name by another address, or fail.

        Two launchers with one node name (cloned hosts) would each count the other's replicas
        as orphans and stop them. A registration from the same address is this launcher's
        previous process and is simply replaced; one from another address may be a crashed
        launcher whose lease has not expired yet, so it gets one ttl to disappear.
        """
        key = self.store.keys.node(self.node_name)
        deadline = time.monotonic() + self.config.lease_ttl_s + 1.0
        while (held := await self.store.get(key, pb.Node)) is not None:
            if held.value.address == self.advertise:
                return
            if time.monotonic() > deadline:
                raise NodeNameInUseError(self.node_name, held.value.address)
            self._log.info("node_name_held", address=held.value.address)
            await asyncio.sleep(0.5)

    async def _register(self, lease: int) -> None:
        await self.store.register_node(self.node(), lease=lease)

    def _lease_confirmed(self, sent_at: float) -> None:
        self.watchdog.confirmed(sent_at, self.config.lease_ttl_s)

    def _lease_lost(self, reason: str) -> None:
        """Self-fence: the cluster counts this node as gone, so its replicas die now.

        No grace period: the scheduler may already have re-placed their jobs (the watchdog has
        usually killed them already; this covers a lease etcd reports expired early).
        """
        LEASE_LOSSES.inc()
        live = [r for r in self._replicas.values() if r.alive]
        self._log.warning("node_fenced", reason=reason, killing=len(live))
        for replica in live:
            self._spawn(self._fence(replica))

    async def _fence(self, replica: Replica) -> None:
        await replica.fence()

    # -- allocation watch ----------------------------------------------------------------------

    async def _watch_loop(self) -> None:
        prefix = self.store.keys.prefix(Kind.ALLOCATIONS)
        while True:
            try:
                current, revision = await self.store.list_allocations()
                self._allocations = {
                    job_id: _Current(entry.value, entry.mod_revision)
                    for job_id, entry in current.items()
                }
                self._wake.set()
                async for event in self.store.watch(prefix, start_revision=revision + 1):
                    self._apply(event)
                    self._wake.set()
            except StoreError as error:  # unreachable, or the revision was compacted: re-list
                self._log.warning("allocation_watch_failed", error=str(error))
                await asyncio.sleep(1.0)
            except Exception:  # a dead watch would freeze the node: log, re-list, go on
                self._log.exception("allocation_watch_crashed")
                await asyncio.sleep(1.0)

    def _apply(self, event: WatchEvent) -> None:
        job_id = self.store.keys.name_of(event.key, Kind.ALLOCATIONS)
        if event.value is None:
            self._allocations.pop(job_id, None)
            return
        try:
            allocation = decode(pb.Allocation, event.value, event.key)
        except StoreError as error:
            self._log.error("allocation_corrupt", job_id=job_id, error=str(error))
            return
        self._allocations[job_id] = _Current(allocation, event.revision)

    # -- reconcile -----------------------------------------------------------------------------

    async def _reconcile_loop(self) -> None:
        while not self._closing:
            period = self.config.barrier_poll_s if self._waiting else self.config.resync_s
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), period)
            self._wake.clear()
            try:
                await self.reconcile()
            except StoreError as error:
                self._waiting = True
                self._log.warning("reconcile_failed", error=str(error))
            except Exception:
                self._waiting = True
                self._log.exception("reconcile_crashed")
            self.passes += 1
            RECONCILE_PASSES.inc()

    @property
    def waiting(self) -> bool:
        """Whether the last pass left a launch waiting (barrier, or the node fenced)."""
        return self._waiting

    async def reconcile(self) -> None:
        """One pass: stop what is no longer allocated here, start what may start now."""
        for replica in list(self._replicas.values()):
            current = self._allocations.get(replica.job_id)
            if replica.alive and (
                current is None or current.allocation.generation != replica.generation
            ):
                reason = "allocation deleted" if current is None else "generation changed"
                self._stop(replica, reason)
        for job_id in list(self._launched):
            if job_id not in self._allocations:
                del self._launched[job_id]
        if self._scan_orphans:
            statuses, _ = await self.store.list_replica_statuses()
            for entry in statuses:
                self._adopt_if_orphan(entry)
            self._scan_orphans = False
        nodes = {entry.value.name: entry.value for entry in (await self.store.list_nodes())[0]}
        lease = self._registration.lease_id
        if self.node_name not in nodes and lease and not self._closing:
            # The key vanished though the lease lives (deleted by hand?): put it back.
            await self.store.register_node(self.node(), lease=lease)
            nodes[self.node_name] = self.node()
        if self._closing or not lease or self.watchdog.expired():
            # Fenced (lease lost or unconfirmed past the watchdog's deadline) or shutting
            # down: the cluster may already count this node as gone, so nothing new starts
            # until it is registered again.
            self._waiting = not self._closing
            self._prune()
            return
        waiting = False
        for job_id, current in list(self._allocations.items()):
            generation = current.allocation.generation
            if self._launched.get(job_id, -1) >= generation:
                continue
            if not local_ranks(current.allocation, self.node_name):
                continue
            with structlog.contextvars.bound_contextvars(job_id=job_id, generation=generation):
                waiting |= not await self._try_launch(job_id, current, nodes)
        self._waiting = waiting
        self._prune()

    async def _try_launch(
        self, job_id: str, current: _Current, nodes: Mapping[str, pb.Node]
    ) -> bool:
        """Start this node's replicas of the job's current generation if the barrier allows.

        Returns:
            True when nothing is left to do for this generation, False to retry soon.
        """
        generation = current.allocation.generation
        if any(
            r.alive and r.job_id == job_id and r.generation < generation
            for r in self._replicas.values()
        ):
            return False  # our own old replicas are still stopping
        statuses = await self._barrier(job_id, generation, nodes)
        if statuses is None:
            return False
        for rank in local_ranks(current.allocation, self.node_name):
            seen = statuses.get(rank)
            if seen is not None and seen.value.generation >= generation:
                # Started before (by an earlier launcher process): never start twice.
                self._launched[job_id] = generation
                self._adopt_if_orphan(seen)
                return True
        job = await self.store.get_job(job_id)
        if job is None:
            self._log.warning("job_missing", job_id=job_id)
            return False
        try:
            plans = plan_replicas(
                current.allocation,
                self.node_name,
                nodes,
                master_port=self._master_port(job_id, current.allocation),
                free_slots=self._free_slots(),
            )
        except PlacementError as error:
            self._log.info("launch_waiting", job_id=job_id, reason=str(error))
            return False
        return await self._launch(job_id, current, job.value.spec, plans, statuses)

    async def _barrier(
        self, job_id: str, generation: int, nodes: Mapping[str, pb.Node]
    ) -> dict[int, Entry[pb.ReplicaStatus]] | None:
        """The job's statuses by rank if no older generation may still run, else None."""
        entries, _ = await self.store.list_replica_statuses(job_id)
        blockers = []
        for entry in entries:
            status = entry.value
            if (
                status.generation < generation
                and status.phase != pb.REPLICA_PHASE_EXITED
                and status.node in nodes
            ):
                blockers.append(f"{status.node}/{status.rank}@{status.generation}")
                self._adopt_if_orphan(entry)
        if blockers:
            self._log.debug("barrier_waiting", job_id=job_id, blockers=blockers)
            return None
        return {entry.value.rank: entry for entry in entries}

    async def _launch(
        self,
        job_id: str,
        current: _Current,
        spec: pb.JobSpec,
        plans: list[ReplicaPlan],
        statuses: Mapping[int, Entry[pb.ReplicaStatus]],
    ) -> bool:
        """Claim the replicas' status keys in one conditional txn, then spawn them.

        Returns:
            False if the txn lost a race (allocation or a status changed since read).
        """
        generation = current.allocation.generation
        agents, _ = await self.store.list_agents()
        agent_addrs = [m.address for m in ranked(job_id, [a.value for a in agents], key=_id)]
        refusal = self.config.job_policy.refusal(
            spec,
            job_id=job_id,
            checkpoint_root=self.config.checkpoint_root,
            default_working_dir=self.config.default_working_dir,
            launcher_uid=self._uid,
        )
        if spec.image:
            refusal = "; ".join(filter(None, [*self._container_problems(job_id, spec), refusal]))
        owner = self.run_as
        if not refusal:
            try:
                owner = await self._job_user(job_id)
            except job_users.NoFreeUid as error:
                refusal = str(error)
            except ValueError as error:  # a claim outside this launcher's range
                refusal = str(error)
        if refusal:  # nothing of it is created; its replicas exit 127 with the reason
            self._log.warning("job_refused", job_id=job_id, reason=refusal)
        grace = float(spec.stop_grace_s or self.config.default_stop_grace_s)
        replicas = [
            Replica(
                job_id=job_id,
                generation=generation,
                rank=plan.rank,
                node=self.node_name,
                slot=plan.slot,
                grace_s=grace,
                ring_lines=self.config.log_ring_lines,
            )
            for plan in plans
        ]
        tls = self.store.tls
        credential = job_credential(await self._keyring.key(), job_id) if tls else ""
        # A process replica reads the CA from its scratch directory (the launcher's copy may
        # lie where job uids cannot read); a container gets the launcher's file mounted.
        ca_pem = tls.paths[0].read_bytes() if tls and not refusal and not spec.image else b""
        log_dir = None if checkpoint_problems(job_id, self.config.log_root) else job_id
        keys = self.store.keys
        expect = [Expect(keys.allocation(job_id), current.mod_revision)]
        for plan in plans:
            seen = statuses.get(plan.rank)
            expect.append(Expect(keys.replica(job_id, plan.rank), seen.mod_revision if seen else 0))
        ops = [Put(keys.replica(job_id, r.rank), r.status().SerializeToString()) for r in replicas]
        try:
            revision = await self.store.txn(ops, expect=expect)
        except Conflict as error:
            self._log.info("launch_raced", job_id=job_id, key=error.key.decode())
            return False
        # From here to the spawns nothing awaits: a claimed status always gets its process.
        self._launched[job_id] = generation
        if current.allocation.nodes[0] == self.node_name:
            self._master_ports[(job_id, generation)] = plans[0].master_port
        for plan, replica in zip(plans, replicas, strict=True):
            replica.status_revision = revision
            self._replicas[replica.key] = replica

            def prepare(plan: ReplicaPlan = plan) -> LaunchSpec:
                log_path = (
                    None
                    if log_dir is None
                    else self.config.log_root / log_dir / f"{generation}-{plan.rank}.log"
                )
                if refusal:
                    return LaunchSpec(
                        command=list(spec.command),
                        env={},
                        cwd=None,
                        log_path=log_path,
                        run_as=owner,
                        refusal=refusal,
                    )
                dirs = self._prepare_dirs(job_id, generation, owner, ca_pem, scratch=not spec.image)
                ca = dirs.ca if dirs.ca is not None else (tls.paths[0] if tls else None)
                contract = contract_env(
                    plan,
                    job_id=job_id,
                    generation=generation,
                    agent_addrs=agent_addrs,
                    checkpoint_dir=str(dirs.checkpoint),
                    cuda=self.inventory.cuda,
                    fence_token=self.fence_token,
                    credential=credential,
                    tls_ca=str(ca) if ca is not None else "",
                )
                if spec.image:
                    return self._container_launch(
                        job_id, generation, spec, plan, contract, log_path, owner
                    )
                return LaunchSpec(
                    command=list(spec.command),
                    env=replica_env(self._replica_environ(dirs, owner), spec, contract),
                    cwd=spec.working_dir or _optional(self.config.default_working_dir),
                    log_path=log_path,
                    run_as=owner,
                    log_max_bytes=self.config.log_max_bytes,
                    log_rotations=self.config.log_rotations,
                )

            self._spawn(self._supervise(replica, prepare))
        self._log.info(
            "replicas_launching",
            job_id=job_id,
            generation=generation,
            ranks=[p.rank for p in plans],
            master=f"{plans[0].master_addr}:{plans[0].master_port}",
            agents=agent_addrs,
        )
        return True

    def _container_problems(self, job_id: str, spec: pb.JobSpec) -> list[str]:
        """Why this node cannot run the job's image; empty when it can."""
        runtime = self.config.runtime
        if runtime == "process":
            return [
                f"job {job_id} names image {spec.image} but launcher {self.node_name} has "
                "runtime = process: set runtime = podman or docker on the launcher, or submit "
                "without --image"
            ]
        if self.runtime_binary is None:
            return [
                f"job {job_id} names image {spec.image} but launcher {self.node_name} has "
                f"runtime = {runtime} and no {runtime} executable on its PATH: install "
                f"{runtime} on the node"
            ]
        return mount_problems(
            _mounts(spec), self.config.container_mounts_allowed, node=self.node_name
        )

    def _container_user(self, owner: RunAs | None) -> RunAs:
        """Whom containers run as: the job's user, else nobody (root launcher) or its own."""
        if owner is not None:
            return owner
        return NOBODY if self._uid == 0 else RunAs(self._uid, os.getegid())

    async def _job_user(self, job_id: str) -> RunAs | None:
        """Whom the job's replicas run as: its own uid (claimed in etcd), or the shared user.

        Raises:
            job_users.NoFreeUid: Every uid of the range is claimed.
            ValueError: The job's uid, claimed by another launcher, is outside this one's range.
            StoreError: etcd failed (the launch is retried on the next pass).
        """
        if not self.per_job_uids:
            return self.run_as
        known = self._job_users.get(job_id)
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
            self._job_users[job_id] = known
        return known

    def _prepare_dirs(
        self, job_id: str, generation: int, owner: RunAs | None, ca_pem: bytes, *, scratch: bool
    ) -> _JobDirs:
        """Make the job's checkpoint and (`scratch`) scratch directories, private to `owner`.

        The checkpoint directory is fenced for `generation` too.

        Before a uid's first use on this node, what other jobs left under it is removed.

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
            return _JobDirs(checkpoint=checkpoint, home=place, tmp=place, ca=None)
        job_files.make_private_dir(place, owner)
        home = job_files.make_private_subdir(place, "home", owner)
        tmp = job_files.make_private_subdir(place, "tmp", owner)
        ca = job_files.write_file(place, "ca.pem", ca_pem) if ca_pem else None
        return _JobDirs(checkpoint=checkpoint, home=home, tmp=tmp, ca=ca)

    def _replica_environ(self, dirs: _JobDirs, owner: RunAs | None) -> dict[str, str]:
        """What a replica inherits: the launcher's environment with a HOME, TMPDIR of its own.

        Variables that point at the launcher's own sessions (XDG dirs, agent sockets) go.
        """
        env = {
            name: value
            for name, value in self._environ.items()
            if not name.startswith("XDG_") and name not in _SESSION_VARIABLES
        }
        env["HOME"] = str(dirs.home)
        env["TMPDIR"] = str(dirs.tmp)
        if owner is not None and self.per_job_uids:
            # No passwd entry names the uid: getpass and friends read these first.
            env["USER"] = env["LOGNAME"] = f"pollux-{owner.uid}"
        return env

    def _container_launch(
        self,
        job_id: str,
        generation: int,
        spec: pb.JobSpec,
        plan: ReplicaPlan,
        contract: Mapping[str, str],
        log_path: Path | None,
        owner: RunAs | None,
    ) -> LaunchSpec:
        """The LaunchSpec of a replica that runs in the job's image (containers.py)."""
        assert self.runtime_binary is not None  # else _container_problems refused the job
        gpu = self.inventory.cuda
        inside = container_env({**spec.env, **spec.secret_env, **contract}, gpu=gpu)
        request = RunRequest(
            runtime=self.config.runtime,
            binary=self.runtime_binary,
            image=spec.image,
            command=list(spec.command),
            env_names=list(inside),
            job_id=job_id,
            generation=generation,
            rank=plan.rank,
            fence_token=self.fence_token,
            user=self._container_user(owner),
            checkpoint_dir=contract["POLLUX_CHECKPOINT_DIR"],
            tls_ca=contract.get("POLLUX_TLS_CA", ""),
            working_dir=spec.working_dir,
            shm_size_mb=spec.shm_size_mb,
            mounts=_mounts(spec),
            gpu=plan.slot if gpu else None,
            flags=self.config.runtime_flags,
            rootless=self._runtime_rootless,
            global_flags=self.config.runtime_global_flags,
        )
        # The client gets the launcher's environment (it is a host program) plus the values
        # the container takes by name, so no value appears in its command line.
        client_env = replica_env(self._environ, spec, contract)
        client_env.update(inside)
        return LaunchSpec(
            command=run_argv(request),
            env=client_env,
            cwd=None,
            log_path=log_path,
            container=request.container(),
            log_max_bytes=self.config.log_max_bytes,
            log_rotations=self.config.log_rotations,
        )

    def _free_slots(self) -> list[int]:
        held = {r.slot for r in self._replicas.values() if r.alive}
        return [slot for slot in self.inventory.slots if slot not in held]

    def _master_port(self, job_id: str, allocation: pb.Allocation) -> int:
        """MASTER_PORT for a generation (see placement's module docstring for the derivation).

        Only the launcher of rank 0's node can see whether the port is free, and only when the
        job is entirely local can it move to another port without telling anyone, so that is
        the one case that probes: a multi-node job keeps the derived port (every node derives
        the same one), and a busy port shows up as a failed replica that the scheduler
        re-allocates — with a new generation, hence a new port.
        """
        candidates = master_ports(job_id, allocation.generation, self.config.port_range)
        derived = next(candidates)
        if allocation.nodes[0] != self.node_name:
            return derived
        taken = {
            port
            for (other, _), port in self._master_ports.items()
            if other != job_id and self._job_alive(other)
        }
        if set(allocation.nodes) != {self.node_name}:
            if derived in taken or not _port_free(derived):
                self._log.warning("master_port_busy", job_id=job_id, port=derived)
            return derived
        for port in itertools.islice(itertools.chain([derived], candidates), _PORT_PROBES):
            if port not in taken and _port_free(port):
                return port
        self._log.warning("master_port_busy", job_id=job_id, port=derived)
        return derived

    def _job_alive(self, job_id: str) -> bool:
        return any(r.alive and r.job_id == job_id for r in self._replicas.values())

    def _prune(self) -> None:
        """Forget the oldest reported exits beyond `replica_history`, and stale port records."""
        done = sorted(
            (r for r in self._replicas.values() if not r.alive and r.exit_reported),
            key=lambda r: r.exited_at or 0.0,
        )
        for replica in done[: max(0, len(done) - self.config.replica_history)]:
            del self._replicas[replica.key]
        for job_id, generation in list(self._master_ports):
            if not any(
                r.alive and r.job_id == job_id and r.generation == generation
                for r in self._replicas.values()
            ):
                del self._master_ports[(job_id, generation)]
        REPLICAS_RUNNING.set(sum(r.alive for r in self._replicas.values()))

    # -- files: retention and free space --------------------------------------------------------

    def _roots(self) -> dict[str, Path]:
        config = self.config
        return {
            "checkpoint_root": config.checkpoint_root,
            "log_root": config.log_root,
            "scratch_root": config.scratch_root,
        }

    async def _sweep_loop(self) -> None:
        """Check the roots' free space every resync; sweep finished jobs' files every sweep_s."""
        next_sweep = 0.0
        while not self._closing:
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
        for name, path in self._roots().items():
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
        roots = self._roots()
        on_disk = {
            name: await asyncio.to_thread(job_files.job_dirs, path) for name, path in roots.items()
        }
        claims = await job_users.claims(self.store)
        ids = sorted(
            {job_id for dirs in on_disk.values() for job_id in dirs}
            | {claim.value.job_id for claim in claims}
        )
        keys = self.store.keys
        records = await self.store.get_many([keys.job(job_id) for job_id in ids], pb.Job)
        allocated = await self.store.get_many(
            [keys.allocation(job_id) for job_id in ids], pb.Allocation
        )
        known: dict[str, job_files.Finished] = {}
        for job_id, record, allocation in zip(ids, records, allocated, strict=True):
            live = allocation is not None or job_id in self._allocations or self._job_alive(job_id)
            if record is None:
                known[job_id] = job_files.Finished(live=live, gone=True)
            elif record.value.state in _TERMINAL:
                finish = record.value.finish_time.ToNanoseconds() / 1e9
                known[job_id] = job_files.Finished(live=live, finish_time=finish)
            else:
                known[job_id] = job_files.Finished(live=live)
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
        for job_id in list(self._job_users):
            if not known.get(job_id, job_files.Finished(live=False)).live:
                self._job_users.pop(job_id, None)
                self._reclaimed.discard(job_id)

    # -- replica supervision -------------------------------------------------------------------

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _stop(self, replica: Replica, reason: str) -> asyncio.Task[int]:
        task = self._stops.get(replica.key)
        if task is None:
            self._log.info(
                "replica_stop_requested",
                job_id=replica.job_id,
                generation=replica.generation,
                rank=replica.rank,
                reason=reason,
            )
            task = asyncio.create_task(replica.stop())
            self._stops[replica.key] = task
            task.add_done_callback(lambda _: self._stops.pop(replica.key, None))
        return task

    async def _supervise(self, replica: Replica, prepare: Callable[[], LaunchSpec]) -> None:
        """Prepare and run one replica to its reported exit.

        Any exception while preparing or starting it is a clean replica failure: the replica
        exits with `SPAWN_FAILED` (its slot is free again), the exit is reported like any other,
        and the launcher's loops go on.
        """
        try:
            await replica.start(prepare())
        except Exception as error:
            self._log.exception("replica_start_crashed", job_id=replica.job_id, rank=replica.rank)
            full = isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS
            replica.fail_to_start(
                f"cannot start the replica: {type(error).__name__}: {error}", disk_full=full
            )
        if replica.pid:
            REPLICAS_STARTED.inc()
            with contextlib.suppress(StoreError):  # the pid is informative; the exit is not
                replica.status_revision = await self._write_status(
                    replica.status(), expected=replica.status_revision
                )
        code = await replica.wait()
        if replica.killed(code) and self.watchdog.expired():
            replica.mark_fenced()  # the watchdog killed it: the node's lease had lapsed
            code = PLANNED_STOP
        REPLICA_EXITS.labels(exit_outcome(code)).inc()
        if replica.disk_full:
            REPLICA_DISK_FULL.inc()
            self._log.error(
                "replica_disk_full",
                job_id=replica.job_id,
                generation=replica.generation,
                rank=replica.rank,
                exit_code=code,
                line=replica.disk_full[-200:],
                action="the job fails rather than restarting onto the same full disk",
            )
        await self._report_exit(replica.status(), expected=replica.status_revision)
        replica.exit_reported = True
        self._wake.set()

    async def _write_status(self, status: pb.ReplicaStatus, *, expected: int) -> int:
        """Write a status if its key is still at mod revision `expected`; the new revision."""
        key = self.store.keys.replica(status.job_id, status.rank)
        return await self.store.txn(
            [Put(key, status.SerializeToString())], expect=[Expect(key, expected)]
        )

    async def _report_exit(self, status: pb.ReplicaStatus, *, expected: int) -> None:
        """Write an exit status until etcd takes it, or a newer writer owns the key."""
        fields = {"job_id": status.job_id, "generation": status.generation, "rank": status.rank}
        delay = 0.25
        while True:
            try:
                await self._write_status(status, expected=expected)
            except Conflict:
                self._log.info("replica_status_superseded", **fields)
                return
            except StoreError as error:
                self._log.warning("replica_status_failed", error=str(error), **fields)
                await asyncio.sleep(delay)
                delay = min(2 * delay, 5.0)
                continue
            self._log.info(
                "replica_reported",
                exit_code=status.exit_code,
                outcome=exit_outcome(status.exit_code),
                **fields,
            )
            return

    # -- orphans -------------------------------------------------------------------------------

    def _adopt_if_orphan(self, entry: Entry[pb.ReplicaStatus]) -> None:
        status = entry.value
        key = (status.job_id, status.generation, status.rank)
        if (
            status.node != self.node_name
            or status.phase == pb.REPLICA_PHASE_EXITED
            or key in self._replicas
            or key in self._orphans
        ):
            return
        self._orphans.add(key)
        self._log.warning(
            "orphan_replica",
            job_id=status.job_id,
            generation=status.generation,
            rank=status.rank,
            pid=status.pid,
        )
        self._spawn(self._reap(entry))

    async def _reap(self, entry: Entry[pb.ReplicaStatus]) -> None:
        """Stop a previous launcher process's replica and close its status."""
        status = pb.ReplicaStatus()
        status.CopyFrom(entry.value)
        code = PLANNED_STOP
        if status.pid and _is_replica(status.pid, status.job_id, status.generation):
            code = await _stop_foreign(status.pid, self.config.default_stop_grace_s)
        status.phase = pb.REPLICA_PHASE_EXITED
        status.exit_code = code
        status.time.GetCurrentTime()
        await self._report_exit(status, expected=entry.mod_revision)
        self._orphans.discard((status.job_id, status.generation, status.rank))
        self._wake.set()

    # -- queries (servicer) --------------------------------------------------------------------

    def replicas(self, job_id: str = "") -> list[Replica]:
        """Replicas this node runs or ran recently, newest generation first."""
        chosen = [r for r in self._replicas.values() if not job_id or r.job_id == job_id]
        return sorted(chosen, key=lambda r: (-r.generation, r.job_id, r.rank))

    def find(self, job_id: str, rank: int, min_generation: int = 0) -> Replica | None:
        """A replica of (job, rank) on this node, or None.

        The newest one if `min_generation` is 0, else the oldest of at least that generation,
        so that a follower asking for the one after its last sees each in turn.
        """
        mine = [r for r in self.replicas(job_id) if r.rank == rank]
        if min_generation == 0:
            return mine[0] if mine else None
        newer = [r for r in mine if r.generation >= min_generation]
        return newer[-1] if newer else None


def _id(member: pb.Member) -> str:
    return member.id


def _mounts(spec: pb.JobSpec) -> list[tuple[str, str, bool]]:
    return [(m.host_path, m.container_path, m.read_only) for m in spec.mounts]


def _optional(path: Path | None) -> str | None:
    return None if path is None else str(path)


def _port_free(port: int) -> bool:
    """Whether nothing listens on (or holds) `port` on any local address right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def _is_replica(pid: int, job_id: str, generation: int) -> bool:
    """Whether `pid` is (still) a replica of (job, generation), by its environment.

    Guards against signalling an unrelated process that reused the pid of a dead replica.
    """
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return (
        f"POLLUX_JOB_ID={job_id}".encode() in environ
        and f"POLLUX_ALLOCATION_GEN={generation}".encode() in environ
    )


async def _stop_foreign(pid: int, grace_s: float) -> int:
    """SIGTERM, grace, SIGKILL a process group this process did not start; its exit code.

    Not our child, so its real exit code is unknowable: a stop within the grace period
    reports 143 (planned), a kill reports -9.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not _exists(pid):
            return PLANNED_STOP
        await asyncio.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    return -int(signal.SIGKILL)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
