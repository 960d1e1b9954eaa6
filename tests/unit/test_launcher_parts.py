"""The launcher's pure parts alone: the generation barrier, MASTER_PORT choice, /proc checks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pollux.launcher import barrier, proc
from pollux.launcher.placement import master_ports
from pollux.launcher.ports import PROBES, MasterPorts
from pollux.launcher.replica import PLANNED_STOP
from pollux.launcher.statuses import exit_outcome
from pollux.service.keys import Keys
from pollux.service.store import Entry, Expect, Put
from pollux.v1 import types_pb2 as pb

EXITED, RUNNING = pb.REPLICA_PHASE_EXITED, pb.REPLICA_PHASE_RUNNING
RANGE = (29500, 29599)


def entry(
    node: str, rank: int, generation: int, phase: pb.ReplicaPhase, revision: int = 5
) -> Entry[pb.ReplicaStatus]:
    status = pb.ReplicaStatus(job_id="j", node=node, rank=rank, generation=generation, phase=phase)
    return Entry(status, revision, create_revision=revision)


def test_only_an_older_generation_not_exited_on_a_registered_node_blocks() -> None:
    statuses = [
        entry("n1", 0, 1, RUNNING),  # blocks
        entry("n2", 1, 1, RUNNING),  # its node is gone: does not block
        entry("n1", 2, 1, EXITED),  # exited
        entry("n1", 3, 2, RUNNING),  # the new generation itself
    ]
    blocking = barrier.blockers(statuses, 2, {"n1"})
    assert [barrier.describe(e) for e in blocking] == ["n1/0@1"]
    assert barrier.blockers(statuses, 1, {"n1", "n2"}) == []


def test_the_claim_requires_the_allocation_and_every_status_key_unchanged() -> None:
    keys = Keys("/t")
    starting = [
        pb.ReplicaStatus(job_id="j", rank=0, generation=2),
        pb.ReplicaStatus(job_id="j", rank=1, generation=2),
    ]
    seen = {0: entry("n1", 0, 1, EXITED, revision=17)}
    ops, expect = barrier.claim(keys, "j", 9, starting, seen)
    assert expect == [
        Expect(keys.allocation("j"), 9),
        Expect(keys.replica("j", 0), 17),
        Expect(keys.replica("j", 1), 0),  # never written: must still not exist
    ]
    assert ops == [Put(keys.replica("j", s.rank), s.SerializeToString()) for s in starting]


def allocation(*nodes: str, generation: int = 1) -> pb.Allocation:
    return pb.Allocation(nodes=list(nodes), generation=generation)


def test_a_local_job_probes_past_busy_and_held_ports() -> None:
    derived = list(master_ports("j", 1, RANGE))[:3]
    busy = {derived[0]}
    ports = MasterPorts("n1", RANGE, free=lambda port: port not in busy)
    ports.hold("other", 4, derived[1])
    chosen = ports.choose("j", allocation("n1", "n1"), alive=lambda job: job == "other")
    assert chosen == derived[2]
    # Once the other job is gone its port is free to take again.
    assert ports.choose("j", allocation("n1"), alive=lambda _: False) == derived[1]


def test_a_multi_node_job_keeps_the_derived_port_even_when_busy() -> None:
    derived = next(master_ports("j", 3, RANGE))
    ports = MasterPorts("n1", RANGE, free=lambda _: False)
    assert ports.choose("j", allocation("n1", "n2", generation=3), alive=lambda _: True) == derived
    # Not rank 0's node: nothing is probed.
    assert ports.choose("j", allocation("n2", "n1", generation=3), alive=lambda _: True) == derived


def test_with_no_free_port_in_reach_the_derived_one_is_used() -> None:
    probed: list[int] = []

    def free(port: int) -> bool:
        probed.append(port)
        return False

    derived = next(master_ports("j", 1, RANGE))
    assert MasterPorts("n1", RANGE, free=free).choose("j", allocation("n1"), lambda _: False) == (
        derived
    )
    assert len(probed) == PROBES


def test_held_ports_of_generations_no_longer_running_are_forgotten() -> None:
    derived = list(master_ports("j", 1, RANGE))[:3]
    ports = MasterPorts("n1", RANGE, free=lambda _: True)
    ports.hold("a", 1, derived[0])
    ports.hold("b", 1, derived[1])
    assert ports.choose("j", allocation("n1"), alive=lambda _: True) == derived[2]
    ports.prune(lambda job, generation: job == "b")
    assert ports.choose("j", allocation("n1"), alive=lambda _: True) == derived[0]


def test_a_pid_is_a_replica_only_while_its_environment_names_the_job_and_generation(
    tmp_path: Path,
) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "environ").write_bytes(
        b"PATH=/bin\0POLLUX_JOB_ID=j\0POLLUX_ALLOCATION_GEN=3\0"
    )
    assert proc.is_replica(42, "j", 3, proc=tmp_path)
    assert not proc.is_replica(42, "j", 4, proc=tmp_path)  # the pid was reused
    assert not proc.is_replica(42, "k", 3, proc=tmp_path)
    assert not proc.is_replica(43, "j", 3, proc=tmp_path)  # gone


def test_this_process_exists_and_a_reaped_pid_does_not() -> None:
    assert proc.exists(os.getpid())
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    assert not proc.exists(pid)


@pytest.mark.parametrize(
    ("code", "outcome"),
    [(0, "success"), (PLANNED_STOP, "planned_stop"), (1, "failure"), (-9, "failure")],
)
def test_exit_codes_read_as_the_scheduler_reads_them(code: int, outcome: str) -> None:
    assert exit_outcome(code) == outcome
