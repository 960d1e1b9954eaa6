"""`pollux.terminal`: control characters become visible text, everything else stays.

The set of characters is checked against the Unicode database over every code point; the
escaping itself with hypothesis (never a control character out, printable text unchanged) and
with the escape sequences an attacker would write into a job's output.
"""

from __future__ import annotations

import sys
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pollux.scheduler.lifecycle import MAX_REASON_CHARS, transition
from pollux.terminal import escape_controls, is_control
from pollux.v1 import types_pb2 as pb

BIDI_CONTROLS = frozenset(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)
"""Unicode's bidirectional formatting characters (UAX #9, table 1: explicit formatting)."""


def controls_by_unicode(char: str) -> bool:
    """The set `escape_controls` promises, from the Unicode database rather than its table."""
    category = unicodedata.category(char)
    return category in ("Cc", "Cs", "Zl", "Zp") or char in BIDI_CONTROLS


def test_the_set_is_every_control_surrogate_separator_and_bidi_control() -> None:
    wrong = [
        f"U+{code:04X}"
        for code in range(sys.maxunicode + 1)
        if is_control(chr(code)) != controls_by_unicode(chr(code))
    ]
    assert not wrong


PRINTABLE = st.text(
    st.characters(
        exclude_categories=("Cc", "Cs", "Zl", "Zp"), exclude_characters=sorted(BIDI_CONTROLS)
    )
)


@given(st.text())
def test_the_escaped_text_holds_no_control_character(text: str) -> None:
    line = escape_controls(text)
    assert not any(controls_by_unicode(c) for c in line)
    lines = escape_controls(text, keep_lines=True)
    assert not any(controls_by_unicode(c) for c in lines if c not in "\t\n")
    assert lines.count("\n") == text.count("\n")
    assert lines.count("\t") == text.count("\t")


@given(st.text())
def test_escaping_twice_is_escaping_once(text: str) -> None:
    once = escape_controls(text)
    assert escape_controls(once) == once
    kept = escape_controls(text, keep_lines=True)
    assert escape_controls(kept, keep_lines=True) == kept


@given(PRINTABLE)
def test_printable_text_is_unchanged(text: str) -> None:
    assert escape_controls(text) == text
    assert escape_controls(text, keep_lines=True) == text


@given(PRINTABLE, st.text(), PRINTABLE)
def test_only_the_controls_change(before: str, middle: str, after: str) -> None:
    escaped = escape_controls(before + middle + after)
    assert escaped.startswith(before)
    assert escaped.endswith(after)
    assert escaped == before + escape_controls(middle) + after


ESC, BEL, ST = "\x1b", "\x07", "\x1b\\"


@pytest.mark.parametrize(
    ("attack", "shown"),
    [
        (f"{ESC}[2J{ESC}[H", r"\x1b[2J\x1b[H"),  # clear the screen, home the cursor
        (f"{ESC}]52;c;cm0gLXJmIH4={BEL}", r"\x1b]52;c;cm0gLXJmIH4=\x07"),  # write the clipboard
        (f"{ESC}]0;pwned{BEL}", r"\x1b]0;pwned\x07"),  # retitle the window
        (
            f"{ESC}]8;;https://evil.example/{ST}docs{ESC}]8;;{ST}",
            "\\x1b]8;;https://evil.example/\\x1b\\docs\\x1b]8;;\\x1b\\",  # a disguised link
        ),
        ("\x9b2J\x9d0;t\x9c", r"\x9b2J\x9d0;t\x9c"),  # the same as C1 controls
        ("ok\rFAILED\x08\x08", r"ok\rFAILED\x08\x08"),  # overwrite what was printed
        ("\x00\x7f", r"\x00\x7f"),
        ("user \u202ecod.exe\u202c", r"user \u202ecod.exe\u202c"),  # reads "exe.doc"
        ("\u2066a\u2069\u200f\u2028", r"\u2066a\u2069\u200f\u2028"),
        ("café × naïve \\x1b 中文 🙂", "café × naïve \\x1b 中文 🙂"),  # printable: as it is
    ],
)
def test_what_an_attacker_writes_is_shown_not_done(attack: str, shown: str) -> None:
    assert escape_controls(attack) == shown
    assert escape_controls(attack, keep_lines=True) == shown


def test_a_log_keeps_its_lines_and_tabs_a_field_does_not() -> None:
    text = "epoch\t1\nloss\t0.5\x1b[31m"
    assert escape_controls(text, keep_lines=True) == "epoch\t1\nloss\t0.5\\x1b[31m"
    assert escape_controls(text) == "epoch\\t1\\nloss\\t0.5\\x1b[31m"


def test_a_history_reason_is_stored_escaped_and_still_bounded() -> None:
    job = pb.Job(id="j-1", state=pb.JOB_STATE_PENDING)
    transition(job, pb.JOB_STATE_ALLOCATED, 1.0, "started")
    tail = f"Traceback | {ESC}]52;c;eA=={BEL}{ESC}[2J\nboom"
    transition(job, pb.JOB_STATE_FAILED, 2.0, f"replica 0 exited 1: {tail}")
    reason = job.history[-1].reason
    assert reason == r"replica 0 exited 1: Traceback | \x1b]52;c;eA==\x07\x1b[2J\nboom"
    # Escaping lengthens a reason (1 character to 4), the bound still holds after it.
    long = pb.Job(id="j-2", state=pb.JOB_STATE_PENDING)
    transition(long, pb.JOB_STATE_CANCELLED, 1.0, ESC * 1000)
    assert len(long.history[-1].reason) == MAX_REASON_CHARS
    assert long.history[-1].reason.startswith(r"\x1b\x1b")
