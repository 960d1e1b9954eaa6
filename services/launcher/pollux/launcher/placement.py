"""Which replicas of an allocation this node runs, and the environment each one gets.

Pure functions over `pollux.v1` messages, so every rule of the environment contract
(docs/architecture.md §7) is tested with scenario tables and no processes. Replica ``i`` runs
on ``nodes[i]``; ``LOCAL_RANK`` is a rank's position among its node's ranks, so local ranks are
dense per node whatever order the scheduler listed the nodes in.

Rank 0's node hosts the rendezvous: MASTER_ADDR is its ``labels["host"]`` when set (a data
network apart from the control network), else the host of its registered address. MASTER_PORT
is derived from ``sha256("<job_id>/<generation>")`` into the configured range, so every
launcher of the job computes it with no coordination and a new generation moves to another
port (the old one's sockets may linger in TIME_WAIT). `master_ports` yields it and then the
following ones, wrapping; ports.py chooses among them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from pollux.launcher.fence import FENCE_VAR
from pollux.v1 import types_pb2 as pb


class PlacementError(Exception):
    """This node cannot start its replicas yet; the reason says what is missing."""


@dataclass(frozen=True, slots=True)
class ReplicaPlan:
    """One replica this node must run.

    Attributes:
        rank: Global rank (index in the allocation).
        local_rank: Position among this node's ranks.
        local_world_size: Number of this node's ranks.
        world_size: Number of replicas of the allocation.
        num_nodes: Number of distinct nodes of the allocation.
        master_addr: Host of rank 0's node.
        master_port: Rendezvous port on rank 0's node.
        slot: Device index (GPU, or CPU slot) the replica holds on this node.
    """

    rank: int
    local_rank: int
    local_world_size: int
    world_size: int
    num_nodes: int
    master_addr: str
    master_port: int
    slot: int


def local_ranks(allocation: pb.Allocation, node_name: str) -> list[int]:
    """Global ranks of `allocation` that run on `node_name`, ascending."""
    return [rank for rank, node in enumerate(allocation.nodes) if node == node_name]


def master_address(node: pb.Node) -> str:
    """The host other replicas reach rank 0's node at (see module docstring)."""
    host = node.labels.get("host", "")
    if host:
        return host
    address = node.address
    if address.startswith("["):  # [v6-address]:port
        return address[1 : address.index("]")] if "]" in address else address
    return address.rpartition(":")[0] or address


def master_ports(job_id: str, generation: int, port_range: Sequence[int]) -> Iterator[int]:
    """Candidate MASTER_PORTs for (job, generation): the derived port first, then the rest."""
    low, high = port_range[0], port_range[1]
    size = high - low + 1
    digest = hashlib.sha256(f"{job_id}/{generation}".encode()).digest()
    first = int.from_bytes(digest[:8], "big") % size
    for offset in range(size):
        yield low + (first + offset) % size


def plan_replicas(
    allocation: pb.Allocation,
    node_name: str,
    nodes: Mapping[str, pb.Node],
    *,
    master_port: int,
    free_slots: Sequence[int],
) -> list[ReplicaPlan]:
    """The replicas of `allocation` that `node_name` runs, each with a free slot.

    Slots are handed out lowest first in rank order, so a node's replicas of one job sit on
    adjacent devices when they can.

    Raises:
        PlacementError: Rank 0's node is not registered (no MASTER_ADDR yet), or fewer slots
            are free than this node has ranks (a stopping replica still holds one).
    """
    ranks = local_ranks(allocation, node_name)
    if not ranks:
        return []
    head = nodes.get(allocation.nodes[0])
    if head is None:
        raise PlacementError(f"rank 0's node {allocation.nodes[0]!r} is not registered")
    slots = sorted(free_slots)
    if len(slots) < len(ranks):
        raise PlacementError(f"{len(ranks)} replicas need slots but {len(slots)} are free")
    address = master_address(head)
    num_nodes = len(set(allocation.nodes))
    return [
        ReplicaPlan(
            rank=rank,
            local_rank=local_rank,
            local_world_size=len(ranks),
            world_size=len(allocation.nodes),
            num_nodes=num_nodes,
            master_addr=address,
            master_port=master_port,
            slot=slots[local_rank],
        )
        for local_rank, rank in enumerate(ranks)
    ]


def contract_env(
    plan: ReplicaPlan,
    *,
    job_id: str,
    generation: int,
    agent_addrs: Sequence[str],
    checkpoint_dir: str,
    cuda: bool,
    fence_token: str = "",
    credential: str = "",
    tls_ca: str = "",
) -> dict[str, str]:
    """The environment contract of docs/architecture.md §7 for one replica.

    `fence_token` marks the process as this node's replica (fence.py), so the node's watchdog
    and a restarted launcher can find it and its children. On a cluster with TLS, `credential`
    is the job's credential for its agent calls (pollux.service.auth) and `tls_ca` the CA file
    the replica checks the agent's certificate against.

    `agent_addrs` is in preference order (the job's rendezvous owner first), so a replica
    whose agent dies retries the next one, which answers from etcd. CPU slots get an empty
    CUDA_VISIBLE_DEVICES, which hides any GPU so a CPU-slot replica never grabs one.
    """
    env = {
        "POLLUX_JOB_ID": job_id,
        "POLLUX_AGENT_ADDR": ",".join(agent_addrs),
        "POLLUX_CHECKPOINT_DIR": checkpoint_dir,
        "POLLUX_ALLOCATION_GEN": str(generation),
        "POLLUX_NUM_NODES": str(plan.num_nodes),
        "RANK": str(plan.rank),
        "WORLD_SIZE": str(plan.world_size),
        "LOCAL_RANK": str(plan.local_rank),
        "LOCAL_WORLD_SIZE": str(plan.local_world_size),
        "MASTER_ADDR": plan.master_addr,
        "MASTER_PORT": str(plan.master_port),
        "CUDA_VISIBLE_DEVICES": str(plan.slot) if cuda else "",
    }
    if fence_token:
        env[FENCE_VAR] = fence_token
    if credential:
        env["POLLUX_JOB_CREDENTIAL"] = credential
    if tls_ca:
        env["POLLUX_TLS_CA"] = tls_ca
    return env


def replica_env(
    inherited: Mapping[str, str], spec: pb.JobSpec, contract: Mapping[str, str]
) -> dict[str, str]:
    """A replica's whole environment: the launcher's, then the job's, then the contract.

    The launcher's own POLLUX_* variables are dropped (that prefix is reserved for the
    contract and would leak launcher settings), and the contract is applied last so a job's
    env can never override its rank or world. Secret values (`spec.secret_env`) reach the
    replica like any other; only the API hides them.
    """
    env = {k: v for k, v in inherited.items() if not k.startswith("POLLUX_")}
    env.update(spec.env)
    env.update(spec.secret_env)
    env.update(contract)
    return env
