"""A real etcd server on free loopback ports, for integration and end-to-end tests.

Started once per test session (etcd starts in well under a second); each test gets its own
key root so tests never see each other's state. The server's data directory is a temporary
directory removed at exit.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass


class PortTaken(RuntimeError):
    """etcd exited while starting: most likely one of its ports was taken meanwhile."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class EtcdServer:
    """A running etcd process.

    Attributes:
        endpoint: Client endpoint, host:port.
    """

    endpoint: str
    process: subprocess.Popen[bytes]
    data_dir: str

    @classmethod
    def start(cls, *extra: str) -> EtcdServer:
        """Start one etcd; `extra` flags are appended (a small quota, say).

        A port found free can be taken by another process before etcd binds it (another
        suite on the machine): etcd then exits at once, and it is started again on new ports.
        """
        for attempt in range(3):
            try:
                return cls._start_once(*extra)
            except PortTaken:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    @classmethod
    def _start_once(cls, *extra: str) -> EtcdServer:
        etcd = shutil.which("etcd")
        if etcd is None:
            raise RuntimeError("etcd is not installed: apt-get install etcd-server")
        data_dir = tempfile.mkdtemp(prefix="pollux-etcd-")
        client, peer = free_port(), free_port()
        process = subprocess.Popen(
            [
                etcd,
                "--name=pollux-test",
                f"--data-dir={data_dir}",
                f"--listen-client-urls=http://127.0.0.1:{client}",
                f"--advertise-client-urls=http://127.0.0.1:{client}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=pollux-test=http://127.0.0.1:{peer}",
                "--log-level=error",
                *extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        server = cls(f"127.0.0.1:{client}", process, data_dir)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if process.poll() is not None:
                server.stop()
                raise PortTaken(f"etcd exited with {process.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", client), timeout=0.2):
                    return server
            except OSError:
                time.sleep(0.05)
        server.stop()
        raise RuntimeError("etcd did not start within 20 s")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.data_dir, ignore_errors=True)
