"""Users in the simulator: owners, a flooding user, and each user's mean JCT in a run."""

import json
from pathlib import Path
from typing import Any

import pytest

from pollux.policy.tiresias import TiresiasPolicy
from pollux.sim.application import load_published_applications
from pollux.sim.cli import main
from pollux.sim.runner import per_user
from pollux.sim.simulator import SimConfig, simulate
from pollux.sim.traces import default_data_root
from pollux.sim.workload import Flood, WorkloadJob, assign_owners

APPS = load_published_applications(default_data_root() / "traces")

WORKLOAD = [
    WorkloadJob("ncf-0", 0, "ncf", 1, 32768),
    WorkloadJob("cifar10-1", 30, "cifar10", 2, 2048),
    WorkloadJob("ncf-2", 60, "ncf", 1, 32768),
    WorkloadJob("cifar10-3", 200, "cifar10", 2, 2048),
    WorkloadJob("ncf-4", 400, "ncf", 1, 32768),
]


def write_workload(path: Path, jobs: list[WorkloadJob]) -> Path:
    lines = [f"{j.name},{j.submission_time:g},{j.application},{j.num_replicas},{j.batch_size}\n"
             for j in jobs]  # fmt: skip
    path.write_text("name,time,application,num_replicas,batch_size\n" + "".join(lines))
    return path


def test_owners_round_robin_balance_and_hash_depends_on_the_name_only():
    robin = assign_owners(WORKLOAD, 2)
    assert [j.owner for j in robin] == ["user-0", "user-1", "user-0", "user-1", "user-0"]
    hashed = {j.name: j.owner for j in assign_owners(WORKLOAD, 3, how="hash")}
    again = {j.name: j.owner for j in assign_owners(WORKLOAD[::-1], 3, how="hash")}
    assert hashed == again
    assert set(hashed.values()) <= {"user-0", "user-1", "user-2"}
    with pytest.raises(ValueError, match="at least one owner"):
        assign_owners(WORKLOAD, 0)
    with pytest.raises(ValueError, match="unknown assignment"):
        assign_owners(WORKLOAD, 2, how="random")  # type: ignore[arg-type]


def test_a_flood_copies_the_workloads_jobs_at_one_time_after_those_of_its_time():
    flood = Flood.parse("7@30")
    assert flood == Flood(7, 30.0)
    jobs = flood.added_to(WORKLOAD)
    added = [j for j in jobs if j.owner == "flood"]
    assert [j.name for j in added] == [f"flood-{i}" for i in range(7)]
    assert {j.submission_time for j in added} == {30.0}
    # Cycled copies of the workload's jobs, in its order.
    assert [j.application for j in added] == [WORKLOAD[i % 5].application for i in range(7)]
    assert [j.name for j in jobs[:3]] == ["ncf-0", "cifar10-1", "flood-0"]
    assert [j.submission_time for j in jobs] == sorted(j.submission_time for j in jobs)
    assert Flood.parse("3") == Flood(3, 0.0)


@pytest.mark.parametrize(
    ("text", "message"),
    [("x@1", "expected COUNT"), ("0@1", "≥ 1 job"), ("3@-1", "time ≥ 0"), ("3@inf", "time ≥ 0")],
)
def test_a_bad_flood_is_refused_with_its_form(text: str, message: str):
    with pytest.raises(ValueError, match=message):
        Flood.parse(text)


def test_a_flood_refuses_an_empty_workload_and_a_name_clash():
    with pytest.raises(ValueError, match="has none"):
        Flood(2).added_to([])
    with pytest.raises(ValueError, match="choose another owner"):
        Flood(2).added_to([WorkloadJob("flood-1", 0, "ncf", 1, 32768)])
    with pytest.raises(ValueError, match="non-empty owner"):
        Flood(2, owner="")


