"""A job's life as sampled points (`pb.JobTimeline`), built from its rank-0 reports.

What a person wants to see of a job — its GPUs, batch size, throughput, statistical
efficiency and goodput over time, where it was rescaled, and how its progress compares with
what the model predicted — is known only to the agent, which sees every report. The agent
adds a point when a report of a new generation arrives or `interval_s` has passed since the
last one, and writes the timeline in the same transaction as the profile, so it costs no
etcd round trip of its own and never disagrees with the profile it came from.

Bounded: past `MAX_POINTS` every other point of the older half is dropped, so a job that
runs for months keeps its whole life, the recent part finest.
"""

from __future__ import annotations

import math

from google.protobuf.timestamp_pb2 import Timestamp

from pollux.agent.profile import Limits, goodput_model
from pollux.goodput import GoodputError, goodput
from pollux.goodput.efficiency import efficiency
from pollux.goodput.params import GradParams
from pollux.v1 import agent_service_pb2 as api
from pollux.v1 import types_pb2 as pb

MAX_POINTS = 720
"""Points kept per job (about 60 KB): 3 h at one point per 15 s before the first thinning."""


def point_of(
    request: api.ReportMetricsRequest,
    profile: pb.ObservationProfile,
    model: pb.JobModel | None,
    limits: pb.BatchLimits,
    now_s: float,
) -> pb.TimelinePoint | None:
    """The job's state as rank 0's report shows it; None for other ranks or no step timing.

    The configuration is the report's newest observation; throughput is measured from its
    mean step times, efficiency from the profile's (merged) gradient statistics, the
    prediction from the model's fitted parameters when it has them.
    """
    if request.rank != 0 or not request.observations:
        return None
    obs = request.observations[-1]
    accum = max(obs.accum_steps, 1)
    step_s = (accum - 1) * obs.accum_step_time_s + obs.optim_step_time_s
    if not step_s > 0 or not math.isfinite(step_s):
        return None
    batch = obs.num_replicas * obs.local_batch_size * accum
    throughput = batch / step_s
    m0 = Limits.of(limits).initial
    grad = (
        GradParams(profile.gradient.sqr, profile.gradient.var)
        if profile.gradient.sqr > 0 or profile.gradient.var > 0
        else None
    )
    eff = float(efficiency(grad, m0, batch)) if grad is not None else 1.0
    predicted = 0.0
    if model is not None and model.HasField("throughput"):
        try:
            fitted = goodput_model(model, limits)
            predicted = float(
                goodput(fitted, obs.num_nodes, obs.num_replicas, obs.local_batch_size, accum - 1)
            )
        except GoodputError:
            predicted = 0.0
    stamp = Timestamp()
    stamp.FromNanoseconds(int(now_s * 1e9))
    point = pb.TimelinePoint(
        time=stamp,
        generation=request.generation,
        gpus=obs.num_replicas,
        nodes=obs.num_nodes,
        batch_size=batch,
        throughput=throughput,
        efficiency=eff,
        goodput=throughput * eff,
        predicted_goodput=predicted if math.isfinite(predicted) else 0.0,
    )
    work = request.work if request.HasField("work") else profile.work
    point.progress = work.progress
    if work.HasField("remaining"):
        point.remaining = work.remaining
    point.user_metrics.update(request.user_metrics)
    return point


def appended(
    timeline: pb.JobTimeline | None,
    point: pb.TimelinePoint,
    *,
    interval_s: float,
    max_points: int = MAX_POINTS,
) -> pb.JobTimeline | None:
    """The timeline with `point` added, or None when it is not due (nothing to write).

    Due when the timeline is empty, the point starts a newer generation, or `interval_s`
    passed since the last point. A report of an older generation (a straggler of the
    previous allocation) is never added: the timeline only moves forward.
    """
    out = pb.JobTimeline()
    if timeline is not None:
        out.CopyFrom(timeline)
    if out.points:
        last = out.points[-1]
        if point.generation < last.generation:
            return None
        elapsed = (point.time.ToNanoseconds() - last.time.ToNanoseconds()) / 1e9
        if point.generation == last.generation and elapsed < interval_s:
            return None
    out.points.append(point)
    if len(out.points) > max_points:
        half = len(out.points) // 2
        kept = [*out.points[:half:2], *out.points[half:]]
        del out.points[:]
        out.points.extend(kept)
    return out
