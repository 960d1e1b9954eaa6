"""pollux-cli's counts read right: one GPU, two GPUs, 1st of 1 pending job, 1 micro-batch.

Every test runs the real renderers (`pollux.client.format`) on client dataclasses.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from pollux.client import format as fmt
from pollux.client.types import (
    Allocation,
    BatchChoice,
    BatchConfig,
    Explanation,
    Holder,
    Job,
    JobDecision,
    JobEstimate,
    JobSpec,
    ModelSummary,
)

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("args", "want"),
    [
        ((1, "GPU"), "1 GPU"),
        ((2, "GPU"), "2 GPUs"),
        ((0, "job"), "0 jobs"),
        ((1, "micro-batch", "micro-batches"), "1 micro-batch"),
        ((3, "micro-batch", "micro-batches"), "3 micro-batches"),
    ],
)
def test_plural(args: tuple[Any, ...], want: str) -> None:
    assert fmt.plural(*args) == want


def a_job(nodes: tuple[str, ...]) -> Job:
    return Job(
        id="j-1",
        spec=JobSpec("train", ("python", "t.py"), 64),
        request_id="r",
        state="RUNNING" if nodes else "PENDING",
        history=(),
        create_time=T0,
        finish_time=None,
        cancel_requested=False,
        restarts=1,
        failures=0,
        allocation=Allocation(nodes, 1, T0, 2) if nodes else None,
    )


def test_one_of_everything_is_singular() -> None:
    model = ModelSummary("agent-0", 1, 1, None, 0.0, 0.0, 64, 64, 1, 64, T0)
    explanation = Explanation(
        a_job(()),
        JobDecision("j-1", ("n1",), 1.0, 1.0, "fair share", True),
        None,
        model,
        BatchConfig(64, 1, 64, 1.0),
        holders=(Holder("j-2", 1, 1.0, 0.0),),
        batch_choice=BatchChoice(64, 64, 0, 10.0, 1.0, 10.0),
        queue_position=1,
        pending_jobs=1,
    )
    text = fmt.explanation_text(explanation)
    for want in (
        "Chosen:           1 GPU on n1\n",
        "64 per GPU × 1 step = total 64",
        "from 1 observation, profiled up to 1 replica,",
        "1st of 1 pending job (by submission time)",
        "(64 per GPU × 1 micro-batch)",
        "j-2: its last of 1 GPU is worth",
    ):
        assert want in text, text
    assert fmt.allocation_text(Allocation(("n1",), 1, T0, 2)).startswith("1 GPU on n1 ")
    estimate = fmt.estimate_text(JobEstimate(60.0, T0, "j-0", 10.0, 1), T0)
    assert "1 round of the policy" in estimate


def test_more_than_one_is_plural() -> None:
    from pollux.client.types import Alternative

    job = a_job(("n1", "n2"))
    explanation = Explanation(
        job,
        JobDecision("j-1", ("n1", "n2"), 1.0, 1.0, "", False),
        None,
        ModelSummary("agent-0", 5, 2, None, 0.0, 0.0, 64, 64, 1, 64, T0),
        BatchConfig(64, 2, 256, 1.0),
        alternatives=(Alternative(2, 2, 1.0, 0.0), Alternative(3, 2, 1.2, 0.0)),
        batch_choice=BatchChoice(256, 64, 1, 10.0, 1.0, 10.0),
        queue_position=2,
        pending_jobs=3,
    )
    text = fmt.explanation_text(explanation)
    for want in (
        "2 GPUs on n1, n2",
        "× 2 steps = total 256",
        "from 5 observations, profiled up to 2 replicas,",
        "2nd of 3 pending jobs",
        "2 micro-batches",
        "(2 → 3 GPUs)",
    ):
        assert want in text, text


def test_one_more_gpu_from_none_is_one_gpu() -> None:
    from pollux.client.types import Alternative

    explanation = Explanation(
        a_job(()),
        None,
        None,
        None,
        None,
        alternatives=(Alternative(0, 0, 0.0, 0.0), Alternative(1, 1, 0.5, 0.0)),
    )
    assert "(0 → 1 GPU)" in fmt.explanation_text(explanation)
