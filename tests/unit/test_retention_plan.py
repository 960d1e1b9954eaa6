"""Which finished jobs lose their side state and which their record (retention.plan_sweep)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from pollux.scheduler.config import RetentionConfig
from pollux.scheduler.retention import Swept, plan_sweep
from pollux.service.store import Entry
from pollux.v1 import types_pb2 as pb

NOW = 10_000_000.0
DAY = 86400.0
RETENTION = RetentionConfig(finished_grace_s=600, retention_days=30, profile_days=7)


def job(
    job_id: str,
    state: int,
    ended_ago: float | None,
    *,
    name: str | None = None,
    owner: str = "alice",
    created_ago: float | None = None,
) -> Entry[pb.Job]:
    record = pb.Job(id=job_id, state=state, owner=owner)  # type: ignore[arg-type]
    record.spec.name = name or job_id  # a name of its own unless said
    if created_ago is None:
        created_ago = (ended_ago or 0.0) + 3600
    record.create_time.FromNanoseconds(int((NOW - created_ago) * 1e9))
    if ended_ago is not None:
        record.finish_time.FromNanoseconds(int((NOW - ended_ago) * 1e9))
    return Entry(value=record, mod_revision=7, create_revision=1, lease=0)


def ids(entries: list[Entry[pb.Job]]) -> list[str]:
    return [e.value.id for e in entries]


def test_only_finished_jobs_past_their_grace_lose_side_state_and_past_retention_records() -> None:
    jobs = [
        job("running", pb.JOB_STATE_RUNNING, None),
        job("fresh", pb.JOB_STATE_SUCCEEDED, 5),
        job("graced", pb.JOB_STATE_FAILED, 700),
        job("old", pb.JOB_STATE_CANCELLED, 40 * DAY),
        job("no-finish-time", pb.JOB_STATE_SUCCEEDED, None),
    ]
    got = plan_sweep(jobs, NOW, retention=replace(RETENTION, profile_days=0), swept=Swept())
    assert ids(got.side_state) == ["graced"]
    assert ids(got.kept) == []
    assert ids(got.expired) == ["old"]


def test_the_newest_run_of_a_name_keeps_its_model_and_profile_until_superseded() -> None:
    jobs = [
        job("first", pb.JOB_STATE_SUCCEEDED, 2 * DAY, name="resnet"),
        job("second", pb.JOB_STATE_FAILED, 1 * DAY, name="resnet"),  # newest resnet: kept
        job("bert-old", pb.JOB_STATE_SUCCEEDED, 3 * DAY, name="bert"),
        job("bert-live", pb.JOB_STATE_RUNNING, None, name="bert", created_ago=600),
        job("bob-resnet", pb.JOB_STATE_SUCCEEDED, 3 * DAY, name="resnet", owner="bob"),
    ]
    got = plan_sweep(jobs, NOW, retention=RETENTION, swept=Swept())
    # A newer run (finished or running) supersedes; another owner's run of the name does not.
    assert sorted(ids(got.side_state)) == ["bert-old", "first"]
    assert sorted(ids(got.kept)) == ["bob-resnet", "second"]
    assert ids(got.expired) == []


def test_a_kept_profile_goes_when_superseded_when_its_window_ends_and_with_its_record() -> None:
    swept = Swept(kept={"second", "stale", "old"})
    jobs = [
        job("second", pb.JOB_STATE_SUCCEEDED, 1 * DAY, name="resnet"),
        job("third", pb.JOB_STATE_PENDING, None, name="resnet", created_ago=60),
        job("stale", pb.JOB_STATE_SUCCEEDED, 8 * DAY),  # newest of its name, past 7 days
        job("old", pb.JOB_STATE_SUCCEEDED, 31 * DAY),
        job("kept", pb.JOB_STATE_SUCCEEDED, 2 * DAY),
    ]
    got = plan_sweep(jobs, NOW, retention=RETENTION, swept=swept)
    assert sorted(ids(got.side_state)) == ["second", "stale"]
    assert ids(got.kept) == ["kept"]
    assert ids(got.expired) == ["old"]


def test_at_most_profile_max_jobs_keep_theirs_the_latest_finished_first() -> None:
    jobs = [job(f"j{i}", pb.JOB_STATE_SUCCEEDED, DAY + i * 3600) for i in range(5)]
    got = plan_sweep(jobs, NOW, retention=replace(RETENTION, profile_max_jobs=2), swept=Swept())
    assert sorted(ids(got.kept)) == ["j0", "j1"]
    assert sorted(ids(got.side_state)) == ["j2", "j3", "j4"]
    none = plan_sweep(jobs, NOW, retention=replace(RETENTION, profile_max_jobs=0), swept=Swept())
    assert ids(none.kept) == []


def test_jobs_already_swept_are_not_swept_again_but_still_expire() -> None:
    jobs = [
        job("graced", pb.JOB_STATE_SUCCEEDED, 700, name="x", created_ago=800),
        job("newer", pb.JOB_STATE_SUCCEEDED, 650, name="x", created_ago=700),
        job("old", pb.JOB_STATE_SUCCEEDED, 9e6),
    ]
    swept = Swept(whole={"graced", "old"}, kept={"newer"})
    got = plan_sweep(jobs, NOW, retention=RETENTION, swept=swept)
    assert ids(got.side_state) == []
    assert ids(got.kept) == []
    assert ids(got.expired) == ["old"]


names = st.sampled_from(["a", "b", "c"])
owners = st.sampled_from(["alice", "bob"])
ages = st.floats(min_value=0, max_value=40 * DAY)


@given(
    st.lists(
        st.tuples(names, owners, ages, st.booleans(), st.floats(min_value=0, max_value=DAY)),
        max_size=25,
    ),
    st.integers(min_value=0, max_value=5),
)
def test_every_finished_job_past_its_grace_goes_one_way_and_kept_ones_are_newest_and_bounded(
    rows: list[tuple[str, str, float, bool, float]], cap: int
) -> None:
    jobs = [
        job(
            f"j{i}",
            pb.JOB_STATE_SUCCEEDED if done else pb.JOB_STATE_RUNNING,
            age if done else None,
            name=name,
            owner=owner,
            created_ago=age + ran,
        )
        for i, (name, owner, age, done, ran) in enumerate(rows)
    ]
    got = plan_sweep(jobs, NOW, retention=replace(RETENTION, profile_max_jobs=cap), swept=Swept())
    planned = ids(got.side_state) + ids(got.kept) + ids(got.expired)
    assert len(planned) == len(set(planned)), "each job goes one way"
    graced = {
        e.value.id
        for e in jobs
        if e.value.HasField("finish_time")
        and NOW - e.value.finish_time.ToNanoseconds() / 1e9 >= RETENTION.finished_grace_s
    }
    assert set(planned) == graced
    assert len(got.kept) <= cap
    for kept in got.kept:
        same = [
            e.value
            for e in jobs
            if (e.value.owner, e.value.spec.name) == (kept.value.owner, kept.value.spec.name)
        ]
        newest = max(same, key=lambda j: (j.create_time.ToNanoseconds(), j.id))
        assert newest.id == kept.value.id, "only the newest run of a name keeps its profile"
        assert NOW - kept.value.finish_time.ToNanoseconds() / 1e9 < 600 + 7 * DAY


def test_the_profile_window_and_cap_are_checked() -> None:
    assert RETENTION.problems() == []
    assert RetentionConfig(profile_days=-1, profile_max_jobs=-5).problems() == [
        "profile_days: must be >= 0 (0 = not kept)",
        "profile_max_jobs: must be >= 0 (0 = not kept)",
    ]
