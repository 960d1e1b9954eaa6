"""Placement: which ranks a node runs, local ranks, master address/port, slots, environment."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest

from pollux.launcher.config import LauncherConfig
from pollux.launcher.placement import (
    PlacementError,
    ReplicaPlan,
    contract_env,
    local_ranks,
    master_address,
    master_ports,
    plan_replicas,
    replica_env,
)
from pollux.service.config import validate
from pollux.v1 import types_pb2 as pb

NODES = {
    "n1": pb.Node(name="n1", address="10.0.0.1:7000", gpus=4),
    "n2": pb.Node(name="n2", address="10.0.0.2:7000", gpus=4),
    "n3": pb.Node(name="n3", address="n3.cluster:7000", gpus=4, labels={"host": "192.168.0.3"}),
}


def allocation(*nodes: str, generation: int = 1) -> pb.Allocation:
    return pb.Allocation(nodes=list(nodes), generation=generation)


def plan(**fields: object) -> ReplicaPlan:
    base: dict[str, object] = {
        "rank": 0,
        "local_rank": 0,
        "local_world_size": 1,
        "world_size": 1,
        "num_nodes": 1,
        "master_addr": "10.0.0.1",
        "master_port": 29500,
        "slot": 0,
    }
    base.update(fields)
    return ReplicaPlan(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("nodes", "node", "free", "want"),
    [
        pytest.param(
            ("n1",),
            "n1",
            [0, 1, 2, 3],
            [plan()],
            id="a one-replica job runs rank 0 on the lowest free slot",
        ),
        pytest.param(
            ("n1", "n1", "n1"),
            "n1",
            [0, 1, 2, 3],
            [
                plan(rank=r, local_rank=r, local_world_size=3, world_size=3, slot=r)
                for r in range(3)
            ],
            id="a single-node job's local ranks equal its ranks",
        ),
        pytest.param(
            ("n1", "n2", "n1", "n2"),
            "n2",
            [0, 1, 2, 3],
            [
                plan(rank=1, local_rank=0, local_world_size=2, world_size=4, num_nodes=2, slot=0),
                plan(rank=3, local_rank=1, local_world_size=2, world_size=4, num_nodes=2, slot=1),
            ],
            id="interleaved nodes: local ranks are dense in rank order",
        ),
        pytest.param(
            ("n2", "n1", "n1"),
            "n1",
            [1, 3],
            [
                plan(
                    rank=1,
                    local_rank=0,
                    local_world_size=2,
                    world_size=3,
                    num_nodes=2,
                    master_addr="10.0.0.2",
                    slot=1,
                ),
                plan(
                    rank=2,
                    local_rank=1,
                    local_world_size=2,
                    world_size=3,
                    num_nodes=2,
                    master_addr="10.0.0.2",
                    slot=3,
                ),
            ],
            id="busy slots are skipped and the master is rank 0's node",
        ),
        pytest.param(
            ("n3", "n1"),
            "n1",
            [0],
            [plan(rank=1, world_size=2, num_nodes=2, master_addr="192.168.0.3")],
            id="a host label overrides the address host as MASTER_ADDR",
        ),
        pytest.param(("n1", "n2"), "n3", [0, 1], [], id="a node without ranks runs nothing"),
        pytest.param((), "n1", [0], [], id="an empty allocation runs nothing"),
    ],
)
def test_plan_replicas(
    nodes: Sequence[str], node: str, free: list[int], want: list[ReplicaPlan]
) -> None:
    assert (
        plan_replicas(allocation(*nodes), node, NODES, master_port=29500, free_slots=free) == want
    )


@pytest.mark.parametrize(
    ("nodes", "free", "match"),
    [
        pytest.param(
            ("ghost", "n1"), [0, 1], "'ghost' is not registered", id="unknown rank 0 node"
        ),
        pytest.param(
            ("n1", "n1", "n1"),
            [0, 1],
            "3 replicas need slots but 2 are free",
            id="too few free slots (a stopping replica holds one)",
        ),
    ],
)
def test_plan_replicas_waits(nodes: Sequence[str], free: list[int], match: str) -> None:
    with pytest.raises(PlacementError, match=match):
        plan_replicas(allocation(*nodes), "n1", NODES, master_port=29500, free_slots=free)


def test_local_ranks() -> None:
    assert local_ranks(allocation("a", "b", "a", "c", "a"), "a") == [0, 2, 4]
    assert local_ranks(allocation("a", "b"), "z") == []


@pytest.mark.parametrize(
    ("node", "want"),
    [
        pytest.param(pb.Node(address="10.1.2.3:50051"), "10.1.2.3", id="ipv4"),
        pytest.param(pb.Node(address="gpu-7.example:50051"), "gpu-7.example", id="hostname"),
        pytest.param(pb.Node(address="[fd00::7]:50051"), "fd00::7", id="bracketed ipv6"),
        pytest.param(
            pb.Node(address="127.0.0.1:1", labels={"host": "10.9.9.9"}),
            "10.9.9.9",
            id="host label wins",
        ),
    ],
)
def test_master_address(node: pb.Node, want: str) -> None:
    assert master_address(node) == want


def test_master_ports_are_derived_then_successive_wrapping_in_the_range() -> None:
    first = list(master_ports("j-1", 3, (29500, 29599)))
    assert first == list(master_ports("j-1", 3, (29500, 29599)))  # every node agrees
    assert sorted(first) == list(range(29500, 29600))
    assert [(b - a) % 100 for a, b in itertools.pairwise(first)] == [1] * 99
    derived = {next(master_ports("j-1", g, (29500, 29999))) for g in range(1, 50)}
    assert len(derived) > 40  # each generation moves to its own port
    assert list(master_ports("j", 1, (40000, 40000))) == [40000]


def test_contract_env_on_gpus_and_cpu_slots() -> None:
    p = plan(rank=3, local_rank=1, local_world_size=2, world_size=4, num_nodes=2, slot=5)
    env = contract_env(
        p,
        job_id="j-1",
        generation=7,
        agent_addrs=["a:1", "b:2"],
        checkpoint_dir="/ck/j-1",
        cuda=True,
    )
    assert env == {
        "POLLUX_JOB_ID": "j-1",
        "POLLUX_AGENT_ADDR": "a:1,b:2",
        "POLLUX_CHECKPOINT_DIR": "/ck/j-1",
        "POLLUX_ALLOCATION_GEN": "7",
        "POLLUX_NUM_NODES": "2",
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "CUDA_VISIBLE_DEVICES": "5",
    }
    cpu = contract_env(
        p, job_id="j-1", generation=7, agent_addrs=[], checkpoint_dir="/c", cuda=False
    )
    assert cpu["CUDA_VISIBLE_DEVICES"] == ""
    assert cpu["POLLUX_AGENT_ADDR"] == ""


def test_replica_env_layers_launcher_then_job_then_contract() -> None:
    inherited = {"PATH": "/bin", "POLLUX_LAUNCHER_GPUS": "2", "RANK": "99", "HOME": "/h"}
    spec = pb.JobSpec(env={"RANK": "5", "LR": "0.1", "HOME": "/job"})
    env = replica_env(inherited, spec, {"RANK": "0", "POLLUX_JOB_ID": "j"})
    assert env == {"PATH": "/bin", "HOME": "/job", "LR": "0.1", "RANK": "0", "POLLUX_JOB_ID": "j"}


def test_config_reports_every_problem_at_once() -> None:
    config = LauncherConfig(
        node_name="bad name!",
        gpus=0,
        labels=("ok=1", "nokey"),
        lease_ttl_s=1,
        port_range=(80, 90),
        log_ring_lines=0,
    )
    problems = validate(config)
    for prefix in (
        "node_name:",
        "gpus:",
        "labels:",
        "lease_ttl_s:",
        "port_range:",
        "log_ring_lines:",
    ):
        assert any(p.startswith(prefix) for p in problems), (prefix, problems)
    assert LauncherConfig(node_name="n1", labels=("host=10.0.0.1",)).label_map() == {
        "host": "10.0.0.1"
    }
    assert validate(LauncherConfig(node_name="n1")) == []


def test_log_batches_bound_message_size() -> None:
    from pollux.launcher.replica import batches

    lines = ["x" * 400] * 10
    got = list(batches(lines, max_bytes=1000))
    assert [len(b) for b in got] == [2, 2, 2, 2, 2]
    assert list(batches(["y" * 5000], max_bytes=1000)) == [["y" * 5000]]  # a long line alone
    assert list(batches([])) == []


def test_a_failed_replicas_output_tail_is_its_last_lines_on_one_bounded_line() -> None:
    from pollux.launcher.replica import TAIL_CHARS, output_tail

    assert output_tail(["Traceback (most recent call last):", "", "  ValueError: bad lr  "]) == (
        "Traceback (most recent call last): | ValueError: bad lr"
    )
    assert output_tail([]) == ""
    long = output_tail(["x" * 2000, "the error"])
    assert len(long) == TAIL_CHARS
    assert long.startswith("…")
    assert long.endswith("| the error")
