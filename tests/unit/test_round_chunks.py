"""A round's writes go to etcd in transactions bounded by count and bytes; a job is never split."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from pollux.scheduler.cycle import plan_round, takes_gpus
from pollux.scheduler.scheduler import JOBS_PER_TXN, Group, chunked, commit_batches, merged
from pollux.service.store import (
    MAX_TXN_BYTES,
    Delete,
    Entry,
    Expect,
    Fence,
    Put,
    Snapshot,
    txn_bytes,
)
from pollux.v1 import types_pb2 as pb
from tests.unit.policy_builders import Fixed


def group(job: int, size: int, with_delete: bool) -> Group:
    key = f"/j/{job}".encode()
    ops: list[Put | Delete] = [Put(key, b"x" * size)]
    if with_delete:
        ops.append(Delete(b"/a/" + key))
    return ops, [Expect(key, job)]


def weight(g: Group) -> int:
    return txn_bytes(*g)


@given(
    sizes=st.lists(st.tuples(st.integers(0, 5000), st.booleans()), max_size=60),
    max_jobs=st.integers(1, 10),
    max_bytes=st.integers(1, 20_000),
)
def test_chunks_keep_every_job_whole_in_order_within_both_bounds(sizes, max_jobs, max_bytes):
    groups = [group(i, size, d) for i, (size, d) in enumerate(sizes)]
    chunks = chunked(groups, max_jobs=max_jobs, max_bytes=max_bytes)
    assert [g for chunk in chunks for g in chunk] == groups
    for chunk in chunks:
        assert 1 <= len(chunk) <= max_jobs
        assert len(chunk) == 1 or sum(weight(g) for g in chunk) <= max_bytes


def test_a_job_larger_than_the_byte_bound_travels_alone():
    groups = [group(0, 10, False), group(1, 5000, False), group(2, 10, False)]
    chunks = chunked(groups, max_jobs=40, max_bytes=1000)
    assert [len(c) for c in chunks] == [1, 1, 1]


@given(
    sizes=st.lists(st.integers(0, 200_000), min_size=1, max_size=80),
    deletes=st.booleans(),
)
def test_every_commit_transaction_fits_the_store_bound_with_its_fence(sizes, deletes):
    # Job records of up to ~200 KB: value bytes alone under 1 MiB could still make a request
    # over it once keys, compares and the fence are counted.
    fence = Fence(b"/pollux/v1/leader/694d8d3b2a1c", 7)
    groups = [group(i, size, deletes) for i, size in enumerate(sizes)]
    batches = [merged(chunk) for chunk in commit_batches(groups, fence)]
    assert [op for ops, _ in batches for op in ops] == [op for ops, _ in groups for op in ops]
    assert [e for _, exp in batches for e in exp] == [e for _, exp in groups for e in exp]
    for ops, expect in batches:
        assert len(expect) <= JOBS_PER_TXN
        assert txn_bytes(ops, expect, fence) <= MAX_TXN_BYTES


def test_a_round_of_full_sized_jobs_fills_transactions_to_the_byte():
    fence = Fence(b"/pollux/v1/leader/694d8d3b2a1c", 7)
    groups = [group(i, 26_200, True) for i in range(100)]
    # 40 of them hold under 1 MiB of keys and values, but their request is over 1 MiB.
    payload = sum(len(op.key) + len(getattr(op, "value", b"")) for g in groups[:40] for op in g[0])
    assert payload <= MAX_TXN_BYTES < sum(weight(g) for g in groups[:40])
    batches = [merged(chunk) for chunk in commit_batches(groups, fence)]
    assert all(txn_bytes(ops, expect, fence) <= MAX_TXN_BYTES for ops, expect in batches)
    assert len(batches[0][1]) < JOBS_PER_TXN  # bytes, not the count, closed the first one


def test_a_rounds_jobs_that_give_gpus_up_are_written_before_jobs_that_take_gpus() -> None:
    def alloc(*nodes: str) -> pb.Allocation:
        return pb.Allocation(nodes=list(nodes))

    assert not takes_gpus(alloc("a", "a", "b"), alloc("a"))  # shrink
    assert not takes_gpus(alloc("a", "b"), alloc())  # release
    assert not takes_gpus(alloc("a", "b"), alloc("b", "a"))  # same GPUs
    assert takes_gpus(alloc(), alloc("a"))  # start
    assert takes_gpus(alloc("a", "a"), alloc("a", "b"))  # moves one replica to b


def test_a_round_plans_the_job_that_frees_gpus_before_the_job_that_takes_them() -> None:
    def job(job_id: str, created: float, *nodes: str) -> Entry[pb.Job]:
        record = pb.Job(id=job_id, state=pb.JOB_STATE_ALLOCATED if nodes else pb.JOB_STATE_PENDING)
        record.create_time.FromNanoseconds(int(created * 1e9))
        record.allocation.nodes.extend(nodes)
        record.allocation.generation = 1 if nodes else 0
        return Entry(record, mod_revision=3, create_revision=1)

    # The older job takes the GPUs the newer one gives up: written the other way round.
    snapshot = Snapshot(
        revision=9,
        jobs={"taker": job("taker", 1.0), "giver": job("giver", 2.0, "n1", "n1")},
        nodes={"n1": pb.Node(name="n1", gpus=2)},
        agents=[],
        models={},
        replicas=[],
    )
    plan = plan_round(
        snapshot,
        Fixed({"taker": ("n1", "n1"), "giver": ()}),
        None,
        np.random.default_rng(0),
        now=10.0,
        round_number=2,
        scheduler_id="s",
    )
    assert [job.id for job, _ in plan.jobs] == ["giver", "taker"]
