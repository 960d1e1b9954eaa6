"""pollux-cli prints what others wrote (job output, reasons, names, labels) without obeying it.

Every command runs through `cli.main` with its real parser and renderers against a fake client
whose job is full of escape sequences: the output must hold none of them but as visible text
(``\\x1b``), keep its layout (a field stays on its line), and with ``--raw`` be as it was
written. JSON and YAML carry the same data with their own escapes. The real thing, a job on a
real cluster writing escapes, is tests/e2e/test_cli_terminal.py.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml
from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pollux.client import cli
from pollux.client import format as fmt
from pollux.client.client import LogChunk
from pollux.client.errors import NotFoundError
from pollux.client.types import Allocation, Job, JobSpec, Transition
from pollux.v1 import types_pb2 as pb

T0 = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
ESC = "\x1b"
CLEAR = f"{ESC}[2J{ESC}[H"
CLIPBOARD = f"{ESC}]52;c;cm0gLXJmIH4={ESC}\\"
TITLE = f"{ESC}]0;pwned\x07"
LINK = f"{ESC}]8;;https://evil.example/\x07docs{ESC}]8;;\x07"
SNEAKY = f"{CLEAR}{CLIPBOARD}{TITLE}{LINK}\x9b31m\u202eexe.doc\u202c\rok\x08"


def controls(text: str, allowed: str = "\n") -> list[str]:
    """The control characters in `text` (Unicode's Cc, Zl, Zp, bidi controls), but `allowed`."""
    bidi = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
    return [
        c
        for c in text
        if c not in allowed and (unicodedata.category(c) in ("Cc", "Cs", "Zl", "Zp") or c in bidi)
    ]


def a_job(text: str = SNEAKY, state: str = "FAILED") -> Job:
    """A job whose every free-text field holds `text`."""
    return Job(
        id="j-0123456789",
        spec=JobSpec(
            "train",
            ("python", "-c", f"print({text!r})", text),
            32,
            env={"MODE": text, f"K{text}": "v"},
            labels={"team": text},
            working_dir=f"/work/{text}",
        ),
        request_id=text,
        state=state,
        history=(
            Transition("PENDING", T0, "submitted"),
            Transition("FAILED", T0, f"replica 0 exited 1: {text}"),
        ),
        create_time=T0,
        finish_time=T0,
        cancel_requested=False,
        restarts=0,
        failures=2,
        allocation=Allocation((f"node-{text}",), 1, T0, 3),
        owner=f"mallory{text}",
        tenant=text,
    )


class FakeClient:
    """Answers from one job, one log and one audit record, all written by an attacker."""

    def __init__(self, job: Job, log: tuple[str, ...] = (), error: Exception | None = None):
        self.job = job
        self.log = log
        self.error = error

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def get_job(self, job_ref: str) -> Job:
        if self.error is not None:
            raise self.error
        return self.job

    def list_jobs(self, **kwargs: Any) -> Iterator[Job]:
        yield self.job

    def log_chunks(self, job_id: str, rank: int = 0, **kwargs: Any) -> Iterator[LogChunk]:
        yield LogChunk(1, self.log)

    def audit(self, limit: int = 100) -> list[pb.AuditRecord]:
        when = Timestamp()
        when.FromDatetime(T0)
        return [
            pb.AuditRecord(
                time=when,
                principal="mallory",
                action="CancelJob",
                target=f"j-1\n{SNEAKY}",
                outcome="PERMISSION_DENIED",
                peer="ipv4:127.0.0.1:1",
            )
        ]


def run(capsys: pytest.CaptureFixture[str], client: FakeClient, *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv), connect=lambda args: client)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


LOG = ("step 1\tloss 0.5", f"{CLEAR}you have been {TITLE}owned", f"copy{CLIPBOARD}", LINK)


