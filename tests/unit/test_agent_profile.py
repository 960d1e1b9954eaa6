"""Observation profiles: count-weighted merging, deduplication, fitting, conversion."""

from __future__ import annotations

import numpy as np
import pytest

from pollux.agent.profile import (
    KEEP_GENERATIONS,
    MAX_APPLIED_SEQ,
    MAX_PROFILE_ROWS,
    MAX_SHAPES,
    Limits,
    already_applied,
    build_model,
    can_fit,
    fit_observations,
    fit_profile,
    goodput_model,
    merge_report,
    observation_count,
    perf_from_pb,
    perf_to_pb,
    shape_key,
    with_config,
)
from pollux.agent.report_check import MAX_REPORT_OBSERVATIONS
from pollux.goodput import UNKNOWN_GRAD, InvalidInputError, PerfParams, SyncModel, step_times
from pollux.service.seeding import MAX_SEED_ROWS
from pollux.service.store import MAX_VALUE_BYTES
from pollux.v1 import agent_service_pb2 as api
from pollux.v1 import types_pb2 as pb


def obs(
    nodes: int = 1,
    replicas: int = 1,
    local: int = 32,
    accum: int = 1,
    accum_s: float = 0.1,
    optim_s: float = 0.2,
    count: int = 1,
) -> pb.StepObservation:
    return pb.StepObservation(
        num_nodes=nodes,
        num_replicas=replicas,
        local_batch_size=local,
        accum_steps=accum,
        accum_step_time_s=accum_s,
        optim_step_time_s=optim_s,
        count=count,
    )


def report(
    *observations: pb.StepObservation,
    seq: int = 1,
    rank: int = 0,
    generation: int = 1,
    gradient: tuple[float, float] | None = None,
) -> api.ReportMetricsRequest:
    request = api.ReportMetricsRequest(
        job_id="j-1", generation=generation, rank=rank, seq=seq, observations=observations
    )
    if gradient is not None:
        request.gradient.sqr, request.gradient.var = gradient
    return request


# -- merging and deduplication ----------------------------------------------------------------


def test_same_configuration_merges_into_a_count_weighted_mean():
    first = merge_report(pb.ObservationProfile(), report(obs(accum_s=0.1, optim_s=0.2, count=1)))
    second = merge_report(first.profile, report(obs(accum_s=0.3, optim_s=0.6, count=3), seq=2))
    assert first.new_configuration
    assert not second.new_configuration
    (row,) = second.profile.observations
    assert row.count == 4
    assert row.accum_step_time_s == pytest.approx((0.1 + 0.9) / 4)
    assert row.optim_step_time_s == pytest.approx((0.2 + 1.8) / 4)
    assert observation_count(second.profile) == 4


def test_different_configurations_stay_separate_rows():
    merged = merge_report(
        pb.ObservationProfile(), report(obs(local=32), obs(local=64), obs(local=32, accum=2))
    )
    assert [(o.local_batch_size, o.accum_steps) for o in merged.profile.observations] == [
        (32, 1),
        (64, 1),
        (32, 2),
    ]
    again = merge_report(merged.profile, report(obs(local=32, accum=4), seq=2))
    assert not again.new_configuration  # same (N, K, m): nothing new for the throughput fit
    assert merge_report(again.profile, report(obs(2, 2), seq=3)).new_configuration


def test_merging_never_modifies_the_input_profile():
    profile = merge_report(pb.ObservationProfile(), report(obs(count=2))).profile
    snapshot = profile.SerializeToString()
    merge_report(profile, report(obs(count=5), seq=2, gradient=(1, 1)))
    assert profile.SerializeToString() == snapshot


def test_a_retried_report_is_applied_once():
    once = merge_report(pb.ObservationProfile(), report(obs(count=2), seq=7))
    retry = merge_report(once.profile, report(obs(count=2), seq=7))
    older = merge_report(once.profile, report(obs(count=2), seq=6))
    assert once.applied
    assert not retry.applied
    assert not older.applied
    assert retry.profile is once.profile
    assert observation_count(retry.profile) == 2
    # What the agent asks before a report's replica budget is charged.
    assert already_applied(once.profile, report(obs(), seq=7))
    assert already_applied(once.profile, report(obs(), seq=6))
    assert not already_applied(once.profile, report(obs(), seq=8))
    assert not already_applied(once.profile, report(obs(), seq=7, rank=1))


