"""pollux-cli frictions a new user met: listing order, usage errors, hidden commands, pages.

The real parser and `main` run against fake clients (`main(connect=...)`); the name
resolution and the notes it sends are tested on a real scheduler
(tests/integration/test_reused_names.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from pollux.client import cli
from pollux.client.types import Job, JobSpec

T0 = datetime(2026, 11, 27, 9, 0, tzinfo=UTC)


def a_job(number: int, state: str, name: str = "train") -> Job:
    return Job(
        id=f"j-{number:010d}",
        spec=JobSpec(name, ("python", "t.py"), 32),
        request_id="r",
        state=state,
        history=(),
        create_time=T0 + timedelta(minutes=number),
        finish_time=None,
        cancel_requested=False,
        restarts=0,
        failures=0,
        allocation=None,
    )


class Jobs:
    """A fake client holding `jobs`: ListJobs filtered by state, newest first, as the API."""

    def __init__(self, jobs: list[Job]) -> None:
        self.jobs = jobs
        self.calls: list[tuple[tuple[str, ...], int | None]] = []

    def __enter__(self) -> Jobs:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def list_jobs(
        self, states: Sequence[str] | None = None, *, limit: int | None = None, **kw: Any
    ) -> Iterator[Job]:
        self.calls.append((tuple(states or ()), limit))
        chosen = [j for j in self.jobs if not states or j.state in states]
        chosen.sort(key=lambda j: j.create_time, reverse=True)
        return iter(chosen[:limit])


def run(client: Any, *argv: str) -> int:
    return cli.main(list(argv), connect=lambda args: client)


def listed_ids(out: str) -> list[str]:
    return [line.split()[0] for line in out.splitlines()[1:] if line.startswith("j-")]


def test_ls_lists_active_jobs_before_finished_ones(capsys: pytest.CaptureFixture[str]) -> None:
    # Oldest first: two long runs, then many short ones that finished after them.
    jobs = [a_job(0, "RUNNING"), a_job(1, "PENDING")]
    jobs += [a_job(n, "SUCCEEDED") for n in range(2, 12)]
    jobs += [a_job(12, "RESCALING"), a_job(13, "FAILED")]
    client = Jobs(jobs)
    assert run(client, "ls", "--limit", "5") == 0
    out, err = capsys.readouterr()
    assert listed_ids(out) == [
        "j-0000000012",  # active, newest first
        "j-0000000001",
        "j-0000000000",
        "j-0000000013",  # then finished, newest first
        "j-0000000011",
    ]
    assert "active ones first" in err, "the hint says more jobs were left out, and how"
    active, rest = client.calls
    assert active == (("PENDING", "ALLOCATED", "RUNNING", "RESCALING"), 6)
    # Then every job (a state this client does not know included), as many as may repeat.
    assert rest == ((), 6)

    # --state keeps its meaning; the groups only order what it selects.
    assert run(Jobs(jobs), "ls", "--state", "failed", "--state", "running", "--all") == 0
    assert listed_ids(capsys.readouterr().out) == ["j-0000000000", "j-0000000013"]


def test_a_subcommands_usage_error_prints_that_subcommands_usage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run(None, "ls", "--bogus") == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("usage: pollux-cli ls ")
    assert "pollux-cli ls: error: unrecognized arguments: --bogus" in err
    assert run(None, "logs", "job", "--tail", "3", "--lines") == cli.EXIT_USAGE
    assert "pollux-cli logs: error: unrecognized arguments: --lines" in capsys.readouterr().err
    # The hints for flags from other schedulers still come with it.
    assert run(None, "submit", "--gpus", "2", "--", "t") == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("usage: pollux-cli submit ")
    assert "--max-replicas" in err


def test_hidden_commands_are_neither_listed_nor_suggested(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run(None, "lss") == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "'ls'" in err
    assert "did you mean 'ls'?" in err
    for hidden in cli.HIDDEN_COMMANDS:
        assert hidden not in err
        assert run(None, hidden + "x") == cli.EXIT_USAGE
        err = capsys.readouterr().err
        assert hidden not in err.replace(f"'{hidden}x'", "")
        assert "did you mean" not in err


def test_a_jobs_dashboard_page_is_its_fragment_and_follows_a_sign_in() -> None:
    url = "https://127.0.0.1:8443/"
    assert cli.dashboard_address(url) == url
    assert cli.dashboard_address(url, "/jobs/j-0123456789") == f"{url}#/jobs/j-0123456789"
    assert cli.dashboard_address(url, "", "pollux_ab_cd") == f"{url}#token=pollux_ab_cd"
    assert (
        cli.dashboard_address(url, "/jobs/j-0123456789", "pollux_ab_cd")
        == f"{url}#token=pollux_ab_cd&next=/jobs/j-0123456789"
    )


class DashboardClient(Jobs):
    def __init__(self) -> None:
        super().__init__([a_job(7, "RUNNING", "ddp-plain")])
        self.asked: list[str] = []

    def cluster_status(self) -> Any:
        return SimpleNamespace(dashboard_url="https://h:1/")

    def get_job(self, reference: str) -> Job:
        self.asked.append(reference)
        return self.jobs[0]


def test_dashboard_job_prints_its_page(capsys: pytest.CaptureFixture[str]) -> None:
    client = DashboardClient()
    assert run(client, "dashboard", "ddp-plain") == 0
    assert capsys.readouterr().out.strip() == "https://h:1/#/jobs/j-0000000007"
    assert client.asked == ["ddp-plain"]

    def connect(args: Any) -> DashboardClient:
        args.token = "pollux_ab_cd"
        return client

    assert cli.main(["dashboard", "ddp-plain", "--link"], connect=connect) == 0
    out = capsys.readouterr().out.strip()
    assert out == "https://h:1/#token=pollux_ab_cd&next=/jobs/j-0000000007"


class NotingClient(DashboardClient):
    """A client whose calls bring the server's note on which job a name meant."""

    on_notice: Any = None

    def get_job(self, reference: str) -> Job:
        self.on_notice("ddp-plain: the newest of 3 jobs of that name, j-0000000007 (SUCCEEDED)")
        return super().get_job(reference)


def test_the_servers_note_on_a_reused_name_goes_to_stderr_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    client = NotingClient()
    assert run(client, "dashboard", "ddp-plain") == 0
    out, err = capsys.readouterr()
    assert out.strip() == "https://h:1/#/jobs/j-0000000007", "stdout stays the answer"
    assert err == "ddp-plain: the newest of 3 jobs of that name, j-0000000007 (SUCCEEDED)\n"
    say = cli.notice_printer(SimpleNamespace(raw=False))
    say("a \x1b[2J note")
    say("a \x1b[2J note")
    assert capsys.readouterr().err == "a \\x1b[2J note\n", "once, and escaped"