def test_logs_show_escapes_as_text_and_keep_tabs(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(capsys, FakeClient(a_job(), LOG), "logs", "j-0123456789")
    assert code == 0
    assert controls(out, allowed="\n\t") == []
    assert out.splitlines() == [
        "step 1\tloss 0.5",
        r"\x1b[2J\x1b[Hyou have been \x1b]0;pwned\x07owned",
        r"copy\x1b]52;c;cm0gLXJmIH4=\x1b" + "\\",
        r"\x1b]8;;https://evil.example/\x07docs\x1b]8;;\x07",
    ]


def test_raw_logs_are_as_the_job_wrote_them(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (("logs", "--raw", "j-1"), ("--raw", "logs", "j-1")):
        code, out = run(capsys, FakeClient(a_job(), LOG), *argv)
        assert code == 0
        assert out == "\n".join(LOG) + "\n"


def test_follow_escapes_lines_and_markers(capsys: pytest.CaptureFixture[str]) -> None:
    job = a_job()
    code, out = run(capsys, FakeClient(job, LOG), "logs", "-f", "j-0123456789")
    assert code == 0
    assert controls(out, allowed="\n\t") == []
    assert r"you have been \x1b]0;pwned\x07owned" in out
    assert out.rstrip().endswith("==> job j-0123456789 FAILED <==")
    raw = run(capsys, FakeClient(job, LOG), "logs", "-f", "--raw", "j-0123456789")[1]
    assert CLEAR in raw


LAYOUT_JOB = a_job("x")
"""The same job with plain text: the escaped job's output must have its lines."""


@pytest.mark.parametrize("argv", [("describe", "j-1"), ("ls",)])
def test_tables_escape_every_field_and_keep_their_lines(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]
) -> None:
    code, out = run(capsys, FakeClient(a_job(f"{SNEAKY}\n\tline two")), *argv)
    assert code == 0
    assert controls(out) == []
    plain = run(capsys, FakeClient(LAYOUT_JOB), *argv)[1]
    assert len(out.splitlines()) == len(plain.splitlines())
    if argv[0] == "describe":
        assert r"MODE=\x1b[2J\x1b[H" in out
        assert r"replica 0 exited 1: \x1b[2J" in out
        assert r"\u202eexe.doc\u202c\rok\x08\n\tline two" in out


def test_describe_raw_prints_the_fields_as_they_are(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(capsys, FakeClient(a_job()), "describe", "--raw", "j-1")
    assert code == 0
    assert f"MODE={SNEAKY}" in out


@pytest.mark.parametrize("output", ["json", "yaml"])
def test_json_and_yaml_carry_the_same_data_with_their_own_escapes(
    capsys: pytest.CaptureFixture[str], output: str
) -> None:
    job = a_job(f"{SNEAKY}\u2028\x85\x7f")
    code, out = run(capsys, FakeClient(job), "describe", "-o", output, "j-1")
    assert code == 0
    assert controls(out) == []
    loaded = json.loads(out) if output == "json" else yaml.safe_load(out)
    assert loaded == json.loads(json.dumps(fmt.to_data(job)))


def test_plain_unicode_stays_readable_in_json_and_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    for output in ("json", "yaml"):
        out = run(capsys, FakeClient(a_job("café × 中文")), "describe", "-o", output, "j-1")[1]
        assert "café × 中文" in out


def test_errors_from_the_server_are_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    error = NotFoundError(f"no job named {CLEAR!r}{CLEAR}", None)
    code, out = run(capsys, FakeClient(a_job(), error=error), "describe", "x")
    assert code == 1
    assert controls(out) == []
    assert r"\x1b[2J\x1b[H" in out


def test_admin_tables_escape_their_cells(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(capsys, FakeClient(a_job()), "admin", "audit")
    assert code == 0
    assert controls(out) == []
    header, row = out.splitlines()  # the target's newline did not forge a second row
    assert header.startswith("TIME")
    assert r"j-1\n\x1b[2J" in row
    raw = run(capsys, FakeClient(a_job()), "--raw", "admin", "audit")[1]
    assert SNEAKY in raw


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.text(max_size=40))
def test_no_text_in_a_job_reaches_the_terminal_as_a_control(
    capsys: pytest.CaptureFixture[str], text: str
) -> None:
    job = a_job(text)
    out = run(capsys, FakeClient(job, (text,)), "describe", "j-1")[1]
    assert controls(out) == []
    assert len(out.splitlines()) == len(
        run(capsys, FakeClient(LAYOUT_JOB), "describe", "j")[1].splitlines()
    )
    logs = run(capsys, FakeClient(job, (text,)), "logs", "j-1")[1]
    assert controls(logs, allowed="\n\t") == []
