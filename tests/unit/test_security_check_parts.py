"""The security check's pure parts: its verdict lines, the terminal and replica-file readers."""

from __future__ import annotations

from pathlib import Path

from benchmarks.security_attempts.replica_files import attempt_lines
from benchmarks.security_attempts.session import OK, Attempt
from benchmarks.security_attempts.terminal import verdict
from benchmarks.security_check import report


def test_an_attempt_passes_only_with_the_expected_answer_and_says_how() -> None:
    refused = Attempt("bob GetJob of alice's job", "PERMISSION_DENIED", "PERMISSION_DENIED", "no")
    control = Attempt("(control) admin lists jobs", OK, OK, "answered")
    held = Attempt("secret_env value", "WITHHELD", "WITHHELD", "shows <secret>")
    failed = Attempt("ListJobs with no token", "UNAUTHENTICATED", OK, "answered\n  twice")
    assert refused.line().startswith("PASS refused as expected: bob GetJob")
    assert control.line().startswith("PASS accepted as expected:")
    assert held.line().startswith("PASS held as expected:")
    assert failed.line() == (
        "FAIL expected UNAUTHENTICATED: ListJobs with no token -> OK: answered twice"
    )
    lines: list[str] = []
    assert report([refused, control], lines.append) == 0
    assert lines[-1] == "2/2 attempts answered as a secure cluster should"
    assert report([refused, failed], lines.append) == 1


def test_the_cli_output_verdict_names_what_reached_the_terminal() -> None:
    shown = r"\x1b]52;"
    assert verdict(0, f"log {shown}c\n", 0, shown)[0] == "ESCAPED"
    assert verdict(0, "log \x1b]52;c\n", 0, shown) == (
        "RAW",
        "control characters U+001B printed as they are",
    )
    assert verdict(None, "", 0, shown)[0] == "ERROR"  # it hung
    assert verdict(0, "nothing\tof it\n", 0, shown)[0] == "MISSING"


def test_the_thiefs_attempt_lines_are_read_from_every_log(tmp_path: Path) -> None:
    (tmp_path / "1-0.log").write_text(
        "starting\nATTEMPT 0 REFUSED Permission denied\nATTEMPT 1 READ 6162\n"
    )
    (tmp_path / "2-0.log").write_text("ATTEMPT 2 REFUSED\nATTEMPTx 3 READ\n")
    assert attempt_lines(tmp_path) == {
        0: ("REFUSED", "Permission denied"),
        1: ("READ", "6162"),
        2: ("REFUSED", ""),
    }
