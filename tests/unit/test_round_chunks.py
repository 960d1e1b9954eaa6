"""A round's writes go to etcd in transactions bounded by count and bytes; a job is never split."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pollux.scheduler.scheduler import Group, chunked
from pollux.service.store import Delete, Expect, Put


def group(job: int, size: int, with_delete: bool) -> Group:
    key = f"/j/{job}".encode()
    ops: list[Put | Delete] = [Put(key, b"x" * size)]
    if with_delete:
        ops.append(Delete(b"/a/" + key))
    return ops, [Expect(key, job)]


def weight(g: Group) -> int:
    return sum(len(op.key) + (len(op.value) if isinstance(op, Put) else 0) for op in g[0])


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
