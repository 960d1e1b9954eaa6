"""The security check (benchmarks/security_check.py) against a fresh secure local cluster.

Real processes over real TLS: etcd demanding client certificates, one scheduler, one agent and
one launcher. Every attempt must be answered as a secure cluster answers it, and every kind of
attempt the check promises must have been made (a check that silently skipped a door would
otherwise pass).
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.security_check import Attempt, Target, report, run_checks
from pollux.service.local_cluster import LocalCluster

pytestmark = [
    pytest.mark.timeout(240),
    # Replicas run under their job's own uid only when the cluster runs as root.
    pytest.mark.skipif(os.geteuid() != 0, reason="replica isolation needs root"),
]

EXPECTED = {
    "plaintext ListJobs to scheduler": "UNAVAILABLE",
    "plaintext GetModel to agent": "UNAVAILABLE",
    "plaintext ListReplicas to launcher": "UNAVAILABLE",
    "plaintext Store read of etcd": "UNAVAILABLE",
    "TLS without client certificate to launcher": "UNAVAILABLE",
    "ListReplicas with a user certificate of the cluster CA to launcher": "PERMISSION_DENIED",
    "TLS without client certificate to etcd": "UNAVAILABLE",
    "TLS with a certificate of a different CA to etcd": "UNAVAILABLE",
    "Store with a certificate of a different CA to etcd": "UNAVAILABLE",
    "ListJobs with no token": "UNAUTHENTICATED",
    "ListJobs with a well-formed unknown token": "UNAUTHENTICATED",
    "ListJobs with alice's token id and a wrong secret": "UNAUTHENTICATED",
    "ListJobs with a revoked token": "UNAUTHENTICATED",
    "ListJobs with an expired token": "UNAUTHENTICATED",
    "bob GetJob of alice's job": "NOT_FOUND",
    "bob CancelJob of alice's job": "NOT_FOUND",
    "bob DeleteJob of alice's job": "NOT_FOUND",
    "bob StreamLogs of alice's job": "NOT_FOUND",
    "the answer bob gets for alice's job id and for an id of no job": "ALIKE",
    "bob's nodes list names alice's running job": "HIDDEN",
    "(control) the admin's nodes list names alice's running job": "SHOWN",
    "alice's job after bob's attempts": "UNCHANGED",
    "user bob calls admin CreateToken": "PERMISSION_DENIED",
    "user bob calls admin PutTenant": "PERMISSION_DENIED",
    "job A's credential on ReportMetrics for job B": "PERMISSION_DENIED",
    "job A's credential on GetBatchConfig for job B": "PERMISSION_DENIED",
    "a made-up job credential on ReportMetrics": "UNAUTHENTICATED",
    "secret_env value in the alice GetJob response": "WITHHELD",
    "secret_env value in the alice ListJobs response": "WITHHELD",
    "`pollux-cli submit --follow` of a job that writes terminal escapes": "ESCAPED",
    "`pollux-cli logs` of a job that writes terminal escapes": "ESCAPED",
    "`pollux-cli describe` of a job that writes terminal escapes": "ESCAPED",
    "`pollux-cli describe --raw` of a job that writes terminal escapes": "ESCAPED",
    "(control) `pollux-cli logs --raw` of a job that writes terminal escapes": "OK",
    "(control) Store with a service certificate of the cluster CA": "OK",
    "(control) ListReplicas with a service certificate to launcher": "OK",
    # Issue 28: one resolution of a job reference, dead job credentials, per-user bounds.
    "bob submits a job named after alice's job id": "INVALID_ARGUMENT",
    "bob submits a job named a prefix of alice's job id": "INVALID_ARGUMENT",
    "bob reads logs by alice's (deleted) job id": "NOT_FOUND",
    "bob describes by alice's (deleted) job id": "NOT_FOUND",
    "bob cancels by alice's (deleted) job id": "NOT_FOUND",
    "(control) alice reads her finished job's log by its name": "OK",
    "a FAILED job's credential on GetBatchConfig": "UNAUTHENTICATED",
    "a FAILED job's credential on ReportMetrics": "UNAUTHENTICATED",
    "a stream open while its token is revoked": "UNAUTHENTICATED",
    "bob opens stream": "RESOURCE_EXHAUSTED",
    "(control) alice opens a stream while bob holds his cap": "OK",
    "bob's submit": "RESOURCE_EXHAUSTED",
    "(control) alice submits while bob is refused": "OK",
    # Replica isolation: a job reads no credential but its own.
    "a job reads the admin's pollux-cli context": "REFUSED",
    "a job reads the work dir's pki/ listing": "REFUSED",
    "a job reads the CA key": "REFUSED",
    "a job reads the kept admin token": "REFUSED",
    "a job reads the launcher's key": "REFUSED",
    "a job reads another user's job's checkpoint dir": "REFUSED",
    "a job reads another user's job's checkpoint (": "REFUSED",
    "a job reads another user's job's log": "REFUSED",
    "(control) a job reads a file in its own checkpoint dir": "READ",
    # A job's start: nothing runs as root with its environment, no root capability at exec.
    "a job runs a program only root may reach": "REFUSED",
    "(control) a job runs the system's id": "RAN",
    "a job's LOCPATH names locale files only root may open": "UNTOUCHED",
    "(control) a root process given that LOCPATH opens the locale files": "OPENED",
    # Nothing prints or leaves the admin token where another user may read it.
    "the admin token in a service's stdout or stderr": "ABSENT",
    "the admin token in a world-readable file of the work dir": "ABSENT",
}
"""Each attempt the issue asks for (by the start of its name) and the answer it must get."""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(
        tmp_path,
        nodes=1,
        gpus_per_node=1,
        schedulers=1,
        agents=1,
        interval_s=1.0,
        secure=True,
        replica_isolation=True,  # never the fallback to root: that is what is checked
    ) as c:
        c.write_cli_context(tmp_path / "admin-home" / ".config" / "pollux" / "config.toml")
        yield c


def test_every_attempt_on_a_secure_cluster_is_refused_as_it_should_be(
    cluster: LocalCluster,
) -> None:
    attempts: list[Attempt] = asyncio.run(run_checks(Target.of_cluster(cluster)))
    lines: list[str] = []
    status = report(attempts, lines.append)
    failed = [a.line() for a in attempts if not a.passed]
    assert not failed, "\n".join(failed)
    assert status == 0
    assert len(lines) == len(attempts) + 1
    for start, answer in EXPECTED.items():
        made = [a for a in attempts if a.name.startswith(start)]
        assert made, f"the check never tried: {start}"
        assert {a.got for a in made} == {answer}, start
    kinds = Counter(line.split(" as expected")[0] for line in lines[:-1])
    assert set(kinds) == {"PASS refused", "PASS accepted", "PASS held"}
    assert lines[-1].startswith(f"{len(attempts)}/{len(attempts)} attempts")
