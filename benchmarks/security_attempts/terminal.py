"""A job's output with terminal escapes is shown by `pollux-cli` as text, never obeyed."""

from __future__ import annotations

import asyncio
import os
import sys

from .session import OK, Session


def verdict(code: int | None, out: str, want_code: int, text: str) -> tuple[str, str]:
    """ESCAPED, RAW (a control character reached the terminal), or what went wrong.

    Args:
        code: The CLI's exit code (None: it hung).
        out: What it printed.
        want_code: The exit code it should have.
        text: What must be in the output (the escapes, shown as text).
    """
    raw = sorted({f"U+{ord(c):04X}" for c in out if not c.isprintable() and c not in "\n\t"})
    if code != want_code:
        return "ERROR", f"exit {code}: {out[-300:]}"
    if raw:
        return "RAW", f"control characters {', '.join(raw)} printed as they are"
    if text not in out:
        return "MISSING", f"{text!r} is not in the output: {out[-300:]}"
    return "ESCAPED", f"{text!r} shown as text, no control character"


async def terminal_escapes(session: Session, users: dict[str, str]) -> None:
    r"""A job's output with escape sequences is shown by `pollux-cli` as text, not obeyed.

    alice's job writes a screen clear, an OSC 52 clipboard write, a window title, a
    hyperlink, a C1 CSI and a bidi override to stdout, one more OSC 52 to stderr, and fails
    (its output tail becomes a history reason). The real CLI (a subprocess, as alice) follows
    it, prints its log and describes it: no output may hold a control character but
    newlines and tabs, and the escapes must be there as text (``\x1b]52;``). ``describe
    --raw`` too, since the history stores reasons escaped; ``logs --raw`` (the control)
    must show the escapes as written, or the job never wrote them.
    """
    script = (
        r"printf 'clear\033[2J\033[H clip\033]52;c;cHduZWQ=\007 title\033]0;pwned\007 "
        r"link\033]8;;https://evil.example/\033\\docs\033]8;;\033\\ "
        r"c1\302\2332J bidi\342\200\256cod.exe\n'; "
        r"printf 'boom\033]52;c;cHduZWQ=\007\n' >&2; exit 1"
    )
    wait_s = 120.0  # for the job: two short runs, behind the check's other jobs
    shown, written = r"\x1b]52;c;cHduZWQ=", "\x1b]52;c;cHduZWQ="
    env = {
        **os.environ,
        "POLLUX_CONFIG": str(session.scratch / "no-config.toml"),
        "POLLUX_CA": str(session.target.pki_dir / "ca.pem"),
        "POLLUX_TOKEN": users["alice"],
    }

    async def cli(*args: str) -> tuple[int | None, str]:
        """Run pollux-cli as alice; its exit code (None: it hung) and its output."""
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "pollux.client.cli",
            "--server",
            session.target.schedulers[0],
            *args,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            out, _ = await asyncio.wait_for(process.communicate(), wait_s)
        except TimeoutError:
            process.kill()
            out, _ = await process.communicate()
            return None, out.decode(errors="replace")
        return process.returncode, out.decode(errors="replace")

    code, out = await cli(
        *("submit", "--follow", "--name", "check-terminal", "--initial-batch-size", "1"),
        *("--max-failures", "1", "--", "sh", "-c", script),
    )
    job_id = out.split("\t", 1)[0].strip() if code is not None else ""
    if job_id.startswith("j-"):
        session.cleanup_jobs.append(job_id)
    name = "a job that writes terminal escapes"
    session.record(
        f"`pollux-cli submit --follow` of {name}", "ESCAPED", *verdict(code, out, 3, shown)
    )
    code, out = await cli("logs", job_id)
    session.record(f"`pollux-cli logs` of {name}", "ESCAPED", *verdict(code, out, 0, shown))
    code, out = await cli("describe", job_id)
    session.record(
        f"`pollux-cli describe` of {name} (a failure reason quotes its output)",
        "ESCAPED",
        *verdict(code, out, 0, "boom"),
    )
    code, out = await cli("describe", "--raw", job_id)
    session.record(
        f"`pollux-cli describe --raw` of {name} (histories store reasons escaped)",
        "ESCAPED",
        *verdict(code, out, 0, "boom"),
    )
    code, out = await cli("logs", "--raw", job_id)
    got, message = verdict(code, out, 0, written)
    if got == "RAW" and written in out:
        got, message = OK, "the job's escapes, printed as written (it did write them)"
    session.record(f"(control) `pollux-cli logs --raw` of {name}", OK, got, message)
