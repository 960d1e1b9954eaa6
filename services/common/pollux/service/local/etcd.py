"""The etcd members of a local cluster: started, started again, and watched for a death.

Every member compacts its history itself (`ETCD_HEALTH_FLAGS`; deploy/README.md says the same)
and, on a secure cluster, speaks TLS to clients and peers holding a certificate of the
cluster's CA only. A member that dies is said in one line (with its last log line and the free
space under its data dir) and started again once its disk has room (`ETCD_ROOM_BYTES`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from pollux.service import pki
from pollux.service.local.pki import LocalPki
from pollux.service.local.procs import Proc, free_port, last_line, spawn, wait_for_port

ETCD_HEALTH_FLAGS = ("--auto-compaction-mode=periodic", "--auto-compaction-retention=5m")
"""Every etcd Pollux starts compacts its history itself (deploy/README.md says the same)."""
ETCD_ROOM_BYTES = 128 * 1024 * 1024
"""Free bytes under a dead etcd member's data dir before it is started again: it may rewrite a
whole 64 MB WAL segment to repair the one a full disk cut short."""


def etcd_tls_flags(ca: Path, identity: pki.Issued) -> list[str]:
    """Etcd serving and peering over TLS, and only to clients with a certificate of our CA."""
    return [
        f"--cert-file={identity.cert}",
        f"--key-file={identity.key}",
        "--client-cert-auth",
        f"--trusted-ca-file={ca}",
        f"--peer-cert-file={identity.cert}",
        f"--peer-key-file={identity.key}",
        "--peer-client-cert-auth",
        f"--peer-trusted-ca-file={ca}",
    ]


class LocalEtcd:
    """A local etcd cluster of `members` members on loopback ports.

    Args:
        members: How many (3 tolerates the loss of one).
        data_root: Where the members' data dirs are (``etcd``, ``etcd-1`` …).
        logs: Where their logs go.
        pki: The cluster's certificates; None runs plaintext.
    """

    def __init__(self, members: int, *, data_root: Path, logs: Path, pki: LocalPki | None) -> None:
        self.members = members
        self.data_root = data_root
        self.logs = logs
        self.pki = pki
        self.ports: list[tuple[int, int]] = []
        """Each member's (client, peer) port, once started."""
        self.procs: list[Proc] = []
        """Every member, in member order."""
        self._down: dict[int, float] = {}
        """Members found dead by `watch`, with when they were found (monotonic)."""

    @staticmethod
    def name(index: int) -> str:
        """Member `index`'s process (and certificate) name."""
        return "etcd" if index == 0 else f"etcd-{index}"

    def data_dir(self, index: int) -> Path:
        """The data dir of member `index`."""
        return self.data_root / self.name(index)

    @property
    def endpoint(self) -> str:
        """host:port of etcd; with several members, every member's, comma-separated."""
        assert self.ports, "cluster not started"
        return ",".join(f"127.0.0.1:{client}" for client, _ in self.ports)

    def argv(self, index: int) -> list[str]:
        """The command line of member `index` (ports chosen by `start`)."""
        etcd = shutil.which("etcd")
        if etcd is None:
            raise RuntimeError("etcd is not installed: apt-get install etcd-server")
        scheme = "https" if self.pki is not None else "http"
        peers = ",".join(
            f"pollux-local-{i}={scheme}://127.0.0.1:{peer}"
            for i, (_, peer) in enumerate(self.ports)
        )
        client, peer = self.ports[index]
        argv = [
            etcd,
            f"--name=pollux-local-{index}",
            f"--data-dir={self.data_dir(index)}",
            f"--listen-client-urls={scheme}://127.0.0.1:{client}",
            f"--advertise-client-urls={scheme}://127.0.0.1:{client}",
            f"--listen-peer-urls={scheme}://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls={scheme}://127.0.0.1:{peer}",
            f"--initial-cluster={peers}",
            "--max-txn-ops=1024",
            *ETCD_HEALTH_FLAGS,
            "--log-level=error",
        ]
        if self.pki is not None:
            argv += etcd_tls_flags(self.pki.ca_file, self.pki.identity(self.name(index)))
        return argv

    def _spawn(self, index: int) -> Proc:
        name = self.name(index)
        client = self.ports[index][0]
        return spawn(name, self.argv(index), client, log=self.logs / f"{name}.log", wait=False)

    def start(self) -> None:
        """Start every member on new ports and wait until each listens.

        Members are waited for only once all were started: a member of a new multi-member
        cluster joins once its peers are up.
        """
        self.ports = [(free_port(), free_port()) for _ in range(self.members)]
        self.restart()

    def restart(self) -> None:
        """Start every member again on its ports (after all were killed); wait for them."""
        self.procs = [self._spawn(i) for i in range(len(self.ports))]
        for member in self.procs:
            wait_for_port(member.port, member.process, member.name, timeout=30)

    def restart_member(self, index: int) -> Proc:
        """Start member `index` again on its ports and data directory (after a kill)."""
        proc = self._spawn(index)
        self.procs[index] = proc
        wait_for_port(proc.port, proc.process, proc.name, timeout=30)
        return proc

    def stop(self) -> None:
        """SIGTERM every member; SIGKILL what is still there after 10 s."""
        for member in self.procs:
            if member.process.poll() is None:
                member.process.terminate()
        for member in self.procs:
            try:
                member.process.wait(10)
            except subprocess.TimeoutExpired:
                member.process.kill()
                member.process.wait()

    def watch(self, say: Callable[[str], None] = print) -> list[int]:
        """Say in one line when a member has died; start it again once it has room.

        Call it periodically (`pollux-up` does, every second). A member is started again once
        the filesystem under its data dir has `ETCD_ROOM_BYTES` free (a member that died of a
        full disk would die again at once), and that is said too. Returns the members started.
        """
        restarted = []
        for index, member in enumerate(self.procs):
            code = member.process.poll()
            if code is None:
                continue
            data = self.data_dir(index)
            free = free_bytes(data)
            if index not in self._down:
                self._down[index] = time.monotonic()
                last = last_line(member.log) or "(no output)"
                say(
                    f"pollux-up: etcd member {member.name} exited with code {code}: {last}; "
                    f"{shown_bytes(free)} free under {data}"
                    + ("" if free >= ETCD_ROOM_BYTES else "; it starts again once space is freed")
                )
            if free < ETCD_ROOM_BYTES:
                continue
            try:
                self.restart_member(index)
            except RuntimeError as error:
                say(f"pollux-up: etcd member {member.name} did not start again: {error}")
                continue
            del self._down[index]
            restarted.append(index)
            say(f"pollux-up: etcd member {member.name} started again")
        return restarted


def free_bytes(path: Path) -> int:
    """Bytes free for root under `path` (or its nearest existing parent)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    info = os.statvfs(path)
    return info.f_bfree * info.f_frsize


def shown_bytes(count: int) -> str:
    """A byte count as a person reads it."""
    return f"{count / 2**20:.1f} MiB" if count >= 2**20 else f"{count} bytes"