def test_replicas_and_generations_are_deduplicated_separately():
    profile = merge_report(pb.ObservationProfile(), report(obs(), seq=1, rank=0)).profile
    other_rank = merge_report(profile, report(obs(), seq=1, rank=1))
    next_generation = merge_report(profile, report(obs(), seq=1, rank=0, generation=2))
    assert other_rank.applied
    assert next_generation.applied
    assert dict(other_rank.profile.applied_seq) == {"1/0": 1, "1/1": 1}


def test_old_generations_are_pruned_and_their_late_reports_dropped():
    profile = pb.ObservationProfile()
    for generation in range(1, 5):
        profile = merge_report(profile, report(obs(), generation=generation)).profile
    kept = sorted(int(k.split("/")[0]) for k in profile.applied_seq)
    assert kept == list(range(5 - KEEP_GENERATIONS, 5))
    late = merge_report(profile, report(obs(), generation=1, seq=99))
    assert not late.applied
    assert already_applied(profile, report(obs(), generation=1, seq=99))


def test_latest_gradient_statistics_replace_earlier_ones():
    profile = merge_report(pb.ObservationProfile(), report(gradient=(1.0, 2.0))).profile
    profile = merge_report(profile, report(seq=2)).profile
    assert (profile.gradient.sqr, profile.gradient.var) == (1.0, 2.0)
    profile = merge_report(profile, report(seq=3, gradient=(3.0, 4.0))).profile
    assert (profile.gradient.sqr, profile.gradient.var) == (3.0, 4.0)


def _with_work(request: api.ReportMetricsRequest, **work: float) -> api.ReportMetricsRequest:
    request.work.CopyFrom(pb.WorkStatus(**work))
    return request


def test_the_latest_work_status_reaches_the_published_model():
    profile = merge_report(
        pb.ObservationProfile(), _with_work(report(obs()), progress=5.0, remaining=95.0)
    ).profile
    profile = merge_report(profile, report(obs(), seq=2)).profile  # no work: kept
    assert (profile.work.progress, profile.work.remaining) == (5.0, 95.0)
    later = _with_work(report(obs(), seq=3), progress=9.0, remaining=91.0, rescale_pause_s=4.5)
    profile = merge_report(profile, later).profile
    model = build_model(profile, pb.BatchLimits(), None, agent_id="a", now_s=1.0)
    assert (model.work.progress, model.work.remaining, model.work.rescale_pause_s) == (
        9.0,
        91.0,
        4.5,
    )
    undeclared = merge_report(pb.ObservationProfile(), _with_work(report(obs()), progress=1.0))
    assert not undeclared.profile.work.HasField("remaining")  # no size declared: None


# -- bounds ----------------------------------------------------------------------------------


def test_profile_rows_are_bounded_keeping_the_reported_and_the_most_observed():
    profile = pb.ObservationProfile()
    seq = 0
    for start in range(0, MAX_PROFILE_ROWS + 200, MAX_REPORT_OBSERVATIONS):
        seq += 1
        rows = [
            obs(local=i + 1, count=i + 1) for i in range(start, start + MAX_REPORT_OBSERVATIONS)
        ]
        profile = merge_report(profile, report(*rows, seq=seq)).profile
        assert len(profile.observations) <= MAX_PROFILE_ROWS
    kept = {o.local_batch_size for o in profile.observations}
    assert len(kept) == MAX_PROFILE_ROWS
    last = range(start + 1, start + MAX_REPORT_OBSERVATIONS + 1)
    assert kept >= set(last)  # the report just merged is never dropped
    assert min(kept) > 1  # the least-observed rows went first
    low = merge_report(profile, report(obs(local=1, count=1), seq=seq + 1)).profile
    assert 1 in {o.local_batch_size for o in low.observations}  # a new row gets in


def test_replica_keys_are_bounded_the_older_generation_going_first():
    profile = pb.ObservationProfile()
    for rank in range(MAX_APPLIED_SEQ):
        profile.applied_seq[f"1/{rank}"] = 1
    merged = merge_report(profile, report(obs(), rank=0, generation=2))
    assert merged.applied
    assert dict(merged.profile.applied_seq) == {"2/0": 1}
    late = merge_report(merged.profile, report(obs(), rank=5, generation=1, seq=2))
    assert not late.applied  # the dropped generation's late reports count as applied


