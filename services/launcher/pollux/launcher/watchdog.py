"""The launcher's watchdog: a separate process that kills the node's replicas when its lease lapses.

A launcher that stops acting without dying (SIGSTOP, a hung loop, etcd out of reach) cannot
stop its replicas, and the cluster re-places its jobs once its lease expires. So each launcher
starts one watchdog (`python -m pollux.launcher.watchdog TOKEN [RUNTIME BINARY]`, in its own
session) and after every successful lease refresh writes ``lease <deadline>`` to its stdin:
CLOCK_MONOTONIC seconds (one clock for both processes), the refresh's send time plus the ttl
minus `fence.fence_margin`, before etcd can expire the lease. Past the newest deadline the
watchdog SIGKILLs every process carrying the node's fence token (fence.py), again every
`RESCAN_S` until a newer deadline comes, and removes the node's containers by their fence
label (containers.remove_fenced); when its stdin closes it sweeps once more and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import select
import sys
import time
from collections.abc import Callable, Sequence

import structlog

from pollux.launcher.containers import remove_fenced
from pollux.launcher.fence import kill_fenced
from pollux.service.logging import configure

log = structlog.get_logger(__name__)

RESCAN_S = 0.5
"""While the deadline is past, the node is re-scanned for replicas this often."""


def serve(
    fd: int,
    token: str,
    *,
    clock: Callable[[], float] = time.monotonic,
    kill: Callable[[str], list[int]] = kill_fenced,
) -> None:
    """Read deadlines from `fd` and enforce them until end of input (then a last sweep).

    Input already waiting is always read before a sweep, so a deadline the launcher sent
    before starting a replica protects that replica even if this process was slow to start.
    """
    deadline = -math.inf  # nothing may run before the launcher holds a lease
    pending = b""
    timeout = 0.0
    while True:
        ready, _, _ = select.select([fd], [], [], timeout)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                _sweep(token, kill, reason="launcher gone", late_s=0.0)
                return
            pending += chunk
            *lines, pending = pending.split(b"\n")
            deadline = max(deadline, _newest_deadline(lines))
            timeout = 0.0  # drain whatever else is waiting before judging the deadline
            continue
        now = clock()
        if now >= deadline:
            _sweep(token, kill, reason="lease deadline passed", late_s=now - deadline)
            timeout = RESCAN_S
        else:
            timeout = deadline - now


def _newest_deadline(lines: list[bytes]) -> float:
    newest = -math.inf
    for line in lines:
        word, _, value = line.decode(errors="replace").partition(" ")
        if word == "lease":
            with contextlib.suppress(ValueError):
                newest = max(newest, float(value))
        elif line:
            log.warning("watchdog_bad_line", line=line[:80].decode(errors="replace"))
    return newest


def _sweep(token: str, kill: Callable[[str], list[int]], *, reason: str, late_s: float) -> None:
    killed = kill(token)
    if killed:
        log.warning(
            "replicas_fenced",
            reason=reason,
            pids=killed,
            late_s=round(late_s, 3) if math.isfinite(late_s) else None,
        )


def killer(container: tuple[str, ...] | None) -> Callable[[str], list[int]]:
    """The sweep: `kill_fenced`, then, with (runtime, *client argv), the node's containers too."""
    if container is None:
        return kill_fenced
    runtime, *client = container

    def kill(token: str) -> list[int]:
        pids = kill_fenced(token)
        names = remove_fenced(runtime, client, token)
        if names:
            log.warning("containers_fenced", containers=names)
        return pids

    return kill


class WatchdogLink:
    """The launcher's side: starts the watchdog, feeds it deadlines, restarts it if it dies.

    Args:
        token: The node's fence token (fence.fence_token).
        margin_s: How long before a lease's expiry the deadline falls (fence.fence_margin).
        container: (runtime, client binary, global flags...) when the node runs containers,
            whose containers the watchdog removes too.
    """

    def __init__(
        self, token: str, *, margin_s: float, container: tuple[str, ...] | None = None
    ) -> None:
        self.token = token
        self.margin_s = margin_s
        self.container = container
        self.deadline = -math.inf
        """The newest deadline sent (monotonic seconds): replicas are killed once it passes."""
        self.restarts = 0
        self._process: asyncio.subprocess.Process | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._closing = False

    @property
    def pid(self) -> int:
        """The watchdog's pid (0 while none runs)."""
        return self._process.pid if self._process is not None else 0

    def expired(self, now: float | None = None) -> bool:
        """Whether the watchdog may already have killed this node's replicas."""
        return (time.monotonic() if now is None else now) >= self.deadline

    async def start(self) -> None:
        """Start the watchdog process and its supervisor."""
        await self._launch()
        self._supervisor = asyncio.create_task(self._supervise(), name="watchdog-supervisor")

    async def _launch(self) -> None:
        self._process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "pollux.launcher.watchdog",
            self.token,
            *(self.container or ()),
            stdin=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        if math.isfinite(self.deadline):
            self._send(f"lease {self.deadline:.6f}")
        log.info("watchdog_started", pid=self._process.pid)

    async def _supervise(self) -> None:
        # A dead watchdog would leave the replicas unfenced: start another one at once and
        # hand it the current deadline.
        while self._process is not None:
            code = await self._process.wait()
            if self._closing:
                return
            self.restarts += 1
            log.error("watchdog_died", exit_code=code, restarts=self.restarts)
            await asyncio.sleep(min(0.1 * self.restarts, 2.0))
            with contextlib.suppress(OSError):
                await self._launch()

    def confirmed(self, sent_at: float, ttl_s: float) -> None:
        """A lease refresh sent at monotonic `sent_at` succeeded: move the deadline on."""
        deadline = sent_at + ttl_s - self.margin_s
        if deadline > self.deadline:
            self.deadline = deadline
            self._send(f"lease {deadline:.6f}")

    def _send(self, line: str) -> None:
        process = self._process
        if process is None or process.stdin is None or process.returncode is not None:
            return
        with contextlib.suppress(ConnectionError, RuntimeError):
            process.stdin.write(line.encode() + b"\n")

    async def close(self) -> None:
        """End the watchdog (it sweeps once more: call after the replicas are stopped)."""
        self._closing = True
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        process = self._process
        if process is None:
            return
        if process.stdin is not None:
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 5.0)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pollux.launcher.watchdog TOKEN [RUNTIME BINARY [FLAG...]]``.

    Enforces the deadlines read from stdin. With RUNTIME and BINARY (and the runtime's global
    flags), each sweep also removes the node's containers.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) in (0, 2):
        print(
            "usage: python -m pollux.launcher.watchdog FENCE_TOKEN [RUNTIME BINARY [FLAG...]]",
            file=sys.stderr,
        )
        return 2
    configure("launcher-watchdog")
    structlog.contextvars.bind_contextvars(node_id=args[0].partition("@")[0])
    container = tuple(args[1:]) if len(args) >= 3 else None
    serve(sys.stdin.fileno(), args[0], kill=killer(container))
    return 0


if __name__ == "__main__":
    sys.exit(main())
