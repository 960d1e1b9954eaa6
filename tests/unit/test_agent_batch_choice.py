"""The agent's batch choice responds to the gradient noise scale, and only in one direction.

This is where the claim "the agent grows the batch as the noise scale grows" is checked: on the
pure `choose`, deterministically, rather than on one noisy training run. At a fixed allocation
with hysteresis off, a higher noise scale never gives a smaller total batch, and gives a
strictly larger one exactly when it passes R, the smallest noise scale at which a faster,
larger rival on `best_batch`'s own candidate grid overtakes the choice (R = ∞ where a limit
binds: the maximum batch, or the per-GPU maximum). With hysteresis on, the remembered batch of
one shape never shrinks along a rising noise scale. Noise scales within a relative 1e-9 of an
exact tie are skipped (rounding decides there). Why it holds: docs/results.md, "Elastic
training, end to end".
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

from pollux.agent.batch_config import BatchConfigError, choose
from pollux.agent.profile import goodput_model, grad_from_model, perf_to_pb
from pollux.goodput import PerfParams, SyncModel, throughput
from pollux.goodput.batch import NUM_CANDIDATES, _Params, _splits
from pollux.v1 import types_pb2 as pb

TIE = 1e-9
"""Relative goodput difference below which two configurations count as tied."""

times = st.floats(1e-4, 1.0)
perfs = st.builds(
    PerfParams,
    times,
    st.floats(1e-6, 1e-2),
    times,
    times,
    times,
    times,
    st.floats(1.0, 10.0),
    st.sampled_from(list(SyncModel)),
)
noise_scales = st.one_of(st.just(0.0), st.floats(-3.0, 3.0).map(lambda x: 10.0**x))
"""Noise scales var/sqr, log-uniform over the range where the batch choice moves."""
rises = st.floats(-6.0, 4.0).map(lambda x: 10.0**x)


@dataclass(frozen=True)
class Situation:
    """A job's limits and fitted throughput at one allocation (N, K); sqr stays fixed."""

    limits: pb.BatchLimits
    perf: PerfParams
    nodes: int
    replicas: int
    sqr: float

    def model(self, noise_scale: float) -> pb.JobModel:
        """The job's model with gradient statistics of this noise scale (var/sqr)."""
        return pb.JobModel(
            job_id="j-1",
            throughput=perf_to_pb(self.perf),
            grad_sqr=self.sqr,
            grad_var=noise_scale * self.sqr,
            batch=self.limits,
        )

    def noise(self, noise_scale: float) -> float:
        """The noise scale the agent sees once the statistics are stored (var/sqr)."""
        return grad_from_model(self.model(noise_scale)).noise_scale

    def choose(
        self, noise_scale: float, *, last: pb.BatchConfig | None = None, hysteresis: float = 0.0
    ) -> pb.BatchConfig:
        return choose(
            self.limits,
            self.model(noise_scale),
            self.nodes,
            self.replicas,
            last=last,
            hysteresis=hysteresis,
        )


