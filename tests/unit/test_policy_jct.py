"""The jct mode of the Pollux policy: its maths, its guards, and jobs that declare nothing."""

import itertools
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pollux.policy import PolicyInputError, TenantSpec
from pollux.policy.goodput_policy import PolluxParams, PolluxPolicy
from pollux.policy.jct import (
    JctParams,
    expected_factor,
    hesrpt_weights,
    inputs,
    ramping,
    ranks,
    remaining_seconds,
    resize_history,
    restart_penalties,
    reversal_odds,
)
from pollux.policy.problem import Problem
from pollux.policy.tenant_shares import METHODS
from pollux.policy.valuation import restart_factor
from tests.unit.policy_builders import job, nodes, random_state, state

RNG = np.random.default_rng(0)
FAITHFUL = PolluxPolicy()
JCT = PolluxPolicy(jct=JctParams())

remaining_times = st.lists(
    st.one_of(st.none(), st.floats(0.0, 1e6, allow_nan=False)), min_size=1, max_size=30
)


def as_array(values: list[float | None]) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


# -- ranks and weights ---------------------------------------------------------------------------


@given(remaining_times)
def test_ranks_lie_between_one_and_m_and_sum_to_the_triangle_number(values):
    rank = ranks(as_array(values))
    m = len(values)
    assert np.all(rank >= 1.0)
    assert np.all(rank <= m)
    # Every pair of jobs splits one unit of "behind": the ranks add up to m (m + 1) / 2.
    assert rank.sum() == pytest.approx(m * (m + 1) / 2)


@given(
    st.lists(
        st.one_of(st.none(), st.sampled_from([0.0, 1.0, 5.0, 1e6]), st.floats(0.0, 1e6)),
        min_size=1,
        max_size=40,
    )
)
def test_ranks_equal_the_pairwise_count_exactly(values):
    t = as_array(values)
    known = ~np.isnan(t)
    k = t[known]
    expected = np.full(t.size, (t.size + 1) / 2.0)
    above = (k[None, :] > k[:, None]).sum(axis=1)
    ties = (k[None, :] == k[:, None]).sum(axis=1) - 1
    expected[known] = 1.0 + above + 0.5 * ties + 0.5 * int((~known).sum())
    assert np.array_equal(ranks(t), expected)  # bit for bit: sorting changed no decision


@given(remaining_times)
def test_less_remaining_time_never_ranks_lower(values):
    t = as_array(values)
    rank = ranks(t)
    known = np.nonzero(~np.isnan(t))[0]
    for a in known:
        for b in known:
            if t[a] < t[b]:
                assert rank[a] > rank[b]
            elif t[a] == t[b]:
                assert rank[a] == rank[b]
    assert np.all(rank[np.isnan(t)] == (len(values) + 1) / 2)


def test_ranks_of_distinct_remaining_times_count_the_jobs_behind():
    assert ranks(np.array([300.0, 100.0, 200.0])).tolist() == [1.0, 3.0, 2.0]
    assert ranks(np.array([100.0, 100.0])).tolist() == [1.5, 1.5]
    # One unknown: half a job behind each declared one, and the middle rank itself.
    assert ranks(np.array([100.0, np.nan, 200.0])).tolist() == [2.5, 2.0, 1.5]


@given(st.integers(1, 40), st.floats(0.0, 0.9))
def test_hesrpt_weights_average_to_the_unknown_jobs_weight(m, q):
    c = 1.0 / (1.0 - q)
    rank = np.arange(1, m + 1, dtype=np.float64)
    declared = hesrpt_weights(rank, np.ones(m, dtype=bool), q)
    unknown = hesrpt_weights(rank, np.zeros(m, dtype=bool), q)
    assert np.all(np.diff(declared) >= -1e-9), "a smaller job must never weigh less"
    # The shares heSRPT gives (declared / Σ) telescope to 1 ...
    assert declared.sum() == pytest.approx(m**c, rel=1e-9)
    # ... and a job of unknown size gets their mean.
    assert unknown == pytest.approx(np.full(m, declared.mean()), rel=1e-9)


def test_square_root_speedups_give_weights_two_n_minus_one():
    rank = np.array([1.0, 2.0, 3.0, 4.0])
    assert hesrpt_weights(rank, np.ones(4, dtype=bool), 0.5).tolist() == [1.0, 3.0, 5.0, 7.0]
    # No scaling at all (q = 0): heSRPT splits evenly, every weight is 1.
    assert hesrpt_weights(rank, np.ones(4, dtype=bool), 0.0).tolist() == [1.0] * 4


