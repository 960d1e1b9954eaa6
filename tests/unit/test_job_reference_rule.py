"""The API's job-reference rule (`pollux.service.mirror.resolve_reference`), on summaries.

A reused name means the caller's active job of that name, else their newest; only two
active jobs of one name are ambiguous; an id prefix of several jobs stays ambiguous; other
users' jobs never count (`named` keeps the caller's own).
"""

from __future__ import annotations

from pollux.service.mirror import JobSummary, named, resolve_reference
from pollux.v1 import types_pb2 as pb

DONE, RUNNING, PENDING = pb.JOB_STATE_SUCCEEDED, pb.JOB_STATE_RUNNING, pb.JOB_STATE_PENDING


def summary(job_id: str, name: str, state: int, at: int, owner: str = "alice") -> JobSummary:
    return JobSummary((at, job_id), state, name, (), owner)


def test_a_name_of_finished_jobs_means_the_newest() -> None:
    jobs = [summary(f"j-00000000{i}a", "ddp", DONE, i) for i in range(3)]
    got = resolve_reference(named(jobs, "ddp", "alice"), "ddp")
    assert got.job is not None
    assert got.job.order[1] == "j-000000002a"
    assert got.by_name
    assert len(got.matches) == 3
    assert not got.ambiguous


def test_the_one_active_job_of_a_name_wins_over_newer_finished_ones() -> None:
    jobs = [
        summary("j-0000000001", "ddp", RUNNING, 1),
        summary("j-0000000002", "ddp", DONE, 2),
        summary("j-0000000003", "ddp", DONE, 3),
    ]
    got = resolve_reference(named(jobs, "ddp", "alice"), "ddp")
    assert got.job is not None
    assert got.job.order[1] == "j-0000000001"


def test_two_active_jobs_of_a_name_are_ambiguous_and_listed_newest_first() -> None:
    jobs = [
        summary("j-0000000001", "ddp", RUNNING, 1),
        summary("j-0000000002", "ddp", PENDING, 2),
        summary("j-0000000003", "ddp", DONE, 3),
    ]
    got = resolve_reference(named(jobs, "ddp", "alice"), "ddp")
    assert got.job is None
    assert [j.order[1] for j in got.ambiguous] == ["j-0000000002", "j-0000000001"]


def test_an_id_prefix_of_several_jobs_stays_ambiguous_whatever_their_states() -> None:
    jobs = [summary("j-abc0000001", "a", DONE, 1), summary("j-abc0000002", "b", DONE, 2)]
    got = resolve_reference(named(jobs, "abc", "alice"), "abc")
    assert got.job is None
    assert not got.by_name
    assert len(got.ambiguous) == 2
    one = resolve_reference(named(jobs, "j-abc0000001", "alice"), "j-abc0000001")
    assert one.job is not None
    assert one.job.order[1] == "j-abc0000001"


def test_a_name_resolves_only_among_the_callers_jobs() -> None:
    jobs = [
        summary("j-0000000001", "ddp", DONE, 1, owner="alice"),
        summary("j-0000000002", "ddp", RUNNING, 2, owner="bob"),
        summary("j-0000000003", "ddp", RUNNING, 3, owner="bob"),
    ]
    mine = resolve_reference(named(jobs, "ddp", "alice"), "ddp")
    assert mine.job is not None
    assert mine.job.order[1] == "j-0000000001"
    assert len(mine.matches) == 1, "bob's jobs are not counted"
    assert resolve_reference(named(jobs, "ddp", "carol"), "ddp").job is None
    admin = resolve_reference(named(jobs, "ddp", None), "ddp")  # an admin sees everyone's
    assert admin.job is None
    assert len(admin.ambiguous) == 2
