"""`pollux-up` stopped by SIGTERM and started again on the same work dir, as real processes.

SIGTERM to `pollux-up` stops the launchers first, so a running job's replica gets SIGTERM,
checkpoints and exits 143 while the rest of the cluster still runs; started again on the same
work dir, the cluster resumes the job from that checkpoint and reuses the admin token it kept
(no second never-expiring token). Its key files are private (0600 in 0700 directories).
"""

from __future__ import annotations

import os
import queue
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from pollux.client import Client, JobSpec
from pollux.v1 import admin_service_pb2 as apb
from pollux.v1 import admin_service_pb2_grpc as apb_grpc
from tests.job_python import job_python
from tests.waiting import wait_until

JOB = Path(__file__).parent / "jobs" / "counter_job.py"
ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(os.geteuid() != 0, reason="pollux-up isolates replicas only as root"),
]


class PolluxUp:
    """A `pollux-up` process and what it printed."""

    def __init__(self, workdir: Path, config: Path) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pollux.service.local_cluster",
                *("--workdir", str(workdir), "--nodes", "1", "--gpus", "1"),
                *("--schedulers", "1", "--agents", "1", "--interval", "1"),
            ],
            cwd=ROOT,
            env={**os.environ, "POLLUX_CONFIG": str(config)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def read_until(self, predicate: Callable[[str], bool], timeout: float) -> str:
        """Read output lines until one satisfies `predicate`; that line."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                break
            self.lines.append(line)
            if predicate(line):
                return line
        raise AssertionError("pollux-up never said it; it said:\n" + "\n".join(self.lines))

    def schedulers(self) -> list[str]:
        line = self.read_until(lambda text: text.startswith("etcd "), 120)
        return line.split("schedulers ")[1].split(";")[0].split(",")

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        self.read_until(lambda text: text.startswith("stopped"), 150)
        return self.process.wait(30)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(120)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def launched() -> Iterator[list[PolluxUp]]:
    started: list[PolluxUp] = []
    try:
        yield started
    finally:
        for up in started:
            up.kill()


def client(addresses: list[str], workdir: Path, token: str) -> Client:
    ca = (workdir / "pki" / "ca.pem").read_bytes()
    return Client(addresses, credentials=grpc.ssl_channel_credentials(ca), token=token)


def admin_tokens(addresses: list[str], workdir: Path, token: str) -> list[str]:
    ca = (workdir / "pki" / "ca.pem").read_bytes()
    credentials = grpc.composite_channel_credentials(
        grpc.ssl_channel_credentials(ca), grpc.access_token_call_credentials(token)
    )
    with grpc.secure_channel(addresses[0], credentials) as channel:
        reply = apb_grpc.AdminServiceStub(channel).ListTokens(apb.ListTokensRequest(), timeout=10)
    return [t.id for t in reply.tokens if t.description == "pollux-up"]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_sigterm_checkpoints_running_jobs_and_a_restart_resumes_them_with_the_same_token(
    tmp_path: Path, launched: list[PolluxUp]
) -> None:
    workdir, config = tmp_path / "cluster", tmp_path / "home" / "pollux" / "config.toml"
    first = PolluxUp(workdir, config)
    launched.append(first)
    addresses = first.schedulers()
    first.read_until(lambda text: "Ctrl-C stops it" in text, 60)
    token = (workdir / "pki" / "admin-token").read_text().strip()
    # Keys and the token are private to the cluster's owner.
    assert mode(workdir / "pki") == 0o700
    assert mode(workdir / "pki" / "admin-token") == 0o600
    assert mode(workdir / "pki" / "ca-key.pem") == 0o600
    assert mode(config) == 0o600
    assert mode(config.parent) == 0o700
    spec = JobSpec(
        "resume",
        (job_python(), str(JOB)),
        32,
        env={"PYTHONPATH": str(ROOT), "COUNTER_TOTAL": "100000", "COUNTER_STEP_S": "0.05"},
        stop_grace_s=20,
    )
    with client(addresses, workdir, token) as api:
        job_id = api.submit(spec).id
    log = workdir / "replica-logs" / job_id / "1-0.log"
    wait_until(lambda: log.exists() and "step 20" in log.read_text(), 90, "20 steps")

    assert first.stop() == 130
    # The replica was stopped by SIGTERM, checkpointed and exited 143, all before etcd went.
    checkpoint = workdir / "checkpoints" / job_id
    saved = int((checkpoint / "step").read_text())
    assert saved >= 20
    assert f"rank 0: checkpointed at step {saved}" in log.read_text()

    second = PolluxUp(workdir, config)
    launched.append(second)
    addresses = second.schedulers()
    second.read_until(lambda text: "Ctrl-C stops it" in text, 60)
    assert (workdir / "pki" / "admin-token").read_text().strip() == token

    def resumed() -> bool:
        starts = (checkpoint / "starts.log").read_text().splitlines()
        return len(starts) >= 2 and starts[-1].split()[-1] == str(saved)

    wait_until(resumed, 90, "the job to start again from its checkpoint")
    assert len(admin_tokens(addresses, workdir, token)) == 1
    assert second.stop() == 130
