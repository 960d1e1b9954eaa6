"""Rank 0's batch-source poller: at most once per interval, never failing training."""

import pytest

pytest.importorskip("torch")

from pollux.train import BatchConfig, InvalidValueError
from pollux.train.poller import ConfigPoller


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class Source:
    """A batch source whose answers (configs, None or exceptions) are scripted."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.calls = []

    def batch_config(self, *, num_nodes, num_replicas):
        self.calls.append((num_nodes, num_replicas))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


A, B = BatchConfig(16), BatchConfig(32, accum_steps=2)


def poller(source, rank=0, clock=None):
    return ConfigPoller(
        source, rank=rank, num_nodes=2, num_replicas=4, interval_s=5.0, clock=clock or Clock()
    )


def test_the_leader_polls_at_most_once_per_interval_for_its_shape():
    clock, source = Clock(), Source(A, B)
    p = poller(source, clock=clock)
    assert p.proposal() == A
    clock.now = 4.9
    assert p.proposal() == A  # not asked again yet
    clock.now = 5.0
    assert p.proposal() == B
    assert source.calls == [(2, 4), (2, 4)]


def test_a_failing_or_silent_source_keeps_the_latest_answer():
    clock, source = Clock(), Source(A, RuntimeError("agent down"), None)
    p = poller(source, clock=clock)
    assert p.proposal() == A
    for now in (5.0, 10.0):
        clock.now = now
        assert p.proposal() == A
    assert len(source.calls) == 3


def test_followers_and_a_trainer_without_source_never_poll():
    source = Source()
    assert poller(source, rank=1).proposal() is None
    assert poller(None).proposal() is None
    assert source.calls == []


def test_the_initial_config_is_a_fresh_answer_else_the_restored_one_shared_from_rank_0():
    shared = []

    def from_leader(value):
        shared.append(value)
        return value

    assert poller(Source(B)).initial(A, from_leader) == B
    assert poller(Source(RuntimeError("down"))).initial(A, from_leader) == A
    assert poller(None).initial(None, from_leader) is None
    assert shared == [B.as_dict(), A.as_dict(), None]  # every replica takes part, K > 1


def test_a_negative_interval_is_refused():
    with pytest.raises(InvalidValueError, match="config_poll_interval_s"):
        ConfigPoller(None, rank=0, num_nodes=1, num_replicas=1, interval_s=-1.0)