def test_log_utility_with_hesrpt_weights_gives_hesrpt_shares_for_power_law_speedups():
    # maximise Σ w_j log θ_j^q subject to Σ θ = 1  ⇒  θ_j = w_j / Σ w, for every q; heSRPT's
    # optimum for speedup θ^q is θ_i = (i/m)^c − ((i−1)/m)^c, c = 1/(1 − q).
    m, q = 6, 0.5
    c = 1 / (1 - q)
    rank = np.arange(1, m + 1, dtype=np.float64)
    w = hesrpt_weights(rank, np.ones(m, dtype=bool), q)
    hesrpt = (rank / m) ** c - ((rank - 1) / m) ** c
    assert w / w.sum() == pytest.approx(hesrpt)


# -- the inputs the mode derives from a state ------------------------------------------------------


def declared(name: str, work: float | None, **kwargs: object) -> object:
    return replace(job(name, **kwargs), remaining_work=work)  # type: ignore[arg-type]


def test_remaining_time_is_work_times_m0_over_fair_share_goodput():
    st_ = state([declared("a", 1000.0), declared("b", None), declared("c", 1000.0, noise=None)],
                nodes(2))  # fmt: skip
    problem = Problem(st_, PolluxParams(p=0.0))
    t = remaining_seconds(problem)
    base = problem.speedups.base[0]
    assert t[0] == pytest.approx(1000.0 * 128 / base)
    assert np.isnan(t[1]), "no declared size: unknown"
    assert np.isnan(t[2]), "no goodput model yet: unknown"


def test_restart_factor_uses_the_shorter_of_remaining_and_holding_time_and_the_own_pause():
    jobs = [
        replace(job("long", age=3600.0, restarts=5), restart_pause_s=60.0),
        job("short", age=3600.0, restarts=0),
        job("free", age=3600.0),
    ]
    problem = Problem(state(jobs, nodes(2)), PolluxParams(p=0.0))
    remaining = np.array([1e6, 100.0, np.nan])
    pause = np.array([60.0, 30.0, 0.0])
    got = restart_penalties(problem, remaining, pause)
    hold = 3600.0 / 6
    assert got[0] == pytest.approx(hold / (hold + 60.0))
    assert got[1] == pytest.approx(100.0 / 130.0), "about to finish: worth little to move"
    assert got[2] == 1.0, "no pause, no penalty"
    age_rule = restart_penalties(problem, remaining, pause, "age")
    assert age_rule[0] == pytest.approx(restart_factor(3600.0, 5, 60.0))


def test_a_measured_pause_replaces_the_default_delay():
    jobs = [replace(job("a"), restart_pause_s=200.0), job("b")]
    problem = Problem(state(jobs, nodes(2)), PolluxParams(p=0.0, restart_delay=30.0))
    assert inputs(problem, JctParams()).pause_s.tolist() == [200.0, 30.0]


def test_params_are_validated():
    with pytest.raises(PolicyInputError, match="speedup_exponent"):
        JctParams(speedup_exponent=1.0)
    with pytest.raises(PolicyInputError, match=r"jct\.p"):
        JctParams(p=float("nan"))
    with pytest.raises(PolicyInputError, match="restart"):
        JctParams(restart="never")  # type: ignore[arg-type]


# -- faithful mode is untouched --------------------------------------------------------------------


def with_declarations(st_, rng):
    jobs = tuple(
        replace(
            j,
            remaining_work=float(rng.uniform(0, 1e5)) if rng.random() < 0.7 else None,
            restart_pause_s=float(rng.uniform(15, 250)) if rng.random() < 0.5 else None,
        )
        for j in st_.jobs
    )
    return replace(st_, jobs=jobs)


@pytest.mark.parametrize("seed", range(12))
def test_faithful_decisions_ignore_declared_sizes_and_pauses(seed):
    plain = random_state(np.random.default_rng(seed))
    rich = with_declarations(plain, np.random.default_rng(1000 + seed))
    a = FAITHFUL.allocate(plain, None, np.random.default_rng(seed))
    b = FAITHFUL.allocate(rich, None, np.random.default_rng(seed))
    assert a.allocations == b.allocations
    assert a.explain == b.explain
    assert a.objective == b.objective or (np.isnan(a.objective) and np.isnan(b.objective))


# -- the jct mode's decisions ----------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_jct_mode_keeps_every_constraint(seed):
    st_ = with_declarations(random_state(np.random.default_rng(seed)), np.random.default_rng(seed))
    decision = JCT.allocate(st_, None, np.random.default_rng(seed))
    assert set(decision.allocations) == {j.name for j in st_.jobs}
    used = Counter(n for alloc in decision.allocations.values() for n in alloc)
    capacity = {n.name: n.gpus for n in st_.nodes}
    assert all(used[n] <= capacity[n] for n in used)
    for j in st_.jobs:
        assert len(decision.allocations[j.name]) <= j.max_replicas


