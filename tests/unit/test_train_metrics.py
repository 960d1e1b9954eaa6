"""Step-time aggregation and the metrics reporter: retries, bounded queue, never blocking."""

import threading
import time

import pytest

pytest.importorskip("torch")

from pollux.train import (
    GradStats,
    InMemorySink,
    InvalidValueError,
    MetricsReporter,
    StepProfile,
)

KEY = (1, 2, 32, 3)


def test_profile_means_follow_the_published_fit_inputs():
    profile = StepProfile()
    profile.record(KEY, [0.10, 0.12], optim_time=0.30, sync_time=0.16)
    profile.record(KEY, [0.08, 0.10], optim_time=0.26, sync_time=0.12)
    (obs,) = profile.observations()
    assert obs.key == KEY
    assert obs.count == 2
    assert obs.optim_step_time_s == pytest.approx(0.28)
    # Accumulation micro-batches plus each optimizer step's compute part (time − sync).
    assert obs.accum_step_time_s == pytest.approx((0.40 + 0.56 - 0.28) / 6)


def test_without_accumulation_the_accum_time_is_the_step_minus_its_sync():
    profile = StepProfile()
    profile.record((1, 1, 8, 1), [], optim_time=0.2, sync_time=0.0)
    profile.record((2, 4, 8, 1), [], optim_time=0.5, sync_time=0.2)
    single, multi = profile.observations()
    assert single.accum_step_time_s == pytest.approx(0.2)
    assert multi.accum_step_time_s == pytest.approx(0.3)


def test_delta_resets_and_the_total_survives_a_round_trip():
    profile = StepProfile()
    profile.record(KEY, [0.1, 0.1], 0.3)
    assert len(profile.take_delta()) == 1
    assert profile.take_delta() == ()
    restored = StepProfile()
    restored.load_state_dict(profile.state_dict())
    assert restored.observations() == profile.observations()
    assert restored.take_delta() == ()  # already reported before the checkpoint


@pytest.mark.parametrize(
    ("key", "times", "match"),
    [
        ((2, 1, 8, 1), ([], 0.1), "not a valid shape"),
        ((1, 1, 0, 1), ([], 0.1), "not a valid shape"),
        ((1, 1, 8, 2), ([-0.1], 0.1), "finite"),
        ((1, 1, 8, 1), ([], float("nan")), "finite"),
    ],
    ids=["more-nodes-than-replicas", "empty-batch", "negative-time", "nan-time"],
)
def test_invalid_observations_are_rejected(key, times, match):
    with pytest.raises(InvalidValueError, match=match):
        StepProfile().record(key, *times)


class FlakySink:
    """Fails its first `failures` sends, then stores batches."""

    def __init__(self, failures):
        self.failures = failures
        self.attempts = []
        self.delivered = []

    def send(self, batch):
        self.attempts.append(batch.seq)
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("agent unreachable")
        self.delivered.append(batch)


def reporter(sink, **kwargs):
    return MetricsReporter(sink, job_id="job-1", generation=3, rank=0, **kwargs)


def test_a_failing_sink_keeps_the_data_and_delivers_it_later_in_order():
    sink = FlakySink(failures=2)
    rep = reporter(sink, max_backoff_s=0.01)
    rep.profile.record(KEY, [0.1, 0.1], 0.3)
    assert not rep.flush()  # first attempt fails: kept
    rep.profile.record(KEY, [0.2, 0.2], 0.4)
    rep.set_grad_stats(GradStats(sqr=1.0, var=2.0))
    assert not rep.flush()  # second failure
    assert rep.pending == 2
    assert rep.flush()
    assert rep.failures == 2
    assert [b.seq for b in sink.delivered] == sorted(b.seq for b in sink.delivered)
    first, second = sink.delivered
    assert sink.attempts.count(first.seq) == 3  # the same batch (same seq) was retried
    assert second.seq == first.seq + 1
    assert first.observations[0].optim_step_time_s == pytest.approx(0.3)
    assert second.grad == GradStats(sqr=1.0, var=2.0)
    assert (first.job_id, first.generation, first.rank) == ("job-1", 3, 0)


def test_the_queue_is_bounded_and_drops_the_oldest_batch():
    sink = FlakySink(failures=10**6)
    rep = reporter(sink, max_pending=3)
    seqs = []
    for i in range(5):
        rep.profile.record(KEY, [0.1, 0.1], 0.3 + i)
        rep.flush()
        seqs.append(rep._seq)
    assert rep.dropped == 2
    assert rep.pending == 3
    sink.failures = 0
    assert rep.flush()
    assert [b.seq for b in sink.delivered] == seqs[2:]  # the two oldest were dropped


def test_nothing_new_means_no_batch():
    sink = InMemorySink()
    rep = reporter(sink)
    rep.flush()
    assert sink.batches == []
    rep.set_grad_stats(GradStats(sqr=1.0, var=1.0))
    rep.flush()
    rep.flush()
    assert len(sink.batches) == 1  # unchanged statistics are not resent


def test_a_hanging_sink_never_blocks_the_training_thread():
    release = threading.Event()
    entered = threading.Event()

    class HangingSink:
        def send(self, batch):
            entered.set()
            release.wait(10)

    rep = reporter(HangingSink(), interval_s=0.01)
    rep.start()
    try:
        rep.profile.record(KEY, [0.1, 0.1], 0.3)
        assert entered.wait(5)  # the reporter thread is stuck inside send()
        started = time.perf_counter()
        for _ in range(1000):
            rep.profile.record(KEY, [0.1, 0.1], 0.3)
            rep.set_grad_stats(GradStats(sqr=1.0, var=1.0))
        assert time.perf_counter() - started < 0.5
    finally:
        release.set()
        rep.close(timeout_s=5)


def test_the_thread_reports_periodically_and_close_flushes():
    sink = InMemorySink()
    rep = reporter(sink, interval_s=0.02)
    rep.start()
    rep.profile.record(KEY, [0.1, 0.1], 0.3)
    deadline = time.monotonic() + 5
    while not sink.batches and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sink.batches
    rep.profile.record(KEY, [0.1, 0.1], 0.5)
    rep.close()
    merged = sink.observations()[KEY]
    assert merged.count == 2
    assert merged.optim_step_time_s == pytest.approx(0.4)