def test_per_user_means_pool_every_workloads_jobs():
    jcts = {"w1": {"a": 10.0, "b": 30.0}, "w2": {"a": 20.0, "c": 5.0}}
    owners = {"w1": {"a": "user-1", "b": "flood"}, "w2": {"a": "user-1", "c": "user-0"}}
    assert per_user(jcts, owners) == {
        "flood": {"jobs": 1, "mean_jct": 30.0},
        "user-0": {"jobs": 1, "mean_jct": 5.0},
        "user-1": {"jobs": 2, "mean_jct": 15.0},
    }


def run_cli(tmp_path: Path, name: str, *extra: str) -> tuple[dict, dict]:
    workload = write_workload(tmp_path / "small.csv", WORKLOAD)
    out = tmp_path / name
    argv = ["run", "--policy", "tiresias", "--nodes", "1", "--output", str(out), *extra]
    assert main([*argv, str(workload)]) == 0
    return (
        json.loads((out / "summary.json").read_text()),
        json.loads((out / "run.json").read_text()),
    )


def test_a_run_with_users_reports_each_users_mean_jct(tmp_path: Path, capsys):
    summary, info = run_cli(tmp_path, "users", "--owners", "2", "--flood", "4@10")
    users = summary["users"]
    assert {u: f["jobs"] for u, f in users.items()} == {"flood": 4, "user-0": 3, "user-1": 2}
    jcts = summary["jcts"]["small"]
    assert len(jcts) == 9
    assert users["flood"]["mean_jct"] == pytest.approx(
        sum(jcts[f"flood-{i}"] for i in range(4)) / 4
    )
    assert (info["owners"], info["flood"]) == (2, {"jobs": 4, "at": 10.0, "owner": "flood"})
    out = capsys.readouterr().out
    assert f"user flood: mean JCT {users['flood']['mean_jct']:.1f} s over 4 jobs" in out


def test_a_flood_alone_makes_the_workloads_jobs_user_0s(tmp_path: Path):
    summary, _ = run_cli(tmp_path, "flood", "--flood", "2")
    assert {u: f["jobs"] for u, f in summary["users"].items()} == {"flood": 2, "user-0": 5}


def test_one_owner_runs_and_reports_as_published(tmp_path: Path):
    published, _ = run_cli(tmp_path, "published")
    one, info = run_cli(tmp_path, "one", "--owners", "1")
    assert one == published  # the same JCTs, and no per-user figures
    assert set(one) == {"jcts", "avgs", "mean"}
    assert info["owners"] == 1


def test_the_command_line_refuses_a_bad_flood(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--flood", "many", "--output", "x", "y.csv"])
    assert exit_info.value.code == 2
    assert "expected COUNT[@SECONDS]" in capsys.readouterr().err


@pytest.mark.parametrize("fair", [True, False])
def test_an_events_round_gives_the_other_user_a_gpu_at_once_only_with_fairness(fair: bool):
    # "a" holds both GPUs and queues four more jobs; "b" submits one at 100 s. Its event's
    # placement round preempts one of a's running jobs for b's (b is owed a first GPU).
    jobs = [WorkloadJob(f"a-{i}", 0, "cifar10", 1, 2048, owner="a") for i in range(6)]
    jobs.append(WorkloadJob("b-0", 100, "cifar10", 1, 2048, owner="b"))
    policy = TiresiasPolicy(user_fairness=fair)
    config = SimConfig(nodes=1, gpus_per_node=2, event_delay=1.0, event_rounds="place")
    rounds: list[dict[str, Any]] = []
    simulate(jobs, APPS, policy, config, on_round=rounds.append)
    first = next(r for r in rounds if any(j["name"] == "b-0" for j in r["submitted_jobs"]))
    assert first["timestamp"] == 101.0  # the event's round
    held = {j["name"] for j in first["submitted_jobs"] if j["allocation"]}
    assert ("b-0" in held) is fair
    assert len(held) == 2, "one GPU each: a keeps the other"
    # A placement round: the periodic rounds stay on their 60 s grid either way.
    assert 120.0 in [r["timestamp"] for r in rounds]
