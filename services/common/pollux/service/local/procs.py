"""Service processes of a local cluster: each in a session of its own, on a loopback port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, process: subprocess.Popen[bytes], what: str, timeout: float) -> None:
    """Wait until something listens on a loopback port, or fail naming the process."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with code {process.returncode} while starting")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on port {port} within {timeout:.0f} s")


@dataclass
class Proc:
    """A started service process."""

    name: str
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def address(self) -> str:
        """Its gRPC address."""
        return f"127.0.0.1:{self.port}"


def interpreter_first_path() -> str:
    """This process's PATH with this interpreter's directory first (what services inherit)."""
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def spawn(
    name: str,
    argv: list[str],
    port: int,
    *,
    log: Path,
    env: dict[str, str] | None = None,
    wait: bool = True,
) -> Proc:
    """Start `argv` in a new session, its output appended to `log`; wait for `port` (`wait`).

    The process gets this one's environment with `env` on top, and this interpreter's
    directory first on PATH: `python` in a job's command (replicas inherit a launcher's
    environment) is then the interpreter that runs the cluster, virtualenv activated or not.
    """
    path = interpreter_first_path()
    with log.open("ab") as out:
        process = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PATH": path, **(env or {})},
            start_new_session=True,
        )
    proc = Proc(name, process, port, log)
    if wait:
        wait_for_port(port, process, name, timeout=30)
    return proc


def last_line(log: Path) -> str:
    """The last non-empty line of a process's log (its dying words), cut to 300 characters."""
    try:
        with log.open("rb") as lines:
            lines.seek(0, os.SEEK_END)
            lines.seek(max(0, lines.tell() - 4096))
            tail = lines.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return tail[-1].strip()[:300] if tail else ""
