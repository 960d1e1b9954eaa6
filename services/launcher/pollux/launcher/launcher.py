"""The node's control loop: watch allocations, start and stop this node's replicas, report.

The parts, each a module of its own: the node's registration under a lease (registration.py),
the allocation watch (allocation_watch.py), the generation barrier (barrier.py), admission and
each replica's start (launch_specs.py, with container_runtime.py and workspaces.py for the
job's user and files), MASTER_PORT choice (ports.py), status writes (statuses.py) and orphans
of a previous launcher process (orphans.py, proc.py). This class runs the reconcile loop that
ties them: every allocation change and a periodic timer trigger one pass (`reconcile`), which
stops what is no longer allocated here (SIGTERM, grace, SIGKILL) and starts what the barrier
allows, claiming the replicas' statuses in one conditional transaction before spawning them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from collections.abc import Mapping

import prometheus_client
import structlog

from pollux.launcher import barrier
from pollux.launcher.allocation_watch import AllocationWatch, Current
from pollux.launcher.config import LauncherConfig
from pollux.launcher.container_runtime import ContainerRuntime
from pollux.launcher.fence import fence_margin, fence_token, kill_fenced
from pollux.launcher.gpus import Inventory
from pollux.launcher.launch_specs import LaunchSpecs
from pollux.launcher.orphans import OrphanReaper
from pollux.launcher.placement import PlacementError, ReplicaPlan, local_ranks, plan_replicas
from pollux.launcher.ports import MasterPorts
from pollux.launcher.registration import NodeRegistration
from pollux.launcher.replica import Replica
from pollux.launcher.statuses import StatusWriter
from pollux.launcher.supervisor import Supervisor
from pollux.launcher.watchdog import WatchdogLink
from pollux.launcher.workspaces import Workspaces
from pollux.service.ownership import ranked
from pollux.service.store import Conflict, Entry, Store, StoreError, cancel_and_wait
from pollux.v1 import types_pb2 as pb

__all__ = ["Launcher"]

log = structlog.get_logger(__name__)

RECONCILE_PASSES = prometheus_client.Counter(
    "pollux_launcher_reconcile_passes_total", "Reconcile passes finished (successful or not)."
)


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
        self._launched: dict[str, int] = {}
        """Per job, the newest generation this node started (or found started)."""
        self._loops: list[asyncio.Task[None]] = []
        self._wake = asyncio.Event()
        self._waiting = False
        self.passes = 0
        """Reconcile passes finished (successful or not): what "the launcher looked" means."""
        self._scan_orphans = True
        self._closing = False
        uid = os.geteuid()
        self.fence_token = fence_token(config.etcd.endpoint, config.etcd.root, self.node_name)
        self.runtime = ContainerRuntime(config, uid=uid, fence_token=self.fence_token)
        self.watchdog = WatchdogLink(
            self.fence_token,
            margin_s=fence_margin(config.lease_ttl_s),
            container=None if not self.runtime.client else (config.runtime, *self.runtime.client),
        )
        self.registration = NodeRegistration(
            config,
            store,
            inventory,
            advertise=advertise,
            watchdog=self.watchdog,
            on_lost=self._lease_lost,
        )
        self.allocations = AllocationWatch(store, self._wake.set, node_name=self.node_name)
        self.workspaces = Workspaces(config, store, uid=uid, live=self._live)
        self.specs = LaunchSpecs(
            config,
            store,
            inventory,
            self.workspaces,
            self.runtime,
            uid=uid,
            environ=os.environ if environ is None else environ,
        )
        self.ports = MasterPorts(self.node_name, config.port_range)
        self.statuses = StatusWriter(store, self.node_name)
        self.supervisor = Supervisor(
            self.node_name, self.statuses, fenced=self.watchdog.expired, exited=self._wake.set
        )
        self.orphans = OrphanReaper(
            self.node_name,
            self.statuses,
            grace_s=config.default_stop_grace_s,
            known=lambda key: key in self.supervisor,
            spawn=self.supervisor.spawn,
            reaped=self._wake.set,
        )
        self._log = log.bind(node_id=self.node_name)

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self, address: str) -> None:
        """Register the node as reachable at `address` and start its loops.

        Raises:
            NodeNameInUseError: Another live launcher registered this node name.
            StoreError: etcd refused the registration (the process should exit).
        """
        self.registration.advertise = address
        self.workspaces.make_roots()
        await self.registration.claim_name()
        self.workspaces.warn_about_replica_user()
        strays = kill_fenced(self.fence_token)
        if strays:
            self._log.warning("stray_replicas_killed", pids=strays)
        await self.runtime.start()
        await self.watchdog.start()
        with structlog.contextvars.bound_contextvars(node_id=self.node_name):
            await self.registration.start()
            self._loops = [
                asyncio.create_task(self.allocations.run()),
                asyncio.create_task(self._reconcile_loop()),
                asyncio.create_task(self.workspaces.run()),
            ]
        self._log.info(
            "node_registered",
            address=address,
            gpus=self.inventory.count,
            gpu_type=self.inventory.gpu_type,
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
        live = self.supervisor.live()
        self._log.info("launcher_stopping", replicas=len(live))
        stops = [self.supervisor.stop(r, "launcher shutting down") for r in live]
        if stops:
            await asyncio.gather(*stops, return_exceptions=True)
        await self.supervisor.drain(2 * self.config.etcd.timeout_s)
        await self.registration.close()
        await self.watchdog.close()
        self._log.info("node_deregistered")

    def _lease_lost(self, reason: str) -> None:
        """Self-fence: the cluster counts this node as gone, so its replicas die now.

        No grace period: the scheduler may already have re-placed their jobs (the watchdog has
        usually killed them already; this covers a lease etcd reports expired early).
        """
        self._log.warning("node_fenced", reason=reason, killing=len(self.supervisor.live()))
        self.supervisor.fence()

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
        allocations = self.allocations.current
        for replica in self.supervisor.live():
            current = allocations.get(replica.job_id)
            if current is None or current.allocation.generation != replica.generation:
                reason = "allocation deleted" if current is None else "generation changed"
                self.supervisor.stop(replica, reason)
        for job_id in list(self._launched):
            if job_id not in allocations:
                del self._launched[job_id]
        if self._scan_orphans:
            statuses, _ = await self.store.list_replica_statuses()
            for entry in statuses:
                self.orphans.adopt_if_orphan(entry)
            self._scan_orphans = False
        nodes = {entry.value.name: entry.value for entry in (await self.store.list_nodes())[0]}
        if not self._closing:
            await self.registration.restore(nodes)
        if self._closing or self.registration.fenced():
            # Fenced (lease lost or unconfirmed past the watchdog's deadline) or shutting
            # down: the cluster may already count this node as gone, so nothing new starts
            # until it is registered again.
            self._waiting = not self._closing
            self._prune()
            return
        waiting = False
        for job_id, current in list(allocations.items()):
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
        self, job_id: str, current: Current, nodes: Mapping[str, pb.Node]
    ) -> bool:
        """Start this node's replicas of the job's current generation if the barrier allows.

        Returns:
            True when nothing is left to do for this generation, False to retry soon.
        """
        generation = current.allocation.generation
        if any(r.job_id == job_id and r.generation < generation for r in self.supervisor.live()):
            return False  # our own old replicas are still stopping
        entries, _ = await self.store.list_replica_statuses(job_id)
        blocking = barrier.blockers(entries, generation, nodes)
        if blocking:
            for entry in blocking:
                self.orphans.adopt_if_orphan(entry)
            blockers = [barrier.describe(entry) for entry in blocking]
            self._log.debug("barrier_waiting", job_id=job_id, blockers=blockers)
            return False
        statuses = {entry.value.rank: entry for entry in entries}
        for rank in local_ranks(current.allocation, self.node_name):
            seen = statuses.get(rank)
            if seen is not None and seen.value.generation >= generation:
                # Started before (by an earlier launcher process): never start twice.
                self._launched[job_id] = generation
                self.orphans.adopt_if_orphan(seen)
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
                master_port=self.ports.choose(job_id, current.allocation, self.supervisor.alive),
                free_slots=self.supervisor.free_slots(self.inventory.slots),
            )
        except PlacementError as error:
            self._log.info("launch_waiting", job_id=job_id, reason=str(error))
            return False
        return await self._launch(job_id, current, job.value.spec, plans, statuses)

    async def _launch(
        self,
        job_id: str,
        current: Current,
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
        launch = await self.specs.admit(job_id, generation, spec, agent_addrs)
        if launch.refusal:  # nothing of it is created; its replicas exit 127 with the reason
            self._log.warning("job_refused", job_id=job_id, reason=launch.refusal)
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
        ops, expect = barrier.claim(
            self.store.keys, job_id, current.mod_revision, [r.status() for r in replicas], statuses
        )
        try:
            revision = await self.store.txn(ops, expect=expect)
        except Conflict as error:
            self._log.info("launch_raced", job_id=job_id, key=error.key.decode())
            return False
        # From here to the spawns nothing awaits: a claimed status always gets its process.
        self._launched[job_id] = generation
        if current.allocation.nodes[0] == self.node_name:
            self.ports.hold(job_id, generation, plans[0].master_port)
        for plan, replica in zip(plans, replicas, strict=True):
            replica.status_revision = revision
            self.supervisor.run(replica, functools.partial(self.specs.launch_spec, launch, plan))
        self._log.info(
            "replicas_launching",
            job_id=job_id,
            generation=generation,
            ranks=[p.rank for p in plans],
            master=f"{plans[0].master_addr}:{plans[0].master_port}",
            agents=agent_addrs,
        )
        return True

    def _live(self, job_id: str) -> bool:
        """Whether the job is allocated (as last seen) or runs here: its files must stay."""
        return job_id in self.allocations.current or self.supervisor.alive(job_id)

    def _prune(self) -> None:
        """Forget the oldest reported exits beyond `replica_history`, and stale port records."""
        self.supervisor.prune(self.config.replica_history)
        self.ports.prune(self.supervisor.alive)

    # -- queries (servicer) --------------------------------------------------------------------

    def replicas(self, job_id: str = "") -> list[Replica]:
        """Replicas this node runs or ran recently, newest generation first."""
        return self.supervisor.replicas(job_id)

    def find(self, job_id: str, rank: int, min_generation: int = 0) -> Replica | None:
        """The newest replica of (job, rank) here, or the oldest of at least `min_generation`."""
        return self.supervisor.find(job_id, rank, min_generation)


def _id(member: pb.Member) -> str:
    return member.id
