"""`pollux-cli explain` says why a job was not grown, and why its speedup moved.

A user saw "+0.218 speedup" for one more GPU while GPUs stayed idle, and one allocation
read speedup 1.000, later 0.516. On constructed decision records (the fields a round writes:
the restart factor, the speedup of one more GPU, the GPU limit, the fair share and the model
time) the text must name the rule that held the GPU back and what changed; and the policy
must write those fields, and name other jobs by name in its reasons.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import numpy as np

from pollux.client import format as fmt
from pollux.client.types import Alternative, Explanation, Holder, JobDecision, RoundInfo
from pollux.policy.params import PolluxParams
from pollux.policy.problem import Problem
from pollux.policy.types import ClusterState, JobInfo, NodeInfo
from tests.unit.test_cli_format import T0, explanation

NODES = ("n1", "n1", "n2", "n2")


def record(**fields: object) -> JobDecision:
    """The job's part of a round that kept its 4 GPUs, with the given fields."""
    base = JobDecision(
        "j-3f9a1c2b",
        NODES,
        1.0,
        1.0,
        "unchanged: 4 GPUs on 2 nodes",
        False,
        move_factor=0.7,
        speedup_one_more=1.218,
        gpu_limit=8,
        reference_gpus=1,
        reference_nodes=1,
        model_time=T0,
    )
    return dataclasses.replace(base, **fields)  # type: ignore[arg-type]


def explained(decision: JobDecision, **more: object) -> Explanation:
    round_info = RoundInfo(9, T0 + timedelta(minutes=9), "pollux", 1.0, 99, "s-1", idle_gpus=3)
    base = dataclasses.replace(
        explanation(),
        decision=decision,
        round=round_info,
        alternatives=(Alternative(4, 2, 1.0, 100.0), Alternative(5, 2, 1.218, 121.8)),
    )
    return dataclasses.replace(base, **more)  # type: ignore[arg-type]


def test_an_idle_gpu_held_back_by_the_restart_factor_says_so() -> None:
    text = fmt.explanation_text(explained(record()))
    assert "+0.218 speedup for this job (4 → 5 GPUs), predicted now" in text
    assert "Not given:" in text
    assert "the restart would cost more than the GPU gains" in text
    assert "5 GPUs at speedup 1.218 × restart factor 0.700 = 0.853" in text
    assert "no more than the 1.000 it has unchanged" in text
    assert "it pays once the factor exceeds 0.821" in text
    assert "Restart factor:   0.700: a re-allocation stops and restarts the job" in text


def test_other_rules_that_hold_a_gpu_back_are_named() -> None:
    at_limit = fmt.why_not_one_more(explained(record(gpu_limit=4, speedup_one_more=None)))
    assert at_limit.startswith("4 GPUs is its limit this round: it has been measured on up to 4")
    assert "exploration limit" in at_limit

    paid = record(move_factor=0.95)  # 1.218 × 0.95 = 1.157 > 1.000: the restart pays
    busy = explained(paid, round=dataclasses.replace(explained(paid).round, idle_gpus=0))
    assert fmt.why_not_one_more(busy).startswith("no GPU was idle")
    placed = explained(paid, round=dataclasses.replace(explained(paid).round, placement=True))
    assert "placement round" in fmt.why_not_one_more(placed)
    budget = explained(
        dataclasses.replace(paid, reason="unchanged (tenant ml: 4 of its 4-GPU budget)")
    )
    assert fmt.why_not_one_more(budget) == "its tenant ml holds its whole 4-GPU budget"
    idle = fmt.why_not_one_more(explained(paid))
    assert idle.startswith("3 GPUs idle and the round valued 5 GPUs at speedup 1.218")
    # A job the round moved, a pending job, a server that records none of it: nothing said.
    assert fmt.why_not_one_more(explained(record(changed=True))) == ""
    assert fmt.why_not_one_more(explained(record(nodes=()))) == ""
    silent = record(move_factor=None, speedup_one_more=None, gpu_limit=0)
    assert fmt.why_not_one_more(explained(silent)) == ""
    assert "Not given" not in fmt.explanation_text(explained(silent))