def test_a_new_rank_past_the_bound_is_not_applied_but_known_ranks_are():
    profile = pb.ObservationProfile()
    for rank in range(MAX_APPLIED_SEQ):
        profile.applied_seq[f"3/{rank}"] = 1
    new_rank = merge_report(profile, report(obs(), rank=MAX_APPLIED_SEQ, generation=3))
    known = merge_report(profile, report(obs(), rank=7, generation=3, seq=2))
    assert not new_rank.applied
    assert new_rank.profile is profile
    assert known.applied
    assert len(known.profile.applied_seq) == MAX_APPLIED_SEQ
    assert known.profile.applied_seq["3/7"] == 2


def test_remembered_shapes_are_bounded_and_keep_the_newest():
    profile = pb.ObservationProfile(job_id="j-1")
    config = pb.BatchConfig(local_batch_size=32, accum_steps=1, total_batch_size=32)
    for replicas in range(1, MAX_SHAPES + 50):
        profile = with_config(profile, "j-1", shape_key(1, replicas), config)
        assert len(profile.last_configs) <= MAX_SHAPES
    assert len(profile.last_configs) == MAX_SHAPES
    assert shape_key(1, MAX_SHAPES + 49) in profile.last_configs
    assert profile.job_id == "j-1"


def test_a_profile_at_every_bound_stays_far_below_the_store_value_limit():
    assert MAX_SEED_ROWS == MAX_PROFILE_ROWS
    profile = pb.ObservationProfile(job_id="j-" + "f" * 10)
    for i in range(MAX_PROFILE_ROWS):
        row = profile.observations.add()
        row.CopyFrom(obs(nodes=2**32 - 1, replicas=2**32 - 1, local=i + 1, accum=2**32 - 1))
        row.count = 2**32 - 1
        profile.seed_observations.append(row)  # a seed is bounded as much (MAX_SEED_ROWS)
    profile.seeded_from = "j-" + "f" * 10
    for rank in range(MAX_APPLIED_SEQ):
        profile.applied_seq[f"{2**64 - 1}/{2**32 - 1 - rank}"] = 2**64 - 1
    for i in range(MAX_SHAPES):
        profile.last_configs[shape_key(2**32 - 1 - i, 2**32 - 1)].CopyFrom(
            pb.BatchConfig(
                local_batch_size=2**32 - 1,
                accum_steps=2**32 - 1,
                total_batch_size=2**32 - 1,
                predicted_speedup=1.5,
            )
        )
    assert profile.ByteSize() < MAX_VALUE_BYTES * 3 // 4


# -- fitting ----------------------------------------------------------------------------------

TRUE = PerfParams(0.02, 0.0007, 0.15, 0.05, 0.03, 0.004, 2.0)
NODES = [1, 1, 1, 1, 2, 2, 2, 3, 4, 4]
REPLICAS = [1, 2, 3, 4, 2, 4, 8, 6, 4, 16]
ATOMIC = [32, 64, 128, 256, 64, 128, 32, 96, 64, 128]


def synthetic_profile(perf: PerfParams) -> pb.ObservationProfile:
    accum, optim = step_times(perf, NODES, REPLICAS, ATOMIC)
    profile = pb.ObservationProfile(job_id="j-1")
    for i, (n, k, m) in enumerate(zip(NODES, REPLICAS, ATOMIC, strict=True)):
        profile.observations.append(obs(n, k, m, 1, float(accum[i]), float(optim[i]), 10))
    return profile


def test_fit_from_a_profile_recovers_the_step_times():
    fit = fit_profile(synthetic_profile(TRUE), previous=None)
    assert fit is not None
    assert fit.converged
    nodes, replicas = np.array([1, 2, 6, 8]), np.array([2, 8, 24, 32])
    _, want = step_times(TRUE, nodes, replicas, 100)
    _, got = step_times(fit.params, nodes, replicas, 100)
    np.testing.assert_allclose(got, want, rtol=0.03)


def test_warm_start_from_the_previous_fit_reaches_the_same_model():
    profile = synthetic_profile(TRUE)
    cold = fit_profile(profile, previous=None)
    assert cold is not None
    warm = fit_profile(profile, previous=perf_to_pb(cold.params))
    assert warm is not None
    _, want = step_times(cold.params, NODES, REPLICAS, ATOMIC)
    _, got = step_times(warm.params, NODES, REPLICAS, ATOMIC)
    np.testing.assert_allclose(got, want, rtol=0.01)


