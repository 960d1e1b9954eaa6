"""MASTER_PORT per job generation: the derived port, probed for a free one where that is safe.

Only the launcher of rank 0's node can see whether the port is free, and only when the job is
entirely local can it move to another port without telling anyone, so that is the one case
that probes: a multi-node job keeps the derived port (every node derives the same one,
placement.master_ports), and a busy port shows up as a failed replica that the scheduler
re-allocates — with a new generation, hence a new port.
"""

from __future__ import annotations

import itertools
import socket
from collections.abc import Callable, Sequence

import structlog

from pollux.launcher.placement import master_ports
from pollux.v1 import types_pb2 as pb

PROBES = 64
"""Most MASTER_PORT candidates probed before giving up and using the derived one."""


def port_free(port: int) -> bool:
    """Whether nothing listens on (or holds) `port` on any local address right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


class MasterPorts:
    """The ports this node's rank-0 replicas listen on, by (job, generation).

    Args:
        node_name: This node.
        port_range: The configured [low, high] of MASTER_PORT.
        free: Whether a port is free now (`port_free`; tests pass their own).
    """

    def __init__(
        self,
        node_name: str,
        port_range: Sequence[int],
        *,
        free: Callable[[int], bool] = port_free,
    ) -> None:
        self.node_name = node_name
        self.port_range = port_range
        self._free = free
        self._held: dict[tuple[str, int], int] = {}
        self._log = structlog.get_logger(__name__).bind(node_id=node_name)

    def choose(self, job_id: str, allocation: pb.Allocation, alive: Callable[[str], bool]) -> int:
        """MASTER_PORT for the allocation's generation; `alive` says which jobs run here."""
        candidates = master_ports(job_id, allocation.generation, self.port_range)
        derived = next(candidates)
        if allocation.nodes[0] != self.node_name:
            return derived
        taken = {
            port for (other, _), port in self._held.items() if other != job_id and alive(other)
        }
        if set(allocation.nodes) != {self.node_name}:
            if derived in taken or not self._free(derived):
                self._log.warning("master_port_busy", job_id=job_id, port=derived)
            return derived
        for port in itertools.islice(itertools.chain([derived], candidates), PROBES):
            if port not in taken and self._free(port):
                return port
        self._log.warning("master_port_busy", job_id=job_id, port=derived)
        return derived

    def hold(self, job_id: str, generation: int, port: int) -> None:
        """Record the port a generation's rank 0 was started with on this node."""
        self._held[(job_id, generation)] = port

    def prune(self, running: Callable[[str, int], bool]) -> None:
        """Forget the ports of generations no longer running here (`running(job, gen)`)."""
        for job_id, generation in list(self._held):
            if not running(job_id, generation):
                del self._held[(job_id, generation)]
