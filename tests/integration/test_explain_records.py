"""What a real round records for Explain, and what Explain reads back (real etcd and gRPC).

The decision record carries what `pollux-cli explain` needs to say why a job was not grown
(the restart factor a move was charged, one more GPU's speedup, the GPU limit, idle GPUs)
and what its speedup is relative to (the fair share, the model's time); Explain adds the
record of the round that chose the job's allocation (`_allocation_decision`, on records
built here) and names the holders the caller may see.
"""

from __future__ import annotations

import pytest

from pollux.scheduler.api.cluster import _allocation_decision
from pollux.service.store import Store
from pollux.v1 import scheduler_service_pb2 as spb
from pollux.v1 import types_pb2 as pb
from tests.integration.test_scheduler import Replica, add_node, spec
from tests.waiting import eventually

pytestmark = pytest.mark.timeout(60)


async def test_a_round_records_the_rules_explain_names(replica: Replica, store: Store) -> None:
    await add_node(store, "n1", 6)
    first = (
        await replica.stub.SubmitJob(spb.SubmitJobRequest(spec=spec("first-job"), request_id="a"))
    ).job

    async def placed() -> spb.ExplainResponse | None:
        got = await replica.stub.Explain(spb.ExplainRequest(job_id=first.id))
        return got if got.decision.nodes else None

    explain = await eventually(placed, 20, "the job to be placed")
    d = explain.decision
    # No model yet: the jct mode starts it on at most 4 GPUs (its exploration limit).
    assert len(d.nodes) == 4
    assert d.gpu_limit == 4
    assert not d.HasField("speedup_one_more"), "5 GPUs is past its limit"
    assert d.HasField("move_factor")
    assert 0.0 <= d.move_factor <= 1.0
    assert (d.reference_gpus, d.reference_nodes) == (6, 1), "one job: the whole cluster"
    assert not d.HasField("model_time"), "no model: linear scaling assumed"
    assert explain.round.idle_gpus == 2

    second = (
        await replica.stub.SubmitJob(spb.SubmitJobRequest(spec=spec("second-job"), request_id="b"))
    ).job

    async def both_placed() -> spb.ExplainResponse | None:
        got = await replica.stub.Explain(spb.ExplainRequest(job_id=second.id))
        return got if got.decision.nodes and got.holders else None

    explain = await eventually(both_placed, 20, "the second job to be placed")
    holder = next(h for h in explain.holders if h.job_id == first.id)
    assert holder.name == "first-job", "the caller's own job is named"
    # Its fair share among the round's jobs: a placement round sees only the free GPUs and
    # the new job (2), a full round the whole cluster and both jobs (3).
    assert explain.decision.reference_gpus in (2, 3)


def job_on(nodes: list[str]) -> pb.Job:
    job = pb.Job(id="j-0000000001")
    job.allocation.nodes.extend(nodes)
    return job


def decision(number: int, *entries: pb.JobDecision) -> pb.Decision:
    return pb.Decision(round=number, jobs=list(entries))


def test_the_round_that_chose_the_allocation_is_found_among_the_records() -> None:
    job = job_on(["n1", "n1"])
    chose = pb.JobDecision(job_id=job.id, nodes=["n1", "n1"], speedup=1.0, changed=True)
    later = pb.JobDecision(job_id=job.id, nodes=["n1", "n1"], speedup=0.516)
    other = pb.JobDecision(job_id="j-other", nodes=["n2"], changed=True)
    records = [decision(30, later), decision(20, other), decision(12, chose), decision(5)]
    response = spb.ExplainResponse()
    response.decision.CopyFrom(later)
    response.round.round = 30
    _allocation_decision(job, records, response)
    assert response.allocation_decision.speedup == 1.0
    assert response.allocation_round.round == 12
    assert list(response.allocation_round.jobs) == []

    # The decision shown is the one that chose it: nothing more to say.
    shown = spb.ExplainResponse()
    shown.decision.CopyFrom(chose)
    shown.round.round = 12
    _allocation_decision(job, records[2:], shown)
    assert not shown.HasField("allocation_decision")

    # The newest change chose another allocation (not applied yet): nothing is claimed.
    moved = pb.JobDecision(job_id=job.id, nodes=["n2"], changed=True)
    fresh = spb.ExplainResponse()
    _allocation_decision(job, [decision(40, moved), *records], fresh)
    assert not fresh.HasField("allocation_decision")