def test_the_job_with_less_work_left_gets_more_gpus():
    jobs = [declared("big", 1e6, max_replicas=32), declared("small", 1e3, max_replicas=32)]
    decision = JCT.allocate(state(jobs, nodes(4)), None, RNG)
    big, small = (len(decision.allocations[n]) for n in ("big", "small"))
    assert small > big >= 1, "smaller remaining work first, but nobody starves"
    # Faithful Pollux cannot tell them apart.
    faithful = FAITHFUL.allocate(state(jobs, nodes(4)), None, RNG)
    assert len(faithful.allocations["big"]) == len(faithful.allocations["small"])


def test_every_job_still_gets_a_gpu_when_there_are_enough():
    jobs = [declared(f"j{i}", 10.0**i, max_replicas=16) for i in range(8)]
    decision = JCT.allocate(state(jobs, nodes(4)), None, RNG)
    assert all(len(a) >= 1 for a in decision.allocations.values())
    assert sum(len(a) for a in decision.allocations.values()) == 16


def test_jobs_that_declare_nothing_are_scheduled_alike():
    jobs = [job(f"j{i}", max_replicas=16) for i in range(5)]
    problem = Problem(state(jobs, nodes(4)), PolluxParams(p=0.0))
    derived = inputs(problem, JctParams())
    assert np.all(np.isnan(derived.remaining_s))
    assert derived.weight.tolist() == [1.0] * 5
    decision = JCT.allocate(state(jobs, nodes(4)), None, RNG)
    sizes = sorted(len(a) for a in decision.allocations.values())
    assert sizes[0] >= 1
    assert sizes[-1] - sizes[0] <= 1


def test_a_job_about_to_finish_is_not_moved_for_a_small_gain():
    # It holds 2 GPUs; 2 more are free. Faithful Pollux grows it; with 20 s left the restart
    # would cost more than it saves.
    running = ("n0", "n0")
    old = job("done-soon", on=running, age=7200.0, max_replicas=4)
    jobs = [replace(old, remaining_work=1.0)]
    decision = JCT.allocate(state(jobs, nodes(1)), None, RNG)
    assert decision.allocations["done-soon"] == running
    assert FAITHFUL.allocate(state([old], nodes(1)), None, RNG).allocations["done-soon"] != running


@pytest.mark.parametrize("shares", list(METHODS))
def test_jct_mode_runs_with_tenants(shares):
    policy = PolluxPolicy(jct=JctParams(), tenant_shares=METHODS[shares])
    jobs = [replace(declared(f"j{i}", 10.0 ** (i % 4)), tenant="a" if i % 2 else "b")
            for i in range(6)]  # fmt: skip
    st_ = replace(state(jobs, nodes(4)), tenants=(TenantSpec("a", 8), TenantSpec("b", 8)))
    decision = policy.allocate(st_, None, RNG)
    held = Counter()
    for j in jobs:
        held[j.tenant] += len(decision.allocations[j.name])
    assert held["a"] >= 1
    assert held["b"] >= 1
    assert sum(held.values()) <= 16


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000))
def test_jct_mode_is_deterministic(seed):
    st_ = with_declarations(
        random_state(np.random.default_rng(seed), 4), np.random.default_rng(seed)
    )
    a = JCT.allocate(st_, None, np.random.default_rng(0))
    b = JCT.allocate(st_, None, np.random.default_rng(1))
    assert a.allocations == b.allocations


# -- the "expected" restart rule ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("mean", "left", "delay"),
    [(600.0, np.nan, 30.0), (600.0, 300.0, 30.0), (60.0, 1e5, 30.0), (1e4, 100.0, 250.0)],
)
def test_the_expected_factor_is_the_mean_over_an_exponential_lifetime(mean, left, delay):
    lifetimes = np.random.default_rng(1).exponential(mean, 400_000)
    if not np.isnan(left):
        lifetimes = np.minimum(lifetimes, left)
    sampled = float(np.mean(lifetimes / (lifetimes + delay)))
    assert expected_factor(mean, left, delay) == pytest.approx(sampled, abs=3e-3)


@settings(max_examples=300, deadline=None)
@given(
    mean=st.floats(1e-3, 1e8),
    left=st.one_of(st.just(float("nan")), st.floats(0.0, 1e8)),
    delay=st.floats(0.0, 1e4),
)
def test_the_expected_factor_is_a_fraction_below_the_factor_at_the_mean(mean, left, delay):
    got = expected_factor(mean, left, delay)
    assert 0.0 <= got <= 1.0
    if delay == 0:
        assert got == 1.0
        return
    assert got <= mean / (mean + delay) + 1e-9, "concave in the lifetime (Jensen)"
    if not np.isnan(left):
        assert got <= left / (left + delay) + 1e-9, "never outlasts the job"
        assert expected_factor(mean, left * 2 + 1.0, delay) >= got - 1e-9


