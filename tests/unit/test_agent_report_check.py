"""The one validation of a metrics report: fields, plausibility, job limits, replica budgets.

Also the bounded weight a valid report gets when it is merged (`profile.report_weights`).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pollux.agent.profile import MAX_REPORT_STEPS, fit_profile, merge_report, report_weights
from pollux.agent.report_check import (
    MAX_GRADIENT_STAT,
    MAX_REPORT_OBSERVATIONS,
    MAX_REPORT_SPAN_S,
    MAX_STEP_TIME_S,
    MIN_STEP_TIME_S,
    JobBounds,
    ReplicaBudgets,
    check_report,
    claimed_seconds,
)
from pollux.agent.timeline import point_of
from pollux.goodput import PerfParams, step_times
from pollux.user_metrics import metric_problems
from pollux.v1 import agent_service_pb2 as api
from pollux.v1 import types_pb2 as pb
from tests.unit.test_agent_profile import _with_work, obs

UNBOUNDED = JobBounds()
"""A job without replica or batch limits."""


def check(request: api.ReportMetricsRequest) -> list[tuple[str, str]]:
    """The problems of `request` that need nothing but the report."""
    return check_report(request, UNBOUNDED)


def report(
    *observations: pb.StepObservation,
    seq: int = 1,
    rank: int = 0,
    gradient: tuple[float, float] | None = None,
) -> api.ReportMetricsRequest:
    request = api.ReportMetricsRequest(
        job_id="j-1", generation=1, rank=rank, seq=seq, observations=observations
    )
    if gradient is not None:
        request.gradient.sqr, request.gradient.var = gradient
    return request


# -- refused: the report alone ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_", "want_field", "want_bound"),
    [
        (report(obs(optim_s=MAX_STEP_TIME_S * 2)), "observations[0].optim_step_time_s", "600"),
        (report(obs(accum_s=MAX_STEP_TIME_S + 1)), "observations[0].accum_step_time_s", "600"),
        (report(obs(optim_s=1.0, count=1000)), "observations", "900"),
        (report(obs(accum=10**6, accum_s=0.01, optim_s=0.01)), "observations", "900"),
        (report(obs(optim_s=1e-9, count=10**7)), "observations", "900"),
        (report(obs(replicas=2), rank=2), "rank", "num_replicas (2)"),
        (report(obs(), gradient=(1e31, 1.0)), "gradient.sqr", "1e+30"),
        (report(obs(), gradient=(1.0, math.ldexp(1, 1000))), "gradient.var", "1e+30"),
    ],
    ids=[
        "optimizer step over the maximum",
        "accumulation step over the maximum",
        "more training than one report covers",
        "absurd accumulation steps",
        "a million steps of nothing each (counted at the floor)",
        "rank outside its configuration",
        "huge gradient norm",
        "huge gradient variance",
    ],
)
def test_implausible_reports_are_refused_naming_the_field_and_the_bound(
    request_, want_field, want_bound
):
    problems = check(request_)
    assert [field for field, _ in problems] == [want_field]
    assert want_bound in problems[0][1]


def test_honest_reports_pass_every_bound():
    assert check(report(obs(count=50, optim_s=0.1), obs(2, 4, accum=4, count=3))) == []
    # A report's whole span may reach the bound, and a step may take up to the maximum.
    one_step = obs(accum_s=0.0, optim_s=MAX_STEP_TIME_S)
    assert check(report(one_step)) == []
    assert claimed_seconds([obs(optim_s=0.5, count=int(MAX_REPORT_SPAN_S / 0.5))]) == (
        MAX_REPORT_SPAN_S
    )
    assert check(report(obs(optim_s=0.5, count=int(MAX_REPORT_SPAN_S / 0.5)))) == []
    assert check(report(obs(), gradient=(MAX_GRADIENT_STAT, 0.0))) == []


def test_claimed_time_counts_accumulation_and_floors_each_step():
    assert claimed_seconds([obs(accum=4, accum_s=0.1, optim_s=0.2, count=10)]) == pytest.approx(
        10 * (0.2 + 3 * 0.1)
    )
    assert claimed_seconds([obs(accum_s=0.0, optim_s=1e-9, count=1000)]) == pytest.approx(
        1000 * MIN_STEP_TIME_S
    )


# -- refused: against the job ------------------------------------------------------------------


def test_reports_beyond_the_jobs_replica_limit_are_refused():
    problems = check_report(report(obs(2, 8), obs(1, 4)), JobBounds(max_replicas=4))
    assert problems == [("observations[0].num_replicas", "8 exceeds the job's max_replicas (4)")]
    assert check_report(report(obs(2, 8)), JobBounds(max_replicas=0)) == []


def test_batches_beyond_the_jobs_largest_batch_are_refused_but_rounding_up_is_not():
    # The trainer's initial split of M0 = 100 over 3 replicas runs ceil(100 / 3) = 34 each.
    assert check_report(report(obs(1, 3, local=34)), JobBounds(max_batch=100)) == []
    problems = check_report(
        report(obs(1, 3, local=35), obs(1, 2, local=64, accum=4)), JobBounds(max_batch=100)
    )
    assert [field for field, _ in problems] == [
        "observations[0].local_batch_size",
        "observations[1].local_batch_size",
    ]
    assert "max_batch_size 100" in problems[1][1]
    assert "512 samples per step" in problems[1][1]


def test_a_jobs_bounds_come_from_its_limits_and_unusable_limits_bound_no_batch():
    limits = pb.BatchLimits(initial_batch_size=128, max_batch_size=1024)
    assert JobBounds.of(limits, 4) == JobBounds(max_batch=1024, max_replicas=4)
    assert JobBounds.of(pb.BatchLimits(initial_batch_size=128), 0).max_batch == 128  # M0
    broken = pb.BatchLimits(initial_batch_size=128, max_batch_size=64)  # below M0
    assert JobBounds.of(broken, 0) == JobBounds(max_batch=None, max_replicas=0)


# -- refused: against the replica's earlier reports ------------------------------------------


def test_the_budget_is_checked_when_given_and_only_for_an_otherwise_valid_report():
    budgets = ReplicaBudgets(capacity_s=10)
    honest = report(obs(optim_s=1.0, count=5))  # claims 5 s
    assert check_report(honest, UNBOUNDED, budgets=budgets, now=0.0) == []
    budgets.charge(("j-1", 1, 0), 8.0, now=0.0)
    over = check_report(honest, UNBOUNDED, budgets=budgets, now=0.0)
    assert [field for field, _ in over] == ["observations"]
    assert "may claim at most 2 s more now" in over[0][1]
    assert check_report(honest, UNBOUNDED, budgets=None, now=0.0) == []  # a retry: no claim
    broken = report(obs(optim_s=1.0, count=5, local=0))
    assert [f for f, _ in check_report(broken, UNBOUNDED, budgets=budgets, now=0.0)] == [
        "observations[0].local_batch_size"
    ]


def test_a_replica_claims_at_most_its_wall_time_plus_the_backlog():
    budgets = ReplicaBudgets()
    key = ("j-1", 1, 0)
    assert budgets.check(key, MAX_REPORT_SPAN_S, now=0.0) == []
    budgets.charge(key, MAX_REPORT_SPAN_S - 10, now=0.0)
    problems = budgets.check(key, 11, now=0.0)
    assert [field for field, _ in problems] == ["observations"]
    assert "replica 1/0 may claim at most 10 s" in problems[0][1]
    assert budgets.check(key, 11, now=1.0) == []  # a second later, a second more
    assert budgets.available(key, now=10_000.0) == MAX_REPORT_SPAN_S  # never more than full
    assert budgets.available(("j-1", 1, 1), now=0.0) == MAX_REPORT_SPAN_S  # per replica


def test_a_clock_that_steps_back_refills_nothing_twice():
    budgets = ReplicaBudgets(capacity_s=100)
    key = ("j-1", 1, 0)
    budgets.charge(key, 100, now=50.0)
    budgets.charge(key, 0, now=10.0)  # the clock stepped back 40 s
    assert budgets.available(key, now=50.0) == 0
    assert budgets.available(key, now=60.0) == 10


def test_budgets_are_bounded_dropping_the_least_recent_replica():
    budgets = ReplicaBudgets(capacity_s=10, max_replicas=3)
    for rank in range(4):
        budgets.charge(("j-1", 1, rank), 10, now=0.0)
    assert len(budgets) == 3
    assert budgets.available(("j-1", 1, 0), now=0.0) == 10  # forgotten: starts full again
    assert budgets.available(("j-1", 1, 3), now=0.0) == 0


@settings(max_examples=200, deadline=None)
@given(
    start_lag=st.floats(0, 600),
    intervals=st.lists(
        st.tuples(st.floats(0.1, 30), st.floats(0, 1), st.floats(0, 640)), min_size=1, max_size=60
    ),
)
def test_an_honest_replica_is_never_refused(start_lag, intervals):
    """Claims at most the time trained, delivered late by up to the trainer's backlog."""
    budgets = ReplicaBudgets()
    key = ("j-1", 3, 0)
    cut = 0.0  # the replica trains from 0; the agent first hears of it start_lag later
    delivered = start_lag
    for length, busy, lag in intervals:
        cut += length
        delivered = max(delivered, cut + lag)  # reports arrive in order, late by <= lag
        claim = busy * length
        assert budgets.check(key, claim, delivered) == []
        budgets.charge(key, claim, delivered)


