"""Per-principal bounds as pure logic: submit rate and queue, stream caps, feed routing, names."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pollux.scheduler.limits import LimitsConfig, SubmitLimits, TokenBucket
from pollux.scheduler.validation import validate_submit
from pollux.service import auth
from pollux.service.errors import InvalidArgument, ResourceExhausted
from pollux.service.feed import FeedOverflow, JobChange, JobFeed
from pollux.service.mirror import JobSummary, named
from pollux.service.streams import StreamGate
from pollux.v1 import types_pb2 as pb


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@given(
    rate=st.floats(0.1, 100.0),
    burst=st.integers(1, 50),
    gaps=st.lists(st.floats(0.0, 2.0), min_size=1, max_size=300),
)
def test_a_bucket_never_grants_more_than_its_burst_plus_its_rate(
    rate: float, burst: int, gaps: list[float]
) -> None:
    bucket = TokenBucket(rate, burst, float(burst), 0.0)
    now, granted = 0.0, 0
    for gap in gaps:
        now += gap
        wait = bucket.take(now)
        if wait == 0.0:
            granted += 1
        else:
            assert wait > 0.0
            assert bucket.tokens < 1.0
    assert granted <= burst + rate * now + 1e-6


def test_a_refused_submit_names_the_limit_and_takes_nothing() -> None:
    clock = Clock()
    limits = SubmitLimits(
        LimitsConfig(
            submits_per_s_per_user=1.0,
            submit_burst_per_user=5,
            submits_per_s_per_tenant=1.0,
            submit_burst_per_tenant=2,
        ),
        clock,
    )
    limits.take("alice", "vision")
    limits.take("alice", "vision")
    with pytest.raises(ResourceExhausted) as caught:
        limits.take("alice", "vision")
    assert "tenant 'vision'" in caught.value.message
    assert "limits.submits_per_s_per_tenant" in caught.value.message
    clock.now = 1.0  # one tenant token back; alice's own bucket lost nothing to the refusal
    limits.take("alice", "vision")
    assert limits._buckets[("user", "alice")].tokens == pytest.approx(3.0)
    limits.take("bob", "nlp")  # other tenants have buckets of their own


def test_the_queue_limits_name_user_then_tenant() -> None:
    limits = SubmitLimits(LimitsConfig(pending_jobs_per_user=2, pending_jobs_per_tenant=5), Clock())
    limits.check_queue("alice", "", 1, 4)
    with pytest.raises(ResourceExhausted) as caught:
        limits.check_queue("alice", "", 2, 2)
    assert "limits.pending_jobs_per_user = 2" in caught.value.message
    with pytest.raises(ResourceExhausted) as caught:
        limits.check_queue("alice", "", 0, 5)
    assert "the default tenant" in caught.value.message
    unlimited = SubmitLimits(
        LimitsConfig(pending_jobs_per_user=0, pending_jobs_per_tenant=0), Clock()
    )
    unlimited.check_queue("alice", "", 10**6, 10**6)


def test_limits_config_problems() -> None:
    assert LimitsConfig().problems() == []
    bad = LimitsConfig(streams_per_principal=-1, submits_per_s_per_user=2, submit_burst_per_user=0)
    assert bad.problems() == [
        "streams_per_principal: must be >= 0 (0 = no limit)",
        "submit_burst_per_user: must be >= 1 while submits_per_s_per_user limits submits",
    ]


def test_the_stream_gate_caps_each_principal_and_the_total() -> None:
    gate = StreamGate(2, 3)
    alice, bob = auth.Principal("alice", auth.USER), auth.Principal("bob", auth.USER)
    with gate.admit(alice, "WatchJobs"), gate.admit(alice, "StreamLogs"):
        with pytest.raises(ResourceExhausted) as caught, gate.admit(alice, "WatchJobs"):
            pass
        assert "streams_per_principal = 2" in caught.value.message
        with gate.admit(bob, "WatchJobs"):
            assert gate.open == 3
            with pytest.raises(ResourceExhausted) as caught, gate.admit(bob, "WatchJobs"):
                pass
            assert "streams_per_replica = 3" in caught.value.message
    assert gate.open == 0
    assert gate.held(alice) == 0


def test_the_local_caller_of_a_plaintext_service_counts_only_against_the_total() -> None:
    gate = StreamGate(1, 3)
    with gate.admit(auth.LOCAL, "WatchJobs"), gate.admit(auth.LOCAL, "WatchJobs"):
        assert gate.open == 2


def change(owner: str, key: bytes, revision: int) -> JobChange:
    return JobChange(key, pb.Job(id=key.decode(), owner=owner), revision)


async def test_the_feed_delivers_by_owner_by_key_and_to_all() -> None:
    feed = JobFeed(limit=10)
    with (
        feed.subscribe() as everything,
        feed.subscribe(owner="alice") as alices,
        feed.subscribe(key=b"j-2") as one,
    ):
        assert feed.subscriptions == 3
        feed.publish(change("alice", b"j-1", 5))
        feed.publish(change("bob", b"j-2", 6))
        assert [(await everything.next()).revision for _ in range(2)] == [5, 6]
        assert (await alices.next()).key == b"j-1"
        assert (await one.next()).owner == "bob"
        waiting = asyncio.ensure_future(alices.next())
        await asyncio.sleep(0)
        assert not waiting.done(), "bob's change never reaches alice's subscription"
        waiting.cancel()
    assert feed.subscriptions == 0


async def test_a_slow_subscription_overflows_instead_of_growing() -> None:
    feed = JobFeed(limit=3)
    with feed.subscribe() as slow:
        for revision in range(5):
            feed.publish(change("alice", b"j-1", revision))
        with pytest.raises(FeedOverflow):
            await slow.next()


ID_HEX = st.text("0123456789abcdef", min_size=10, max_size=10)


@given(job_hex=ID_HEX, cut=st.integers(0, 10), prefixed=st.booleans())
def test_no_accepted_name_can_be_read_as_an_id_or_id_prefix(
    job_hex: str, cut: int, prefixed: bool
) -> None:
    """Every name a reference would match as an id first is refused; others pass this rule."""
    text = ("j-" if prefixed else "") + job_hex[:cut]
    if not text or not text[0].isalpha():
        return  # not a valid name anyway (names start with a letter)
    job_id = f"j-{job_hex}"
    as_id = named([JobSummary((0, job_id), pb.JOB_STATE_PENDING, "other", ())], text, None)
    spec = pb.JobSpec(name=text, command=["true"], batch=pb.BatchLimits(initial_batch_size=1))
    if as_id:
        with pytest.raises(InvalidArgument) as caught:
            validate_submit(spec, "r-1", True)
        assert "reads as a job id" in str(caught.value)


@pytest.mark.parametrize("name", ["train", "j-run", "job-1", "abcdefabcdef", "deadbeef-2"])
def test_ordinary_names_are_accepted(name: str) -> None:
    spec = pb.JobSpec(name=name, command=["true"], batch=pb.BatchLimits(initial_batch_size=1))
    validate_submit(spec, f"r-{uuid.uuid4().hex[:6]}", True)
