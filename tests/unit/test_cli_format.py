"""Rendering for people (aligned tables and views) and programs (JSON and YAML)."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta

import pytest
import yaml

from pollux.client import format as fmt
from pollux.client.types import (
    Allocation,
    Alternative,
    BatchChoice,
    BatchConfig,
    ClusterStatus,
    Explanation,
    Holder,
    Job,
    JobDecision,
    JobEstimate,
    JobSpec,
    Member,
    ModelSummary,
    NodeStatus,
    RoundInfo,
    ThroughputParams,
    Transition,
)

T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
NOW = T0 + timedelta(minutes=30)


def running_job() -> Job:
    spec = JobSpec(
        "cifar",
        ("python", "train.py", "--msg", "hello world"),
        128,
        max_batch_size=4096,
        env={"SEED": "7"},
        labels={"team": "vision"},
    )
    return Job(
        id="j-3f9a1c2b",
        spec=spec,
        request_id="req-1",
        state="RUNNING",
        history=(
            Transition("PENDING", T0, "submitted"),
            Transition("ALLOCATED", T0 + timedelta(seconds=60), "allocated 4 GPUs (round 3)"),
            Transition("RUNNING", T0 + timedelta(seconds=75), "all 4 replicas running"),
        ),
        create_time=T0,
        finish_time=None,
        cancel_requested=False,
        restarts=1,
        failures=0,
        allocation=Allocation(("n1", "n1", "n2", "n2"), 2, T0 + timedelta(seconds=60), 3),
        attained_gpu_seconds=7200.0,
    )


def pending_job() -> Job:
    return Job(
        id="j-0000beef",
        spec=JobSpec("bert-large", ("python", "bert.py"), 64),
        request_id="r2",
        state="PENDING",
        history=(),
        create_time=NOW - timedelta(seconds=30),
        finish_time=None,
        cancel_requested=True,
        restarts=0,
        failures=0,
        allocation=None,
    )


def cluster() -> ClusterStatus:
    def node(name: str, used: int, jobs: tuple[str, ...]) -> NodeStatus:
        return NodeStatus(name, f"10.0.0.{name[-1]}:7071", 4, "NVIDIA H100", {}, T0, used, jobs)

    return ClusterStatus(
        nodes=(
            node("n1", 2, ("j-3f9a1c2b",) * 2),
            node("n2", 2, ("j-3f9a1c2b",) * 2),
            node("n3", 0, ()),
        ),
        agents=(Member("agent-1", "10.0.0.1:7072"),),
        leader_id="scheduler-a",
        leader_address="10.0.0.1:7070",
        total_gpus=12,
        allocated_gpus=4,
        jobs_by_state={"SUCCEEDED": 3, "RUNNING": 1, "PENDING": 1, "FAILED": 0},
        last_round=17,
        answered_by="scheduler-b",
    )


def explanation() -> Explanation:
    job = running_job()
    return Explanation(
        job=job,
        decision=JobDecision(job.id, job.allocation.nodes, 3.52, 0.97, "best goodput", True),
        round=RoundInfo(3, T0 + timedelta(seconds=60), "pollux", 12.5, 1234, "scheduler-a"),
        model=ModelSummary(
            "agent-1",
            37,
            4,
            ThroughputParams(0.02, 0.0007, 0.15, 0.01, 0.03, 0.004, 2.0, "ring"),
            1.0,
            50.0,
            128,
            4096,
            16,
            512,
            T0,
        ),
        batch=BatchConfig(256, 2, 2048, 3.4),
    )


# ---- building blocks -------------------------------------------------------------------------


def test_table_pads_columns_to_the_widest_cell():
    text = fmt.table(("A", "LONG HEADER"), [("wide cell", 1), ("x", 22)])
    assert text.splitlines() == [
        "A          LONG HEADER",
        "wide cell  1",
        "x          22",
    ]


def test_table_with_no_rows_is_its_header():
    assert fmt.table(("ID", "NAME"), []) == "ID  NAME"


@pytest.mark.parametrize(
    ("seconds", "want"),
    [(0, "0s"), (59, "59s"), (60, "1m"), (3599, "59m"), (3600, "1h"), (86400 * 3, "3d")],
)
def test_age_is_short(seconds, want):
    assert fmt.age(NOW - timedelta(seconds=seconds), NOW) == want


def test_age_of_the_unknown_or_the_future():
    assert fmt.age(None, NOW) == "-"
    assert fmt.age(NOW + timedelta(seconds=5), NOW) == "0s"


def test_timestamp_is_utc():
    assert fmt.timestamp(None) == "-"
    east = datetime(2024, 5, 1, 14, 0, tzinfo=UTC).astimezone(
        datetime.now().astimezone().tzinfo  # any zone: the output is UTC
    )
    assert fmt.timestamp(east) == "2024-05-01 14:00:00Z"


def test_counted_keeps_first_appearance_order():
    assert fmt.counted(["n2", "n1", "n2"]) == "n2×2, n1"
    assert fmt.counted([]) == "-"


# ---- views -----------------------------------------------------------------------------------


def test_jobs_table():
    lines = fmt.jobs_table([running_job(), pending_job()], NOW).splitlines()
    assert lines[0].split() == list(fmt.JOB_HEADERS)
    assert lines[1].split() == [
        "j-3f9a1c2b",
        "cifar",
        "-",
        "-",
        "RUNNING",
        "4",
        "2",
        "1",
        "0",
        "30m",
        "-",  # no estimate: the job declares no size
    ]
    # A pending cancellation is marked with a star.
    assert lines[2].split() == [
        "j-0000beef",
        "bert-large",
        "-",
        "-",
        "PENDING*",
        "0",
        "0",
        "0",
        "0",
        "30s",
        "-",
    ]
    column = lines[0].index("STATE")
    assert lines[1][column:].startswith("RUNNING")
    assert lines[2][column:].startswith("PENDING*")


def test_job_details_shows_spec_allocation_and_history_with_reasons():
    text = fmt.job_details(running_job(), NOW)
    assert "Job:           j-3f9a1c2b" in text
    assert "State:         RUNNING" in text
    assert "Command:       python train.py --msg 'hello world'" in text
    assert "Allocation:    4 GPUs on n1×2, n2×2 (generation 2, round 3" in text
    assert "Batch:         initial 128, max 4096, per-GPU 1..4096" in text
    assert "Env:           SEED=7" in text
    assert "Failures:      0 (tolerates 3)" in text
    history = text.split("History:\n")[1].splitlines()
    assert history[0].split() == ["TIME", "STATE", "REASON"]
    assert history[2].endswith("ALLOCATED  allocated 4 GPUs (round 3)")


def test_job_details_of_a_pending_job():
    text = fmt.job_details(pending_job(), NOW)
    assert "State:         PENDING (cancel requested)" in text
    assert "Allocation:    no GPUs" in text
    assert "Labels:        -" in text


def test_explanation_text_has_decision_round_batch_and_model():
    text = fmt.explanation_text(explanation())
    assert "Speedup:          3.520" in text
    assert "Restart penalty:  0.970" in text
    assert "Reason:           best goodput" in text
    assert "Change:           changed this round" in text
    assert "Round:            3 at 2024-05-01 12:01:00Z by scheduler-a (policy pollux" in text
    assert "Batch:            256 per GPU × 2 steps = total 2048 (predicted speedup 3.400)" in text
    assert "Model:            by agent-1 from 37 observations" in text
    assert "gamma 2 (ring sync)" in text
    assert "Seeded from" not in text
    seeded = dataclasses.replace(
        explanation(),
        model=dataclasses.replace(explanation().model, seeded_from="j-earlier"),
    )
    assert "Seeded from:      j-earlier" in fmt.explanation_text(seeded)


def test_explanation_text_names_a_placement_round():
    placed = dataclasses.replace(
        explanation(), round=dataclasses.replace(explanation().round, placement=True)
    )
    text = fmt.explanation_text(placed)
    assert "by scheduler-a (placement round, policy pollux" in text
    assert "placement round" not in fmt.explanation_text(explanation())


def test_explanation_text_before_the_first_round():
    text = fmt.explanation_text(Explanation(pending_job(), None, None, None, None))
    assert "Decision:  none yet" in text
    assert "Batch:     not modelled yet" in text
    assert "Model:     none published yet" in text


def test_nodes_table():
    lines = fmt.nodes_table(cluster()).splitlines()
    assert lines[0].split() == ["NODE", "GPUS", "FREE", "TYPE", "ADDRESS", "JOBS"]
    assert lines[1].split() == ["n1", "2/4", "2", "NVIDIA", "H100", "10.0.0.1:7071", "j-3f9a1c2b×2"]
    assert lines[3].split()[-1] == "-"


def test_gpus_of_jobs_the_caller_may_not_see_are_counted_without_ids():
    # The server sends "" for another user's job: `nodes` counts those GPUs under one label.
    node = NodeStatus("n1", "10.0.0.1:7071", 4, "t4", {}, T0, 3, ("j-mine", "", ""))
    assert fmt.node_row(node)[-1] == f"j-mine, {fmt.OTHERS}×2"


def test_top_shows_summary_nodes_and_unfinished_jobs():
    done = dataclasses.replace(running_job(), id="j-done", state="SUCCEEDED")
    text = fmt.top_text(cluster(), [running_job(), pending_job(), done], NOW)
    summary = text.splitlines()[:2]
    assert summary[0].startswith("leader scheduler-a (10.0.0.1:7070)  round 17  GPUs 4/12 used")
    # States in lifecycle order, zero counts left out.
    assert summary[1] == "jobs PENDING 1  RUNNING 1  SUCCEEDED 3"
    assert "j-3f9a1c2b" in text
    assert "j-done" not in text


def test_summary_says_when_no_replica_leads():
    status = ClusterStatus((), (), "", "", 0, 0, {}, 0, "x")
    assert fmt.cluster_summary(status).splitlines() == [
        "leader none (!)  round 0  GPUs 0/0 used  nodes 0  agents 0",
        "jobs none",
    ]


# ---- JSON and YAML ---------------------------------------------------------------------------


def test_json_is_the_dataclass_fields_with_iso_times():
    data = json.loads(fmt.render_json(running_job()))
    assert data["id"] == "j-3f9a1c2b"
    assert data["spec"]["command"] == ["python", "train.py", "--msg", "hello world"]
    assert data["create_time"] == "2024-05-01T12:00:00+00:00"
    assert data["finish_time"] is None
    assert data["allocation"]["nodes"] == ["n1", "n1", "n2", "n2"]
    assert data["history"][1] == {
        "state": "ALLOCATED",
        "time": "2024-05-01T12:01:00+00:00",
        "reason": "allocated 4 GPUs (round 3)",
    }


def test_yaml_matches_json():
    value = explanation()
    assert yaml.safe_load(fmt.render_yaml(value)) == json.loads(fmt.render_json(value))


def test_yaml_keeps_field_order():
    keys = [line.split(":")[0] for line in fmt.render_yaml(pending_job()).splitlines()]
    assert keys[:3] == ["id", "spec", "  name"]


def test_lists_and_named_tuples_render():
    from pollux.client.client import JobEvent

    data = json.loads(fmt.render_json([JobEvent(pending_job(), True)]))
    assert data[0]["deleted"] is True
    assert data[0]["job"]["id"] == "j-0000beef"


def test_render_data_picks_the_format():
    assert fmt.render_data({"a": 1}, "json") == '{\n  "a": 1\n}'
    assert fmt.render_data({"a": 1}, "yaml") == "a: 1"


def test_explanation_text_shows_the_counterfactuals_with_units():
    base = explanation()
    text = fmt.explanation_text(
        dataclasses.replace(
            base,
            last_change=Transition("RESCALING", T0, "scaled 1 → 2 GPUs"),
            alternatives=(
                Alternative(3, 2, 0.9, 120.0),
                Alternative(4, 2, 1.5, 200.0),
                Alternative(5, 2, 1.8, 240.0),
            ),
            holders=(Holder("j-other", 2, 1.2, 0.8),),
            batch_choice=BatchChoice(256, 128, 0, 250.0, 0.8, 200.0),
        )
    )
    assert "Last change:" in text
    assert "RESCALING: scaled 1 → 2 GPUs" in text
    assert "total 256 samples (128 per GPU × 1 micro-batch): throughput 250.0 samples/s" in text
    assert "efficiency 0.800 = goodput 200.0 samples/s" in text
    assert "+0.300 speedup for this job (4 → 5 GPUs), predicted now" in text
    assert "j-other: its last of 2 GPUs is worth 0.400 speedup to it (1.200 → 0.800)" in text
    assert "SPEEDUP (× fair-share goodput)" in text
    assert "GOODPUT (samples/s)" in text
    assert "4 (now)" in text
    assert text.rstrip().count("raises its objective") == 1


def test_explain_names_the_objective_the_server_reports():
    base = dataclasses.replace(
        explanation(),
        alternatives=(Alternative(4, 2, 1.5, 200.0), Alternative(5, 2, 1.8, 240.0)),
        holders=(Holder("j-other", 2, 1.2, 0.8),),
    )
    said = fmt.explanation_text(dataclasses.replace(base, objective="the sum of log speedups"))
    assert "the policy moves a GPU only where it raises its objective (the sum of log " in said
    silent = fmt.explanation_text(base)  # an older server: no words for what it maximises
    assert "raises its objective\n" in silent + "\n"
    assert "p = -1" not in silent


def test_a_pending_job_is_told_its_place_in_the_queue():
    text = fmt.explanation_text(
        Explanation(pending_job(), None, None, None, None, queue_position=2, pending_jobs=5)
    )
    assert "Queue:" in text
    assert "2nd of 5 pending jobs (by submission time)" in text


def test_a_job_with_an_estimate_shows_it_in_ls_and_describe():
    job = dataclasses.replace(running_job(), estimated_completion=NOW + timedelta(minutes=12))
    row = fmt.jobs_table([job], NOW).splitlines()[1].split()
    assert row[-2:] == ["in", "12m"]
    assert "Expected end:  2024-05-01 12:42:00Z (in 12m; declared remaining work" in (
        fmt.job_details(job, NOW)
    )
    late = dataclasses.replace(job, estimated_completion=NOW - timedelta(minutes=1))
    assert fmt.jobs_table([late], NOW).splitlines()[1].split()[-1] == "due"


def test_an_estimate_says_when_and_what_it_assumed():
    found = JobEstimate(4000.0, T0, "j-earlier", 1234.5, 17)
    text = fmt.estimate_text(found, NOW)
    assert "Predicted JCT:  1h06m (if submitted now)" in text
    assert "Completion:     2024-05-01 12:00:00Z" in text
    assert "size (1234.5 M0-steps) of j-earlier, no further arrivals" in text
    assert "Forecast:       17 rounds of the policy" in text