def test_fit_rows_pool_accumulation_variants_and_skip_unmeasured_compute():
    profile = pb.ObservationProfile(
        observations=[
            obs(local=32, accum=1, accum_s=0.1, optim_s=0.2, count=1),
            obs(local=32, accum=4, accum_s=0.2, optim_s=0.4, count=3),
            obs(local=64, accum=1, accum_s=0.0, optim_s=0.3, count=5),
        ]
    )
    rows = fit_observations(profile)
    assert rows is not None
    assert rows.atomic_bsz.tolist() == [32.0]
    assert rows.accum_step_time.tolist() == pytest.approx([0.175])
    assert rows.optim_step_time.tolist() == pytest.approx([0.35])


def test_nothing_to_fit_gives_no_fit():
    unmeasured = pb.ObservationProfile(observations=[obs(accum_s=0.0)])
    for profile in (pb.ObservationProfile(), unmeasured):
        assert not can_fit(profile)
        assert fit_profile(profile, previous=None) is None
    assert can_fit(pb.ObservationProfile(observations=[obs(accum_s=0.0), obs(local=64)]))


# -- model and conversions --------------------------------------------------------------------


@pytest.mark.parametrize("sync_model", list(SyncModel), ids=lambda s: f"{s.value} sync")
def test_perf_params_survive_the_wire_round_trip(sync_model):
    perf = PerfParams(0.02, 0.0007, 0.15, 0.05, 0.03, 0.004, 2.5, sync_model)
    message = pb.ThroughputParams()
    message.ParseFromString(perf_to_pb(perf).SerializeToString())
    assert perf_from_pb(message) == perf


def test_unspecified_sync_model_means_ring():
    message = perf_to_pb(TRUE)
    message.sync_model = pb.SYNC_MODEL_UNSPECIFIED
    assert perf_from_pb(message).sync_model is SyncModel.RING


def test_built_model_carries_limits_counts_gradient_and_fit():
    profile = merge_report(
        pb.ObservationProfile(), report(obs(2, 8, count=3), obs(1, 2, count=4), gradient=(2, 5))
    ).profile
    limits = pb.BatchLimits(initial_batch_size=128, max_batch_size=1024)
    model = build_model(
        profile, limits, perf_to_pb(TRUE), agent_id="agent-a", now_s=1_700_000_000.5
    )
    assert model.job_id == "j-1"
    assert model.batch == limits
    assert model.max_profiled_replicas == 8
    assert model.observations == 7
    assert (model.grad_sqr, model.grad_var) == (2.0, 5.0)
    assert perf_from_pb(model.throughput) == TRUE
    assert model.update_time.ToNanoseconds() == 1_700_000_000_500_000_000
    assert model.agent_id == "agent-a"
    assert not build_model(profile, limits, None, agent_id="a", now_s=0).HasField("throughput")


def test_goodput_model_resolves_limits_and_unknown_gradients():
    model = build_model(
        pb.ObservationProfile(job_id="j-1"),
        pb.BatchLimits(initial_batch_size=64),
        perf_to_pb(TRUE),
        agent_id="a",
        now_s=0,
    )
    gm = goodput_model(model, model.batch)
    assert gm.grad == UNKNOWN_GRAD
    assert (gm.init_batch_size, gm.max_batch_size, gm.atomic_bsz_range) == (64, 64, (1, 64))
    assert gm.accumulation


@pytest.mark.parametrize(
    ("limits", "want_field"),
    [
        (pb.BatchLimits(), "batch.initial_batch_size"),
        (pb.BatchLimits(initial_batch_size=64, max_batch_size=32), "batch.max_batch_size"),
        (
            pb.BatchLimits(initial_batch_size=64, min_local_batch_size=16, max_local_batch_size=8),
            "batch.min_local_batch_size",
        ),
    ],
    ids=["no initial batch", "max below initial", "min local above max local"],
)
def test_unusable_limits_are_rejected_by_field(limits, want_field):
    with pytest.raises(InvalidInputError) as caught:
        Limits.of(limits)
    assert caught.value.field == want_field
