r"""Control characters made visible, so that text from other people cannot drive a terminal.

Job output, reasons, names and labels come from users and their jobs. Printed as they are, an
escape sequence clears the screen, retitles the window, writes the clipboard (OSC 52) or fakes
a link, a carriage return or backspace overwrites what was printed, and a bidi override makes
text read otherwise than its characters. `escape_controls` writes each such character as
visible text (ESC as ``\x1b``); every other character, the backslash included, stays as it is,
so printable text is unchanged and escaping twice is escaping once. `pollux-cli` prints
through it unless ``--raw``, and the scheduler stores user and replica reasons in this form.
`quoted` is how an error message quotes such text: as a Python literal, cut short.
"""

from __future__ import annotations

import re

_SHORT = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}

_CONTROLS = (
    "\x00-\x08\x0b-\x1f"  # C0 controls but tab and newline (ESC, BEL, BS, CR, ...)
    "\x7f-\x9f"  # DEL and the C1 controls (CSI, OSC, ...)
    "\u061c\u200e\u200f"  # bidi marks: ALM, LRM, RLM
    "\u202a-\u202e\u2066-\u2069"  # bidi embeddings, overrides and isolates
    "\u2028\u2029"  # line and paragraph separators
    "\ud800-\udfff"  # lone surrogates (not encodable; only from broken input)
)
_IN_TEXT = re.compile(f"[{_CONTROLS}]")
"""What `escape_controls` rewrites in multi-line text (tabs and newlines kept)."""
_IN_LINE = re.compile(f"[\t\n{_CONTROLS}]")
"""What it rewrites in a single-line field: tabs and newlines too."""


def _visible(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _SHORT.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def escape_controls(text: str, *, keep_lines: bool = False) -> str:
    r"""`text` with each control character written as visible text.

    C0 and C1 controls and DEL become ``\xHH`` (tab, newline and carriage return ``\t``,
    ``\n`` and ``\r``); bidi controls, line and paragraph separators and lone surrogates
    ``\uHHHH``. Nothing else changes.

    Args:
        text: Text from someone else: a log line, a reason, a name.
        keep_lines: Keep tabs and newlines as they are (a log); otherwise (a name, a reason,
            a table cell) they are escaped too, so the text stays on one line.
    """
    return (_IN_TEXT if keep_lines else _IN_LINE).sub(_visible, text)


def is_control(char: str) -> bool:
    """Whether `escape_controls` rewrites the character `char` (tab and newline included)."""
    return _IN_LINE.fullmatch(char) is not None


def quoted(value: str, limit: int = 64) -> str:
    """`value` quoted for an error message (control characters escaped), cut to `limit` chars.

    Messages quote what a user sent, which may be long or hostile: the quote stays one line and
    bounded, and says how long the whole was when it is cut.
    """
    if len(value) <= limit:
        return repr(value)
    return repr(value[:limit]) + f"… ({len(value)} chars)"


__all__ = ["escape_controls", "is_control", "quoted"]
