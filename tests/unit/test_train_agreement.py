"""The replicas' agreement: exact float encoding, and a summed encoding is the agreed value."""

import pytest

pytest.importorskip("torch")  # pollux.train imports torch; agreement itself needs no process group

from hypothesis import given
from hypothesis import strategies as st

from pollux.train import BatchConfig, InvalidValueError
from pollux.train.agreement import Agreement, Agreements, AgreementSchedule, combine
from pollux.train.schedule import MAX_AGREEMENT_STEPS

configs = st.builds(
    BatchConfig,
    local_bsz=st.integers(1, 2**31),
    accum_steps=st.integers(1, 2**16),
    lr_scale=st.none() | st.floats(min_value=1e-6, max_value=1e6),
)
followers = st.builds(Agreement, stop=st.booleans())
leaders = st.builds(
    Agreement,
    stop=st.booleans(),
    config=st.none() | configs,
    next_in=st.integers(1, MAX_AGREEMENT_STEPS),
)


def summed(encodings):
    """What the SUM all-reduce computes, element by element, in float64."""
    return [sum(column) for column in zip(*encodings, strict=True)]


@given(
    st.builds(
        Agreement, stop=st.booleans(), config=st.none() | configs, next_in=st.integers(0, 2**40)
    )
)
def test_encode_decode_round_trips_exactly(agreement):
    values = agreement.encode()
    assert len(values) == Agreement.FIELDS
    assert all(isinstance(v, float) for v in values)
    assert Agreement.decode(values) == agreement


@given(leaders, st.lists(followers, max_size=15), st.integers(0, 15))
def test_the_sum_of_the_replicas_encodings_decodes_to_their_combination(leader, others, at):
    proposals = [*others[:at], leader, *others[at:]]
    agreed = Agreement.decode(summed(p.encode() for p in proposals))
    assert agreed == combine(proposals)


@given(st.lists(followers, min_size=1, max_size=16))
def test_followers_alone_agree_only_on_stopping(proposals):
    agreed = combine(proposals)
    assert agreed.stop == any(p.stop for p in proposals)
    assert agreed.config is None
    assert agreed.next_in == 0
    assert Agreement.decode(summed(p.encode() for p in proposals)) == agreed


def test_any_replica_asking_to_stop_stops_all_and_the_leader_sets_the_config():
    config = BatchConfig(local_bsz=32, accum_steps=2, lr_scale=1.5)
    leader = Agreement(config=config, next_in=7)
    agreed = combine([leader, Agreement(), Agreement(stop=True), Agreement(stop=True)])
    assert agreed == Agreement(stop=True, config=config, next_in=7)
    assert combine([leader, Agreement()]).stop is False


def test_no_lr_scale_is_sent_as_zero_and_read_back_as_none():
    values = Agreement(config=BatchConfig(local_bsz=8)).encode()
    assert values == [0.0, 1.0, 8.0, 1.0, 0.0, 0.0]
    assert Agreement.decode(values).config == BatchConfig(local_bsz=8, lr_scale=None)


def test_only_one_replica_may_lead_and_someone_must_propose():
    leader = Agreement(next_in=1)
    with pytest.raises(InvalidValueError, match="only the leader"):
        combine([leader, Agreement(config=BatchConfig(local_bsz=4))])
    with pytest.raises(InvalidValueError, match="at least one"):
        combine([])


def test_bad_values_are_refused():
    with pytest.raises(InvalidValueError, match="next_in"):
        Agreement(next_in=-1)
    with pytest.raises(InvalidValueError, match="6 floats"):
        Agreement.decode([0.0] * 7)


# -- the protocol of several replicas, with the collective simulated ---------------------------


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class SimulatedSum:
    """A SUM all-reduce over `n` simulated replicas: the result waits for every contribution."""

    def __init__(self, n):
        self.n = n
        self.contributions = []

    def start(self, values, tail):
        contribution = list(values) + ([] if tail is None else list(tail))
        self.contributions.append(contribution)
        pending = self

        class Pending:
            def result(self):
                assert len(pending.contributions) == pending.n, "a replica did not contribute"
                return summed(pending.contributions)

        return Pending()


def replicas(n, *, stop=(), proposal=None, clock=None, period_s=1.0):
    """`n` replicas' `Agreements` sharing one simulated all-reduce."""
    collective = SimulatedSum(n)
    return [
        Agreements(
            rank=rank,
            world_size=n,
            schedule=AgreementSchedule(period_s, clock or Clock()),
            stop_requested=lambda rank=rank: rank in stop,
            proposal=lambda: proposal,
            start_sum=collective.start,
        )
        for rank in range(n)
    ], collective


def test_replicas_agree_on_the_leaders_config_and_any_stop_and_sum_their_tails():
    config = BatchConfig(local_bsz=32, accum_steps=2)
    parts, _ = replicas(3, stop={2}, proposal=config)
    pending = [p.start([float(p.rank), 1.0]) for p in parts]
    outcomes = [p.settle(pending[p.rank]) for p in parts]
    for agreed, tail in outcomes:
        assert agreed is not None
        assert agreed.stop
        assert agreed.config == config  # followers never propose: only rank 0's counts
        assert tail == [0.0 + 1.0 + 2.0, 3.0]


def test_a_step_without_an_agreement_counts_down_to_the_next_one():
    clock = Clock()
    parts, _ = replicas(2, clock=clock, period_s=1.0)
    clock.now += 0.25  # a step of 0.25 s: the leader asks for the next agreement in 4 steps
    pending = [p.start() for p in parts]
    for p in parts:
        agreed, _ = p.settle(pending[p.rank])
        assert agreed is not None
        assert agreed.next_in == 4
        assert p.schedule.until == 4
    for p in parts:
        assert p.settle(None) == (None, [])
        assert p.schedule.until == 3  # every replica counts alike, without communication


def test_one_replica_agrees_with_itself_after_every_step():
    config = BatchConfig(local_bsz=8)
    (alone,), _ = replicas(1, stop={0}, proposal=config)
    agreed, tail = alone.settle(None)
    assert agreed == Agreement(stop=True, config=config)
    assert tail == []


def test_the_schedule_starts_with_an_agreement_and_refuses_a_negative_period():
    assert AgreementSchedule(1.0).until == 1
    with pytest.raises(InvalidValueError, match="agreement_period_s"):
        AgreementSchedule(-1.0)
