"""This node's registration: its record in etcd under a lease the launcher keeps alive.

Held through a `LeasedRegistration` (pollux.service.session: the one lease rule every lease
holder shares). A lost lease (etcd answered that it expired, or no keep-alive succeeded for a
whole ttl) means the rest of the cluster already counts this node as gone and may re-place its
replicas, so the launcher stops its replicas (self-fencing, `on_lost`) and registers again
under a new lease. Every confirmed keep-alive moves the watchdog's deadline (watchdog.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, MutableMapping

import prometheus_client
import structlog

from pollux.launcher.config import LauncherConfig
from pollux.launcher.gpus import Inventory
from pollux.launcher.watchdog import WatchdogLink
from pollux.service.config import ConfigError
from pollux.service.session import LeasedRegistration
from pollux.service.store import Store
from pollux.v1 import types_pb2 as pb

LEASE_LOSSES = prometheus_client.Counter(
    "pollux_launcher_lease_losses_total", "Times the node registration lease was lost."
)


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


class NodeRegistration:
    """The node's record, registered under a kept-alive lease.

    Args:
        config: The launcher configuration (node name, labels, lease ttl).
        store: The cluster state.
        inventory: The node's GPUs or CPU slots.
        advertise: host:port of the launcher's gRPC service (Node.address).
        watchdog: Told of every confirmed keep-alive; its expiry fences the node too.
        on_lost: Called with the reason when the lease is lost, before registering again.
    """

    def __init__(
        self,
        config: LauncherConfig,
        store: Store,
        inventory: Inventory,
        *,
        advertise: str,
        watchdog: WatchdogLink,
        on_lost: Callable[[str], None],
    ) -> None:
        self.config = config
        self.store = store
        self.inventory = inventory
        self.node_name = config.node_name
        self.advertise = advertise
        self.watchdog = watchdog
        self._on_lost = on_lost
        self._lease = LeasedRegistration(
            store,
            config.lease_ttl_s,
            self._register,
            holder="node",
            on_lost=self._lost,
            on_confirmed=self._confirmed,
        )
        self._log = structlog.get_logger(__name__).bind(node_id=self.node_name)

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

    @property
    def lease_id(self) -> int:
        """The lease the node is registered under now, or 0 while it is not (fenced)."""
        return self._lease.lease_id

    def fenced(self) -> bool:
        """Whether the cluster may count this node as gone: no lease, or the watchdog expired."""
        return not self.lease_id or self.watchdog.expired()

    async def claim_name(self) -> None:
        """Wait out a registration of this name by another address, or fail.

        Two launchers with one node name (cloned hosts) would each count the other's replicas
        as orphans and stop them. A registration from the same address is this launcher's
        previous process and is simply replaced; one from another address may be a crashed
        launcher whose lease has not expired yet, so it gets one ttl to disappear.

        Raises:
            NodeNameInUseError: The other registration outlived a ttl.
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

    async def start(self) -> None:
        """Register (errors propagate) and keep the registration in the background."""
        await self._lease.start()

    async def restore(self, nodes: MutableMapping[str, pb.Node]) -> None:
        """Put the node's key back if it vanished though the lease lives (deleted by hand?).

        `nodes` is the registered nodes as just listed; the node is added to it.
        """
        lease = self.lease_id
        if self.node_name not in nodes and lease:
            node = self.node()
            await self.store.register_node(node, lease=lease)
            nodes[self.node_name] = node

    async def close(self) -> None:
        """Stop renewing and revoke the lease: the node leaves the cluster at once."""
        await self._lease.close(revoke=True)

    async def _register(self, lease: int) -> None:
        await self.store.register_node(self.node(), lease=lease)

    def _confirmed(self, sent_at: float) -> None:
        self.watchdog.confirmed(sent_at, self.config.lease_ttl_s)

    def _lost(self, reason: str) -> None:
        LEASE_LOSSES.inc()
        self._on_lost(reason)