def test_the_expected_rule_prices_moves_above_the_holding_rule():
    jobs = [job("a", age=3600.0, restarts=5), job("b", age=3600.0, restarts=0)]
    problem = Problem(state(jobs, nodes(2)), PolluxParams(p=0.0))
    remaining, pause = np.array([1e6, np.nan]), np.array([30.0, 30.0])
    holding = restart_penalties(problem, remaining, pause, "holding")
    expected = restart_penalties(problem, remaining, pause, "expected")
    assert expected[0] == pytest.approx(expected_factor(600.0, 1e6, 30.0))
    assert expected[1] == pytest.approx(expected_factor(3600.0, np.nan, 30.0))
    assert np.all(expected < holding)


# -- moves priced with their reversal --------------------------------------------------------------


def test_the_resize_record_counts_direction_changes_only():
    record = (0, 0, 0)
    for old, new in ((2, 4), (4, 8), (8, 8), (8, 4), (4, 0), (0, 6)):
        record = resize_history(*record, old, new)
    # grow, grow, (a move: nothing), shrink (undoes), suspend (same way), resume (undoes)
    assert record == (5, 2, 1)


@given(st.lists(st.integers(0, 16), min_size=1, max_size=40))
def test_reversal_odds_stay_strictly_between_zero_and_one(sizes):
    record = (0, 0, 0)
    for old, new in itertools.pairwise(sizes):
        record = resize_history(*record, old, new)
    resizes, reversals, _last = record
    assert 0 <= reversals <= max(resizes - 1, 0)
    odds = reversal_odds(replace(job("a"), resizes=resizes, reversals=reversals))
    assert 0.0 < odds < 1.0


def test_laplaces_rule_gives_a_half_without_a_record_and_follows_the_record():
    def odds(resizes: int, reversals: int) -> float:
        return reversal_odds(replace(job("a"), resizes=resizes, reversals=reversals))

    assert odds(0, 0) == odds(1, 0) == 0.5
    assert odds(11, 10) == pytest.approx(11 / 12), "a job that undoes every move"
    assert odds(11, 0) == pytest.approx(1 / 12), "a job that only grows"


def test_a_move_is_priced_with_the_pause_of_its_likely_reversal_but_a_first_start_is_not():
    back_and_forth = replace(job("flip", on=("n0",) * 2, age=3600.0, restarts=5), resizes=5,
                             reversals=4, last_resize=-1)  # fmt: skip
    growing = replace(job("grow", on=("n1",) * 2, age=3600.0, restarts=5), resizes=5,
                      last_resize=1)  # fmt: skip
    fresh = job("new", age=3600.0)
    problem = Problem(state([back_and_forth, growing, fresh], nodes(4)), PolluxParams(p=0.0))
    remaining, pause = np.full(3, np.nan), np.full(3, 30.0)
    plain = restart_penalties(problem, remaining, pause, "holding")
    priced = restart_penalties(problem, remaining, pause, "holding", reversals=True)
    hold = 3600.0 / 6
    assert priced[0] == pytest.approx(hold / (hold + 30.0 * (1 + 5 / 6)))
    assert priced[1] == pytest.approx(hold / (hold + 30.0 * (1 + 1 / 6)))
    assert priced[2] == plain[2], "nothing to undo before a first allocation"
    assert np.all(priced <= plain)
    assert JctParams().reversals, "the mode's default"


def test_the_ramp_rule_prices_a_growing_job_by_its_holding_time_and_others_by_the_expectation():
    back_and_forth = replace(job("flip", on=("n0",) * 2, age=3600.0, restarts=5), resizes=5,
                             reversals=4, last_resize=-1)  # fmt: skip
    growing = replace(job("grow", on=("n1",) * 2, age=3600.0, restarts=5), resizes=5,
                      last_resize=1)  # fmt: skip
    shrunk_once = replace(job("shrunk", on=("n2",), age=3600.0, restarts=1), resizes=1,
                          last_resize=-1)  # fmt: skip
    fresh = job("new", age=3600.0)
    jobs = [back_and_forth, growing, shrunk_once, fresh]
    assert [ramping(j) for j in jobs] == [False, True, False, True]
    problem = Problem(state(jobs, nodes(4)), PolluxParams(p=0.0))
    remaining, pause = np.full(4, np.nan), np.full(4, 30.0)
    ramp = restart_penalties(problem, remaining, pause, "ramp", reversals=True)
    holding = restart_penalties(problem, remaining, pause, "holding", reversals=True)
    expected = restart_penalties(problem, remaining, pause, "expected", reversals=True)
    assert list(ramp) == [expected[0], holding[1], expected[2], holding[3]]
    assert JctParams(restart="ramp").restart == "ramp"