@settings(max_examples=200, deadline=None)
@given(
    claims=st.lists(st.tuples(st.floats(0, 2000), st.floats(0, 100)), min_size=1, max_size=50),
)
def test_no_sequence_of_reports_claims_more_than_wall_time_and_the_backlog(claims):
    budgets = ReplicaBudgets()
    key = ("j-1", 1, 0)
    now = accepted = 0.0
    for claim, wait in claims:
        now += wait
        if not budgets.check(key, claim, now):
            budgets.charge(key, claim, now)
            accepted += claim
        assert accepted <= now + MAX_REPORT_SPAN_S + 1e-6


# -- clipped: bounded weight --------------------------------------------------------------------


def test_weights_are_counts_within_the_cap_and_scaled_beyond_it():
    honest = [obs(count=50), obs(local=64, count=3)]
    assert report_weights(honest) == [50, 3]
    forged = [obs(count=10**6), obs(local=64, count=10**6), obs(local=128, count=1)]
    weights = report_weights(forged)
    assert weights == [MAX_REPORT_STEPS // 2 - 1, MAX_REPORT_STEPS // 2 - 1, 1]  # rounded down


@given(counts=st.lists(st.integers(1, 2**32 - 1), min_size=1, max_size=64))
def test_a_reports_weight_is_bounded_and_never_above_its_counts(counts):
    weights = report_weights([obs(local=i + 1, count=c) for i, c in enumerate(counts)])
    assert all(1 <= w <= c for w, c in zip(weights, counts, strict=True))
    assert sum(weights) <= MAX_REPORT_STEPS + len(counts)  # each rounded down, but at least 1


def mean_after(
    forged: pb.StepObservation, honest: pb.StepObservation, n: int
) -> pb.StepObservation:
    profile = merge_report(pb.ObservationProfile(), report(forged, seq=1)).profile
    for seq in range(2, n + 2):
        profile = merge_report(profile, report(honest, seq=seq)).profile
    (row,) = profile.observations
    return row


def test_a_forged_million_steps_is_outweighed_by_honest_reports():
    # Accepted: a million steps at the 100 µs floor claim 100 s. Its weight is clipped.
    forged = obs(accum_s=1e-4, optim_s=1e-4, count=10**6)
    assert check(report(forged)) == []
    honest = obs(accum_s=0.05, optim_s=0.1, count=50)
    row = mean_after(forged, honest, 200)
    assert row.count == MAX_REPORT_STEPS + 200 * 50
    assert row.optim_step_time_s == pytest.approx(0.1, rel=0.05)
    assert row.accum_step_time_s == pytest.approx(0.05, rel=0.05)
    # Unclipped, the forged report would still hold 99 % of the weight.
    unclipped = (10**6 * 1e-4 + 200 * 50 * 0.1) / (10**6 + 200 * 50)
    assert unclipped < 0.002


@settings(max_examples=300, deadline=None)
@given(
    count=st.integers(1, 2**32 - 1),
    forged_accum=st.floats(0, MAX_STEP_TIME_S),
    forged_optim=st.floats(1e-12, MAX_STEP_TIME_S),
    honest_count=st.integers(1, MAX_REPORT_STEPS),
    honest_optim=st.floats(1e-3, 10),
    n=st.integers(1, 300),
)
def test_any_accepted_forged_report_fades_as_honest_reports_arrive(
    count, forged_accum, forged_optim, honest_count, honest_optim, n
):
    """After N honest reports the mean is within W·|forged − honest| / (W + N·c), W ≤ cap."""
    forged = obs(accum_s=forged_accum, optim_s=forged_optim, count=count)
    assume(check(report(forged)) == [])
    honest = obs(accum_s=honest_optim / 2, optim_s=honest_optim, count=honest_count)
    row = mean_after(forged, honest, n)
    share = MAX_REPORT_STEPS / (MAX_REPORT_STEPS + n * honest_count)
    tolerance = 1e-9 * max(forged_optim, forged_accum, honest_optim)  # rounding
    assert abs(row.optim_step_time_s - honest_optim) <= (
        share * abs(forged_optim - honest_optim) + tolerance
    )
    assert abs(row.accum_step_time_s - honest_optim / 2) <= (
        share * abs(forged_accum - honest_optim / 2) + tolerance
    )


TRUE = PerfParams(0.02, 0.0007, 0.15, 0.05, 0.03, 0.004, 2.0)
SHAPES = [(1, 1, 32), (1, 2, 64), (1, 4, 128), (2, 4, 64), (2, 8, 32), (4, 16, 128)]


def honest_report(seq: int, count: int = 50) -> api.ReportMetricsRequest:
    nodes, replicas, local = SHAPES[seq % len(SHAPES)]
    accum, optim = step_times(TRUE, nodes, replicas, local)
    return report(
        obs(nodes, replicas, local, 1, float(accum), float(optim), count), seq=seq, rank=0
    )


def test_the_fitted_model_returns_to_the_honest_one():
    profile = pb.ObservationProfile()
    for seq in range(1, 13):
        profile = merge_report(profile, honest_report(seq)).profile
    clean = fit_profile(profile, previous=None)
    assert clean is not None
    # A forged report on one configuration: a million steps at the floor, sent as rank 0 of
    # 16 replicas so that it passes every check.
    forged = report(obs(4, 16, 128, 1, 1e-4, 1e-4, 10**6), seq=100)
    assert check(forged) == []
    poisoned = merge_report(profile, forged).profile
    nodes, replicas = np.array([1, 2, 4, 8]), np.array([4, 8, 16, 32])
    _, want = step_times(clean.params, nodes, replicas, 96)
    hit = fit_profile(poisoned, previous=None)
    assert hit is not None
    _, got = step_times(hit.params, nodes, replicas, 96)
    assert np.max(np.abs(got / want - 1)) > 0.3  # the forged report does move the model
    for seq in range(101, 101 + len(SHAPES) * 200):  # 200 on each configuration
        poisoned = merge_report(poisoned, honest_report(seq)).profile
    fit = fit_profile(poisoned, previous=None)
    assert fit is not None
    _, got = step_times(fit.params, nodes, replicas, 96)
    np.testing.assert_allclose(got, want, rtol=0.1)


# -- refused: malformed fields ----------------------------------------------------------------


def test_a_well_formed_report_has_no_problems():
    assert check(report(obs(), obs(2, 4, accum=3, accum_s=0.0), gradient=(1, 2))) == []


@pytest.mark.parametrize(
    ("observation", "want_field"),
    [
        (obs(nodes=0), "observations[0].num_nodes"),
        (obs(nodes=2, replicas=1), "observations[0].num_replicas"),
        (obs(local=0), "observations[0].local_batch_size"),
        (obs(accum=0), "observations[0].accum_steps"),
        (obs(accum_s=-0.1), "observations[0].accum_step_time_s"),
        (obs(accum_s=math.nan), "observations[0].accum_step_time_s"),
        (obs(optim_s=0.0), "observations[0].optim_step_time_s"),
        (obs(optim_s=math.inf), "observations[0].optim_step_time_s"),
        (obs(count=0), "observations[0].count"),
    ],
    ids=[
        "zero nodes",
        "fewer replicas than nodes",
        "zero local batch",
        "zero accumulation steps",
        "negative accumulation time",
        "NaN accumulation time",
        "zero optimizer-step time",
        "infinite optimizer-step time",
        "zero steps averaged",
    ],
)
def test_each_bad_observation_field_is_named(observation, want_field):
    assert [field for field, _ in check(report(observation))] == [want_field]


def test_every_problem_is_reported_at_once():
    request = report(
        obs(),
        obs(nodes=3, replicas=2, local=0, accum=0, accum_s=-1, optim_s=math.nan, count=0),
        gradient=(-1.0, math.inf),
    )
    fields = [field for field, _ in check(request)]
    assert fields == [
        "observations[1].num_replicas",
        "observations[1].local_batch_size",
        "observations[1].accum_steps",
        "observations[1].accum_step_time_s",
        "observations[1].optim_step_time_s",
        "observations[1].count",
        "gradient.sqr",
        "gradient.var",
    ]
    assert all(problem for _, problem in check(request))


@pytest.mark.parametrize(
    ("work", "field"),
    [
        ({"progress": -1.0}, "work.progress"),
        ({"progress": math.inf}, "work.progress"),
        ({"progress": 1.0, "remaining": 1e13}, "work.remaining"),
        ({"progress": 1.0, "remaining": math.nan}, "work.remaining"),
        ({"progress": 1.0, "rescale_pause_s": -2.0}, "work.rescale_pause_s"),
        ({"progress": 1.0, "rescale_pause_s": 30 * 86400.0}, "work.rescale_pause_s"),
    ],
)
def test_implausible_work_is_refused_naming_the_field(work: dict[str, float], field: str) -> None:
    problems = check(_with_work(report(obs()), **work))
    assert [name for name, _ in problems] == [field]


def test_a_report_with_too_many_observations_is_refused_naming_the_limit():
    many = report(*(obs(local=i + 1) for i in range(MAX_REPORT_OBSERVATIONS + 1)))
    problems = dict(check(many))
    assert list(problems) == ["observations"]
    assert str(MAX_REPORT_OBSERVATIONS) in problems["observations"]
    assert check(report(*(obs(local=i + 1) for i in range(MAX_REPORT_OBSERVATIONS)))) == []


# -- the values a job logs (pollux.user_metrics), checked by the trainer and the agent alike --


@given(
    st.dictionaries(
        st.from_regex(r"[A-Za-z][A-Za-z0-9_./-]{0,31}", fullmatch=True),
        st.floats(min_value=-1e30, max_value=1e30),
        max_size=16,
    )
)
def test_logged_values_the_trainer_takes_the_agent_takes(values):
    request = report(obs())
    request.user_metrics.update(values)
    assert check(request) == []
    limits = pb.BatchLimits(initial_batch_size=32, max_batch_size=256, max_local_batch_size=64)
    point = point_of(request, pb.ObservationProfile(), None, limits, 1.0)
    assert point is not None
    assert dict(point.user_metrics) == pytest.approx(values)


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ({"loss": math.inf}, "not a finite number"),
        ({"loss": math.nan}, "not a finite number"),
        ({"loss": 1e31}, "within"),
        ({"9lives": 1.0}, "a name is a letter"),
        ({"x" * 33: 1.0}, "a name is a letter"),
        ({"lo\x1bss": 1.0}, "a name is a letter"),
        ({f"m{i}": 1.0 for i in range(17)}, "at most 16"),
    ],
    ids=["infinite", "nan", "huge", "starts with a digit", "too long", "control char", "too many"],
)
def test_bad_logged_values_are_refused_by_the_agent_and_the_trainer(values, problem):
    request = report(obs())
    request.user_metrics.update(values)
    problems = check(request)
    assert problems, values
    assert problem in problems[0][1]
    assert problems[0][0].startswith("user_metrics")
    # The trainer's check is the same function, naming its own argument.
    assert [m for _, m in metric_problems(values, "log")] == [m for _, m in problems]