def test_a_speedup_says_what_it_is_relative_to_and_why_it_moved() -> None:
    now = record(speedup=0.516, model_time=T0 + timedelta(minutes=5))
    then = record(speedup=1.0, changed=True, model_time=None)
    chosen = RoundInfo(3, T0 + timedelta(minutes=1), "pollux", 1.0, 12, "s-1")
    text = fmt.explanation_text(explained(now, allocation_decision=then, allocation_round=chosen))
    assert (
        "Speedup:          0.516 × its goodput on its fair share (1 GPU on 1 node), by its "
        "model of 2024-05-01 12:05:00Z"
    ) in text
    assert (
        "Speedup then:     1.000 when round 3 at 2024-05-01 12:01:00Z chose this allocation" in text
    )
    assert "its model was first fitted (2024-05-01 12:05:00Z; until then linear scaling" in text

    refitted = dataclasses.replace(then, model_time=T0, reference_gpus=2)
    text = fmt.explanation_text(
        explained(now, allocation_decision=refitted, allocation_round=chosen)
    )
    assert "its model was refitted (2024-05-01 12:00:00Z → 2024-05-01 12:05:00Z" in text
    assert "its fair share changed (2 GPUs → 1 GPU: jobs arrived or finished)" in text
    # The same speedup as when chosen: nothing to explain.
    same = explained(record(), allocation_decision=record(changed=True), allocation_round=chosen)
    assert "Speedup then" not in fmt.explanation_text(same)
    # Before any model: the basis says so.
    assert "with no model yet (linear scaling assumed)" in fmt.explanation_text(
        explained(record(model_time=None))
    )


def test_holders_are_named_by_name_where_the_server_gives_it() -> None:
    text = fmt.explanation_text(
        explained(
            record(),
            holders=(Holder("j-mine", 2, 1.2, 0.8, "resnet"), Holder("j-theirs", 1, 0.5, 0.0)),
        )
    )
    assert "resnet (j-mine): its last of 2 GPUs is worth 0.400" in text
    assert "j-theirs: its last of 1 GPU is worth 0.500" in text


def test_a_round_records_what_a_move_costs_and_names_who_took_gpus() -> None:
    # Two jobs of one user, a third user's: b shrinks a (2 → 1) or c does.
    nodes = (NodeInfo("n1", 2), NodeInfo("n2", 2))
    jobs = (
        JobInfo("j-a", 0.0, ("n1", "n1"), max_replicas=2, owner="u", label="ddp"),
        JobInfo("j-b", 0.0, ("n2",), max_replicas=4, owner="u", label="ddp"),
        JobInfo("j-c", 0.0, ("n2",), max_replicas=4, owner="v", label="theirs"),
    )
    state = ClusterState(now=3600.0, nodes=nodes, jobs=jobs)
    problem = Problem(state, PolluxParams())
    placed = np.array([[1, 0], [1, 1], [0, 1]])  # a gives one GPU of n1 to b
    decision = problem.decision(placed)
    a, b = decision.explain["j-a"], decision.explain["j-b"]
    assert a.move_factor is not None
    assert 0 < a.move_factor < 1
    assert a.limit == 2
    assert a.one_more is not None
    assert b.limit == 4
    assert b.one_more is not None, "3 GPUs, within its limit of 4"
    assert a.reference == (1, 2)
    # Two jobs named "ddp" of one user: the one that took the GPU is named with its id.
    assert "its GPUs went to ddp (j-b) (1 → 2 GPUs" in a.reason
    mine_only = Problem(
        dataclasses.replace(
            state, jobs=(jobs[0], dataclasses.replace(jobs[1], label="bert"), jobs[2])
        ),
        PolluxParams(),
    ).decision(placed)
    assert "its GPUs went to bert (1 → 2 GPUs" in mine_only.explain["j-a"].reason
    theirs = Problem(
        dataclasses.replace(state, jobs=(jobs[0], jobs[2], jobs[1])), PolluxParams()
    ).decision(np.array([[1, 0], [1, 1], [0, 1]]))
    assert "its GPUs went to another user's job j-c (1 → 2 GPUs" in theirs.explain["j-a"].reason
    assert "theirs" not in theirs.explain["j-a"].reason
