"""A job's start gives the job nothing of root's: every attempt REFUSED or UNTOUCHED.

A root launcher starts each replica through its exec helper (launcher/exec_as.py): the part
that runs as root has an environment of its own, and the job's program is exec'd only once
root's capabilities are gone. Two attempts at that root part, made where the check can plant
files as root on the cluster's machine (its own cluster, or ``--pki-dir`` inside a local
`pollux-up` work dir, the check run as root): bob's job names as its program a copy of ``id``
in a directory only root may enter (exec'd with root's capabilities, as setpriv did, it runs),
and bob's job sets LOCPATH to locale files only root may open, FIFOs whose opening the check
sees (a root process that honours the job's LC_ALL and LOCPATH, as setpriv did, opens one).
Controls: a job runs the system's ``id``, and a root process given that LOCPATH opens a FIFO
(the trap works).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import Awaitable
from pathlib import Path

from .session import Session

LOCALE = "xx_XX.UTF-8"
"""A locale no system has: glibc looks for it under LOCPATH first."""
CATEGORIES = (
    "IDENTIFICATION CTYPE NUMERIC TIME COLLATE MONETARY MESSAGES PAPER NAME ADDRESS "
    "TELEPHONE MEASUREMENT"
)
"""The LC_* files glibc opens for a locale (the order varies between versions)."""


async def root_start(session: Session, users: dict[str, str]) -> None:
    """Bob's jobs try to make the root part of their start run or read what root alone may."""
    if session.target.workdir is None or os.geteuid() != 0:
        return
    closed = session.scratch / "root-only"
    closed.mkdir(mode=0o700)
    await _root_only_program(session, users["bob"], closed)
    await _locale_files(session, users["bob"], closed)


async def _root_only_program(session: Session, token: str, closed: Path) -> None:
    hidden = closed / "id"
    shutil.copy2("/usr/bin/id", hidden)
    hidden.chmod(0o755)
    for name, program, expected in (
        (f"a job runs a program only root may reach ({hidden})", hidden, "REFUSED"),
        ("(control) a job runs the system's id", Path("/usr/bin/id"), "RAN"),
    ):
        job = await session.run_command(
            token, f"check-exec-{expected.lower()}", [str(program)], max_failures=1
        )
        if job is None:
            continue
        _, text = await session.log_text(token, job.id)
        if "uid=" in text:
            got, message = "RAN", text.strip().splitlines()[-1]
        elif "Permission denied" in text:
            got, message = "REFUSED", text.strip().splitlines()[-1]
        else:
            got, message = "ERROR", f"job {job.id} printed {text[-200:]!r}"
        session.record(name, expected, got, message)


def locale_trap(directory: Path) -> Path:
    """A LOCPATH in `directory` whose locale files are FIFOs: an open blocks until written."""
    locpath = directory / "locales"
    (locpath / LOCALE).mkdir(parents=True)
    for category in CATEGORIES.split():
        os.mkfifo(locpath / LOCALE / f"LC_{category}")
    return locpath


async def _locale_files(session: Session, token: str, closed: Path) -> None:
    locpath = locale_trap(closed)
    env = {"LOCPATH": str(locpath), "LC_ALL": LOCALE}
    control = await asyncio.create_subprocess_exec(
        "env", env={"PATH": "/usr/bin:/bin", **env}, stdout=asyncio.subprocess.DEVNULL
    )
    opened = await opened_while(locpath, control.wait())
    session.record(
        "(control) a root process given that LOCPATH opens the locale files",
        "OPENED",
        "OPENED" if opened else "UNTOUCHED",
        f"opened {', '.join(opened) or 'none'}",
    )
    run = session.run_command(token, "check-locpath", ["true"], env, max_failures=1)
    job = asyncio.ensure_future(run)
    opened = await opened_while(locpath, job)
    if job.result() is None:
        return  # run_command recorded the timeout
    session.record(
        f"a job's LOCPATH names locale files only root may open ({locpath})",
        "UNTOUCHED",
        "OPENED" if opened else "UNTOUCHED",
        f"opened as root: {', '.join(opened)}" if opened else "no process opened them",
    )


async def opened_while(locpath: Path, running: Awaitable[object]) -> list[str]:
    """The locale FIFOs some process opened while `running` (awaitable) ran to its end.

    Each opener is fed a few bytes and the FIFO closed, so it goes on rather than hang.
    """
    task = asyncio.ensure_future(running)
    opened: list[str] = []
    while True:
        for fifo in sorted((locpath / LOCALE).iterdir()):
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO while no reader
            except OSError:
                continue
            opened.append(fifo.name)
            with contextlib.suppress(OSError):
                os.write(fd, b"not a locale")
            os.close(fd)
        if task.done():
            return opened
        await asyncio.sleep(0.01)