@st.composite
def situations(draw: st.DrawFn) -> Situation:
    """Valid limits and a feasible allocation: K replicas of the minimum local batch fit."""
    m0 = draw(st.integers(1, 512))
    top = draw(st.integers(m0, m0 * 64))
    low = draw(st.integers(1, min(64, top)))
    high = draw(st.one_of(st.just(0), st.integers(low, top)))  # 0: the maximum batch
    replicas = min(draw(st.integers(1, 16)), top // low)
    nodes = min(draw(st.integers(1, 4)), replicas)
    limits = pb.BatchLimits(
        initial_batch_size=m0,
        max_batch_size=top,
        min_local_batch_size=low,
        max_local_batch_size=high,
    )
    return Situation(limits, draw(perfs), nodes, replicas, draw(st.floats(1e-3, 1e3)))


def feasible(s: Situation, lower: float, higher: float) -> bool:
    """Whether the allocation admits a configuration; checks that the noise cannot change it.

    Some valid limits admit none after a fit, e.g. one replica whose only batches above M0
    would need two micro-batches below the minimum local batch (`best_batch` takes at least
    two on one replica above M0, for the noise estimate).
    """
    try:
        s.choose(lower)
    except BatchConfigError:
        event("no configuration fits the allocation")
        with pytest.raises(BatchConfigError):
            s.choose(higher)
        return False
    return True


@dataclass(frozen=True)
class Rival:
    """A configuration on the candidate grid with a larger total batch than the choice c."""

    speed: float  # ρ = T_j / T_c, throughputs in samples/s
    scale: float  # S_j

    def ratio(self, scale: float, noise: float) -> float:
        """G_j / G_c at noise scale `noise`, where S_c = `scale`."""
        return self.speed * (noise + scale) / (noise + self.scale)


def scale_of(s: Situation, total: int) -> float:
    m0 = s.limits.initial_batch_size
    return max(total, m0) / m0


def rivals(s: Situation, config: pb.BatchConfig) -> list[Rival]:
    """Every valid configuration of `best_batch`'s grid with a larger total than `config`."""
    gm = goodput_model(s.model(1.0), s.limits)  # the grid and validity ignore the noise
    params = _Params.of([gm]).take(np.zeros(1, dtype=np.int64))
    steps, atomic, _, useful = _splits(params, np.array([float(s.replicas)]), NUM_CANDIDATES)
    valid = useful[:, 0] > 0
    m, extra = atomic[valid, 0].astype(np.int64), steps[valid, 0].astype(np.int64)
    totals = s.replicas * m * (extra + 1)
    speeds = throughput(s.perf, s.nodes, s.replicas, m, extra)
    own = float(
        throughput(s.perf, s.nodes, s.replicas, config.local_batch_size, config.accum_steps - 1)
    )
    return [
        Rival(float(t) / own, scale_of(s, int(b)))
        for b, t in zip(totals, speeds, strict=True)
        if b > config.total_batch_size
    ]


def overtaking_point(scale: float, rivals: list[Rival]) -> float:
    """R: the noise scale above which some rival beats the choice; ∞ when a limit binds."""
    points = [
        (r.scale - r.speed * scale) / (r.speed - 1.0)
        for r in rivals
        if r.speed > 1.0 and r.scale > scale
    ]
    return min(points, default=math.inf)


@settings(max_examples=150, deadline=None)
@given(s=situations(), lower=noise_scales, rise=rises)
def test_a_higher_noise_scale_never_gives_a_smaller_batch(
    s: Situation, lower: float, rise: float
) -> None:
    """At a fixed allocation, without hysteresis, the chosen total batch is monotone in noise."""
    higher = lower + rise
    assume(s.noise(higher) > s.noise(lower))
    if not feasible(s, lower, higher):
        return
    before, after = s.choose(lower), s.choose(higher)
    event("grew" if after.total_batch_size > before.total_batch_size else "kept its size")
    assert after.total_batch_size >= before.total_batch_size, (before, after)
    # At one allocation the per-replica batch is the total over K: it never shrinks either.
    assert after.local_batch_size * after.accum_steps >= before.local_batch_size * (
        before.accum_steps
    )


@settings(max_examples=150, deadline=None)
@given(s=situations(), lower=noise_scales, data=st.data())
def test_the_batch_grows_exactly_when_the_noise_scale_passes_the_overtaking_point(
    s: Situation, lower: float, data: st.DataObject
) -> None:
    """Strictly larger iff the higher noise scale exceeds R, where a larger rival overtakes."""
    if not feasible(s, lower, lower + 1.0):
        return
    before = s.choose(lower)
    scale = scale_of(s, before.total_batch_size)
    others = rivals(s, before)
    # The choice is the best of the grid at the lower noise scale: no rival beats it there.
    assert all(r.ratio(scale, s.noise(lower)) <= 1 + TIE for r in others), before
    point = overtaking_point(scale, others)
    assert point >= s.noise(lower) * (1 - TIE) - TIE
    if math.isinf(point):
        event(
            "a limit binds: "
            + ("larger batches are all slower" if others else "the largest batch is chosen")
        )
        higher = lower + data.draw(rises, label="rise")
    elif data.draw(st.booleans(), label="past the overtaking point"):
        higher = point + (point + 1.0) * data.draw(st.floats(1e-6, 10.0), label="margin")
    else:
        higher = lower + (point - lower) * data.draw(st.floats(0.0, 1.0), label="fraction")
    assume(higher > lower)
    noise = s.noise(higher)
    assume(noise > s.noise(lower))
    assume(all(abs(r.ratio(scale, noise) - 1) > TIE for r in others))
    after = s.choose(higher)
    grew = after.total_batch_size > before.total_batch_size
    event(f"{'past' if noise > point else 'short of'} the overtaking point")
    assert grew == (noise > point), (before, after, point, noise)
    if not grew:  # then nothing moved at all, not even the split of the same total
        assert (after.local_batch_size, after.accum_steps) == (
            before.local_batch_size,
            before.accum_steps,
        )


@settings(max_examples=60, deadline=None)
@given(
    s=situations(),
    lower=noise_scales,
    steps=st.lists(rises, min_size=2, max_size=6),
    hysteresis=st.sampled_from([0.0, 0.05, 0.2]),
)
def test_with_hysteresis_a_rising_noise_scale_never_shrinks_the_remembered_batch(
    s: Situation, lower: float, steps: list[float], hysteresis: float
) -> None:
    """Each answer is the previous one or the current best, so the agent's loop is monotone."""
    if not feasible(s, lower, lower + sum(steps)):
        return
    noise, last = lower, None
    for rise in steps:
        config = s.choose(noise, last=last, hysteresis=hysteresis)
        if last is not None:
            assert config.total_batch_size >= last.total_batch_size, (last, config)
        noise, last = noise + rise, config


E2E_LIMITS = pb.BatchLimits(
    initial_batch_size=64, max_batch_size=2048, min_local_batch_size=16, max_local_batch_size=256
)
E2E_PERF = PerfParams(0.02, 0.0005, 0.05, 0.01, 0.01, 0.002, 2.0)
"""The end-to-end job's limits, and timing like its emulated 20 ms + 0.5 ms per sample."""
UNIT_LIMITS = pb.BatchLimits(
    initial_batch_size=128, max_batch_size=4096, min_local_batch_size=16, max_local_batch_size=256
)
UNIT_PERF = PerfParams(0.02, 0.0007, 0.15, 0.05, 0.03, 0.004, 2.0)


@pytest.mark.parametrize(
    ("limits", "perf", "nodes", "replicas"),
    [
        (E2E_LIMITS, E2E_PERF, 1, 1),
        (E2E_LIMITS, E2E_PERF, 1, 2),
        (E2E_LIMITS, E2E_PERF, 2, 4),
        (UNIT_LIMITS, UNIT_PERF, 1, 4),
        (UNIT_LIMITS, UNIT_PERF, 2, 8),
    ],
    ids=[
        "the end-to-end job on one replica",
        "the end-to-end job on two replicas of one node",
        "the end-to-end job on four replicas over two nodes",
        "a slower-syncing job on four replicas of one node",
        "a slower-syncing job on eight replicas over two nodes",
    ],
)
def test_sweeping_the_noise_scale_up_grows_the_batch_from_the_smallest_to_the_largest(
    limits: pb.BatchLimits, perf: PerfParams, nodes: int, replicas: int
) -> None:
    """Without noise a larger batch only costs time; with much noise it is nearly free."""
    s = Situation(limits, perf, nodes, replicas, 1.0)
    totals = [s.choose(float(r)).total_batch_size for r in np.geomspace(1e-2, 1e5, 120)]
    assert all(b >= a for a, b in itertools.pairwise(totals)), totals
    assert totals[0] == max(limits.initial_batch_size, replicas * limits.min_local_batch_size)
    assert totals[-1] == limits.max_batch_size
