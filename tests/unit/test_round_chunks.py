"""A round's writes go to etcd in transactions bounded by count and bytes; a job is never split."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pollux.scheduler.scheduler import JOBS_PER_TXN, Group, chunked, commit_batches
from pollux.service.store import MAX_TXN_BYTES, Delete, Expect, Fence, Put, txn_bytes


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
    batches = commit_batches(groups, fence)
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
    batches = commit_batches(groups, fence)
    assert all(txn_bytes(ops, expect, fence) <= MAX_TXN_BYTES for ops, expect in batches)
    assert len(batches[0][1]) < JOBS_PER_TXN  # bytes, not the count, closed the first one
