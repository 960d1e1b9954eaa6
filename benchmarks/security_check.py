"""Try to break into a secure Pollux cluster, and say which doors held.

Every attempt an outsider, a user or a compromised job could make against the cluster's ports
is made for real (benchmarks/security_attempts/, one module per kind of door; docs/architecture.md
§9 lists them), and each prints one line: ``PASS refused as expected: <attempt> -> <STATUS>:
<message>``, or ``FAIL ...``. Controls that must succeed (``PASS accepted as expected``) keep a
cluster that is simply down from passing. The process exits 1 if any attempt failed. With no
target it starts its own secure `LocalCluster` (1 scheduler, 1 agent, 1 node) in ``--workdir``;
against a running one it needs a scheduler, etcd, the CA directory (``ca.pem``, ``ca-key.pem``)
and an admin token. What it makes is cancelled and revoked at the end.

    python benchmarks/security_check.py [--workdir DIR]
    python benchmarks/security_check.py --scheduler HOST:PORT --etcd HOST:PORT
        --pki-dir DIR --token pollux_... [--etcd-root /pollux/v1]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import grpc

from pollux.client.config import config_path
from pollux.service.keys import DEFAULT_ROOT
from pollux.service.local_cluster import LocalCluster
from pollux.v1 import scheduler_service_pb2 as spb
from pollux.v1 import scheduler_service_pb2_grpc as spb_grpc

try:
    from benchmarks.security_attempts import (
        bounds,
        job_credentials,
        ownership,
        replica_files,
        replica_start,
        secrets_out,
        terminal,
        tokens,
        transport,
    )
    from benchmarks.security_attempts.session import CALL_TIMEOUT_S, Attempt, Session, Target
except (
    ImportError
):  # run as a script (python benchmarks/security_check.py): this folder is on the path
    from security_attempts import (  # type: ignore[import-not-found, no-redef]
        bounds,
        job_credentials,
        ownership,
        replica_files,
        replica_start,
        secrets_out,
        terminal,
        tokens,
        transport,
    )
    from security_attempts.session import (  # type: ignore[import-not-found, no-redef]
        CALL_TIMEOUT_S,
        Attempt,
        Session,
        Target,
    )

__all__ = ["Attempt", "Target", "discover", "main", "own_cluster", "report", "run_checks"]


async def attempt_all(session: Session) -> None:
    """Every attempt, in order (the users the later ones need are made on the way)."""
    await transport.plaintext(session)
    await transport.launcher_certificates(session)
    await transport.etcd_certificates(session)
    users = await tokens.people(session)
    await tokens.bad_tokens(session, users)
    await ownership.other_users_jobs(session, users)
    await ownership.secret_values(session, users)
    await job_credentials.forged_agent_reports(session, users)
    await terminal.terminal_escapes(session, users)
    await ownership.jobs_named_after_ids(session, users)
    await job_credentials.dead_job_credentials(session, users)
    await tokens.revoked_token_streams(session)
    await bounds.stream_caps(session, users)
    await bounds.submit_caps(session, users)
    await replica_files.replica_reads(session, users)  # replica isolation
    await replica_start.root_start(session, users)  # nothing of root's for a job's start
    await secrets_out.token_on_output(session)  # no admin token where others may read it


async def run_checks(target: Target) -> list[Attempt]:
    """Every attempt against `target`, in the order made; cleans up what it made."""
    scratch = Path(tempfile.mkdtemp(prefix="pollux-security-check-"))
    try:
        session = Session(target, scratch)
        try:
            await attempt_all(session)
        finally:
            await session.clean_up()
            await session.close()
        return session.attempts
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


async def discover(
    schedulers: Sequence[str], etcd: str, etcd_root: str, pki_dir: Path, token: str
) -> Target:
    """A running cluster's agents and launchers, as its scheduler reports them."""
    credentials = grpc.composite_channel_credentials(
        grpc.ssl_channel_credentials((pki_dir / "ca.pem").read_bytes()),
        grpc.access_token_call_credentials(token),
    )
    async with grpc.aio.secure_channel(schedulers[0], credentials) as channel:
        status = await spb_grpc.SchedulerServiceStub(channel).ClusterStatus(
            spb.ClusterStatusRequest(), timeout=CALL_TIMEOUT_S
        )
    context = config_path(os.environ)
    return Target(
        schedulers=tuple(schedulers),
        agents=tuple(a.address for a in status.agents),
        launchers=tuple(n.node.address for n in status.nodes),
        etcd=etcd,
        etcd_root=etcd_root,
        pki_dir=pki_dir,
        admin_token=token,
        # A pollux-up work dir on this machine: its replicas' files can be pointed at.
        workdir=pki_dir.parent if (pki_dir.parent / "replica-logs").is_dir() else None,
        admin_context=context if context.exists() else None,
    )


@contextlib.contextmanager
def own_cluster(workdir: Path) -> Iterator[LocalCluster]:
    """A fresh secure LocalCluster: 1 scheduler, 1 agent, 1 node with 1 CPU slot."""
    cluster = LocalCluster(
        workdir,
        nodes=1,
        gpus_per_node=1,
        schedulers=1,
        agents=1,
        interval_s=1.0,
        secure=True,
        replica_isolation=True,  # fail to start rather than check replicas that run as root
    )
    with cluster:
        # What `pollux-up` writes for the admin, here in a home of its own.
        cluster.write_cli_context(workdir / "admin-home" / ".config" / "pollux" / "config.toml")
        yield cluster


def report(attempts: Sequence[Attempt], out: Callable[[str], None] = print) -> int:
    """Print one line per attempt and a summary; the exit status (1 if any failed)."""
    for attempt in attempts:
        out(attempt.line())
    failed = sum(not a.passed for a in attempts)
    out(f"{len(attempts) - failed}/{len(attempts)} attempts answered as a secure cluster should")
    return 1 if failed else 0


async def _checked(args: argparse.Namespace) -> list[Attempt]:
    target = await discover(
        args.scheduler.split(","), args.etcd, args.etcd_root, args.pki_dir, args.token
    )
    return await run_checks(target)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, help="where the own cluster lives (default: temp)")
    parser.add_argument("--scheduler", help="check a running cluster: scheduler host:port(s)")
    parser.add_argument("--etcd", help="its etcd endpoint(s)")
    parser.add_argument("--etcd-root", default=DEFAULT_ROOT, help="its etcd key root")
    parser.add_argument("--pki-dir", type=Path, help="its CA: ca.pem and ca-key.pem")
    parser.add_argument("--token", help="an admin token")
    args = parser.parse_args(argv)
    if args.scheduler:
        missing = [f"--{n}" for n in ("etcd", "pki_dir", "token") if not getattr(args, n)]
        if missing:
            parser.error(f"checking a running cluster needs {', '.join(missing)}")
        attempts = asyncio.run(_checked(args))
        return report(attempts)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="pollux-security-"))
    print(f"starting a secure local cluster in {workdir} ...", flush=True)
    with own_cluster(workdir) as cluster:
        attempts = asyncio.run(run_checks(Target.of_cluster(cluster)))
    return report(attempts)


if __name__ == "__main__":
    sys.exit(main())
