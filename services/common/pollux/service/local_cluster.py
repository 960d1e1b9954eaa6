"""`pollux-up`: a whole Pollux cluster on one machine, as real processes.

Starts a real etcd, scheduler replicas (the first serves the dashboard), agents and launchers
with CPU "GPU slots", each a process on loopback ports; `--demo` submits the sample job and
follows it. Tests and benchmarks use `LocalCluster`. Secure by default: CA, certificates and
admin token in the work dir (local/pki.py), TLS and tokens on every port, a `pollux-cli`
context; as root each job's replicas run under a uid of the job's own where such uids can run
the jobs (local/job_reach.py), else as the invoking user, said in one line. SIGTERM or Ctrl-C
stops launchers first (replicas checkpoint, exit 143), then the services, then etcd, so a
restart on the same work dir resumes every job (local/etcd.py restarts a dead member).

    pollux-up [--nodes 2] [--gpus 2] [--schedulers 2] [--agents 1] [--policy NAME] [--demo]
              [--workdir DIR] [--etcd-dir DIR] [--isolated-replicas | --insecure-replicas]
              [--insecure]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import pwd
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from pollux.client import Client
from pollux.client.config import Context, config_path, current_context, write_context
from pollux.service.demo import follow_demo
from pollux.service.local import job_reach
from pollux.service.local import workdir as workdir_layout
from pollux.service.local.etcd import LocalEtcd
from pollux.service.local.pki import LocalPki
from pollux.service.local.procs import (
    Proc,
    free_port,
    interpreter_first_path,
    spawn,
    wait_for_port,
)
from pollux.service.tls import TlsFiles

__all__ = ["DEMO_JOB", "REPO", "STOP_WAIT_S", "LocalCluster", "Proc", "free_port", "main"]

STOP_WAIT_S = 60.0
"""How long `stop` waits for each process after SIGTERM before SIGKILL (a launcher's replicas
get their stop grace, 30 s by default, within it)."""


@dataclass
class LocalCluster:
    """Real etcd + scheduler replicas + agents + launchers on loopback.

    Attributes:
        workdir: Directory for etcd data, service logs, replica logs and checkpoints.
        nodes: Launchers (nodes) to start.
        gpus_per_node: CPU slots per node (unused with `real_gpus`).
        schedulers: Scheduler replicas.
        agents: Agents.
        interval_s: Scheduling interval.
        lease_ttl_s: Scheduler leadership lease TTL.
        restart_delay_s: Re-allocation cost the Pollux policy assumes (restarts are quick on
            one machine; a GPU cluster's default is 30 s).
        etcd_members: etcd cluster members (3 tolerates the loss of one).
        registration_ttl_s: Lease TTL of agent and launcher registrations; None keeps the
            services' default (10 s). The fault suite shortens it.
        secure: TLS and authentication everywhere (a CA, certificates and an admin token
            made in `workdir/pki`); False runs plaintext, as a loopback-only dev setup.
        job_roots: Directories a job's working_dir may lie in besides the launcher policy's
            default roots (/tmp, /var/tmp, /srv, /home) and this checkout (always allowed):
            `pollux-up` adds the directory it was started from and its --allow-root ones.
        dashboard: The first scheduler replica ("scheduler-0") serves the web dashboard on a
            free loopback port (`dashboard_port`, kept across its restarts).
        replica_isolation: Each job's replicas run under a uid of the job's own (the
            launchers' default job_policy), which needs root and an interpreter and job dirs
            those uids can reach (job_reach.py). True: required (`start` fails saying why it
            cannot be); False: never, replicas run as this user (root too) and launchers are
            told --insecure; None: where it can be, else as this user (`isolation_note` says
            why).
        job_dirs: Directories jobs will run in, checked for job uids with the interpreter.
        etcd_dir: Where the etcd members keep their data (default: the work dir); a
            filesystem of its own keeps a job that fills the work dir's from stopping etcd.
        policy: The schedulers' policy (`scheduling.policy`); "": their default.
        real_gpus: The launchers serve the GPUs nvidia-smi finds on this machine (each node
            all of them; use one node) instead of `gpus_per_node` CPU slots.
    """

    workdir: Path
    nodes: int = 2
    gpus_per_node: int = 2
    schedulers: int = 2
    agents: int = 1
    interval_s: float = 5.0
    lease_ttl_s: int = 3
    restart_delay_s: float = 3.0
    etcd_members: int = 1
    registration_ttl_s: int | None = None
    secure: bool = True
    dashboard: bool = True
    policy: str = ""
    job_roots: tuple[Path, ...] = ()
    """Directories jobs may run in besides the launchers' defaults (`JobPolicy`)."""
    replica_isolation: bool | None = None
    job_dirs: tuple[Path, ...] = ()
    etcd_dir: Path | None = None
    real_gpus: bool = False
    dashboard_port: int | None = None
    """The dashboard's port, once scheduler-0 started with it."""
    admin_token: str | None = None
    """The admin's API token (secure clusters, once started)."""
    procs: dict[str, Proc] = field(default_factory=dict)
    """The service processes (not etcd's) by name."""
    isolation_note: str = ""
    """Why replicas run as this user although isolation was not turned off ("" otherwise)."""
    _reach: job_reach.Reach | None = field(default=None, init=False, repr=False)
    pki: LocalPki = field(init=False)
    """The CA, certificates and admin token (used on a secure cluster only)."""
    members: LocalEtcd = field(init=False)
    """The etcd members (made from `etcd_members`, `etcd_dir` and `secure` as constructed)."""

    def __post_init__(self) -> None:
        self.pki = LocalPki(self.workdir / "pki")
        self.members = LocalEtcd(
            self.etcd_members,
            data_root=self.etcd_dir or self.workdir,
            logs=self.workdir / "logs",
            pki=self.pki if self.secure else None,
        )

    @property
    def isolated(self) -> bool:
        """Whether replicas run under their job's own uid (known once `start` checked)."""
        if self.replica_isolation is False:
            return False
        if self._reach is None:
            return os.geteuid() == 0
        return not self._reach.problem

    def _check_isolation(self) -> None:
        """Find whether job uids can run the jobs (`isolated`), or fail if they must and cannot.

        Raises:
            RuntimeError: `replica_isolation` is True and job uids cannot run the jobs.
        """
        if self.replica_isolation is False:
            return
        self._reach = job_reach.plan(self.workdir, self.job_dirs, interpreter_first_path())
        problem = self._reach.problem
        if problem and self.replica_isolation:
            raise RuntimeError(
                f"replicas cannot run under a uid of their job's own: {problem}; or leave out "
                "--isolated-replicas to run them as this user"
            )
        self.isolation_note = problem

    @property
    def admin_token_file(self) -> Path:
        """Where the admin token of a secure cluster is kept (0600), reused on restart."""
        return self.pki.admin_token_file

    @property
    def etcd_procs(self) -> list[Proc]:
        """Every etcd member, in member order."""
        return self.members.procs

    def etcd_data_dir(self, index: int) -> Path:
        """The data dir of etcd member `index`."""
        return self.members.data_dir(index)

    @property
    def etcd_endpoint(self) -> str:
        """host:port of etcd; with several members, every member's, comma-separated."""
        return self.members.endpoint

    @property
    def scheduler_addresses(self) -> list[str]:
        """The gRPC addresses of every live scheduler replica."""
        return [
            p.address
            for name, p in sorted(self.procs.items())
            if name.startswith("scheduler") and p.process.poll() is None
        ]

    @property
    def pki_dir(self) -> Path:
        """Where the CA, certificates and keys of a secure cluster are."""
        return self.pki.directory

    @property
    def ca_file(self) -> Path | None:
        """The CA certificate clients check the schedulers against (None: plaintext)."""
        return self.pki.ca_file if self.secure else None

    def client(self, *, timeout_s: float = 10.0, token: str | None = None) -> Client:
        """A client of the live schedulers, as the admin (or with `token`)."""
        credentials = None
        if self.ca_file is not None:
            credentials = grpc.ssl_channel_credentials(self.ca_file.read_bytes())
        return Client(
            self.scheduler_addresses,
            timeout_s=timeout_s,
            credentials=credentials,
            token=token or self.admin_token if self.secure else None,
        )

    def service_channel(self, address: str) -> grpc.Channel:
        """A channel to a service port, holding an operator's service certificate.

        Launchers take no other callers. Plaintext on an insecure cluster.
        """
        if not self.secure:
            return grpc.insecure_channel(address)
        return self.pki.channel(address)

    def etcd_tls(self) -> TlsFiles | None:
        """An operator's TLS files for etcd; None on an insecure cluster.

        For tools that write etcd directly, such as benchmarks seeding many records.
        """
        return self.pki.etcd_tls() if self.secure else None

    def start(self) -> LocalCluster:
        """Start every process and wait until each listens."""
        workdir_layout.prepare(self.workdir, self.pki_dir, self.etcd_dir)
        self._check_isolation()
        try:
            self.members.start()
            if self.secure:
                self.admin_token = asyncio.run(self.pki.admin_token(self.etcd_endpoint))
            for i in range(self.schedulers):
                self.start_scheduler(f"scheduler-{i}")
            for i in range(self.agents):
                self.start_agent(f"agent-{i}")
            for i in range(self.nodes):
                self.start_launcher(f"node-{i}")
        except BaseException:
            self.stop()
            raise
        return self

    def restart_etcd(self) -> None:
        """Start every etcd member again (after all were killed), then wait for them."""
        self.members.restart()

    def restart_etcd_member(self, index: int) -> Proc:
        """Start etcd member `index` again on its ports and data directory (after a kill)."""
        return self.members.restart_member(index)

    def _start_service(
        self, name: str, module: str, *flags: str, env: dict[str, str] | None = None
    ) -> Proc:
        """Start `python -m module` on a free loopback port with the common flags."""
        port = free_port()
        command = [sys.executable, "-m", module, "--etcd", self.etcd_endpoint]
        tls = self.pki.tls_flags(name) if self.secure else []
        command += ["--listen", f"127.0.0.1:{port}", *tls, *flags]
        env = dict(env or {})
        if self.registration_ttl_s is not None:
            ttl = str(self.registration_ttl_s)
            env |= {"POLLUX_AGENT_LEASE_TTL_S": ttl, "POLLUX_LAUNCHER_LEASE_TTL_S": ttl}
        proc = spawn(name, command, port, log=self.workdir / "logs" / f"{name}.log", env=env)
        self.procs[name] = proc
        return proc

    def start_scheduler(self, name: str) -> Proc:
        """Start (or restart) a scheduler replica; scheduler-0 also serves the dashboard."""
        flags = [
            *("--id", name, "--interval", str(self.interval_s)),
            *("--lease-ttl", str(self.lease_ttl_s), "--restart-delay", str(self.restart_delay_s)),
        ]
        if self.policy:
            flags += ["--policy", self.policy]
        dashboard = self.dashboard and name == "scheduler-0"
        if dashboard:
            if self.dashboard_port is None:
                self.dashboard_port = free_port()
            flags += ["--dashboard-listen", f"127.0.0.1:{self.dashboard_port}"]
        proc = self._start_service(name, "pollux.scheduler.main", *flags)
        if dashboard and self.dashboard_port is not None:
            wait_for_port(self.dashboard_port, proc.process, f"{name}'s dashboard", timeout=30)
        return proc

    def dashboard_link(self, route: str = "/", *, sign_in: bool = True) -> str | None:
        """The dashboard's address at `route` ("/jobs/<id>"); None without a dashboard.

        On a TLS cluster with `sign_in` the admin token rides in the fragment
        (``#token=...&next=ROUTE``), which the page stores in the tab and removes from the
        address bar: one click signs in. A fragment is never sent to the server, logged by it,
        or put in a Referer; but such a link is the admin's secret, so `pollux-up` never
        prints it (`pollux-cli dashboard --link` does, on request).
        """
        if self.dashboard_port is None:
            return None
        scheme = "https" if self.secure else "http"
        base = f"{scheme}://127.0.0.1:{self.dashboard_port}/"
        if self.secure and self.admin_token and sign_in:
            return f"{base}#token={self.admin_token}" + (f"&next={route}" if route != "/" else "")
        return f"{base}#{route}"

    def start_agent(self, name: str) -> Proc:
        """Start an agent."""
        return self._start_service(name, "pollux.agent.main", "--id", name)

    def start_launcher(self, name: str) -> Proc:
        """Start a launcher for node `name`, its job policy allowing `job_roots` too."""
        # Imported here: this module runs launchers as processes and needs their package only
        # for this default (the distribution `pollux-common` does not depend on it).
        from pollux.launcher.job_policy import JobPolicy  # noqa: PLC0415

        # The checkout too: pollux-cli sends the directory it runs in as a job's default
        # working_dir, and a local cluster's jobs are run from it (examples, tests).
        roots = dict.fromkeys([*JobPolicy().allowed_roots, *self.job_roots, REPO])
        env = {"POLLUX_LAUNCHER_JOB_POLICY__ALLOWED_ROOTS": ",".join(map(str, roots))}
        if not self.isolated and os.geteuid() == 0:
            # Replicas run as this user, root included: what the launcher's job_policy calls
            # one uid for every job (its --insecure below acknowledges that).
            env["POLLUX_LAUNCHER_JOB_POLICY__RUN_AS_UID"] = "0"
            env["POLLUX_LAUNCHER_JOB_POLICY__ALLOW_ROOT"] = "true"
        bin_dir = self._reach.bin_dir if self._reach is not None else None
        if bin_dir is not None:  # a job environment the job uids can use (job_reach.py)
            env["PATH"] = os.pathsep.join([str(bin_dir), interpreter_first_path()])
        return self._start_service(
            name,
            "pollux.launcher.main",
            *("--node-name", name),
            # Without --gpus the launcher detects the node's GPUs (nvidia-smi).
            *(() if self.real_gpus else ("--gpus", str(self.gpus_per_node))),
            *("--checkpoint-root", str(self.workdir / "checkpoints")),
            *("--log-root", str(self.workdir / "replica-logs")),
            *("--scratch-root", str(self.workdir / "scratch")),
            *(() if self.isolated else ("--insecure",)),
            env=env,
        )

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send a signal to a service process (kill -9 by default) and reap it."""
        proc = self.procs[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.process.wait(30)

    def stop(self) -> None:
        """Stop in order: launchers, then schedulers and agents, then etcd (SIGTERM each).

        The launchers go first and alone: their replicas checkpoint and exit 143 (within their
        stop grace) while the schedulers, agents and etcd they report to still run; so a
        cluster started again on the same work dir resumes every job from where it stopped.
        """
        launchers = sorted(n for n in self.procs if n.startswith("node"))
        others = sorted(n for n in self.procs if not n.startswith("node"))
        for group in (launchers, others):
            for name in group:
                proc = self.procs[name].process
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGTERM)
            for name in group:
                proc = self.procs[name].process
                try:
                    proc.wait(STOP_WAIT_S)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        self.members.stop()

    def write_cli_context(self, path: Path, name: str = "local") -> bool:
        """Write a `pollux-cli` context for this cluster as the admin: 0600 in a 0700 dir.

        It becomes the current context only if there is none or it is already `name`: a
        config that points at another cluster keeps pointing there. Returns whether it is
        the current context.
        """
        servers = ",".join(self.scheduler_addresses)
        context = Context(server=servers, ca_file=self.ca_file, token=self.admin_token)
        # Decided under the config's lock: two pollux-up started at once keep both contexts.
        made_current = write_context(path, name, context, current=None)
        path.parent.chmod(0o700)  # the token's directory: the admin's alone
        return made_current

    def watch_etcd(self, say: Callable[[str], None] = print) -> list[int]:
        """Say when an etcd member has died; start it again once it has room (LocalEtcd.watch).

        Call it periodically (`pollux-up` does, every second). Returns the members started.
        """
        return self.members.watch(say)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


REPO = Path(__file__).resolve().parents[4]
"""The checkout this module runs from (services/common/pollux/service/ is four levels down)."""
DEMO_JOB = REPO / "examples" / "elastic_job.yaml"
"""The sample elastic job `pollux-up --demo` runs (./scripts/demo)."""


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pollux-up", description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2, help="launchers (nodes) to start")
    parser.add_argument("--gpus", type=int, default=2, help="CPU 'GPU slots' per node")
    parser.add_argument("--schedulers", type=int, default=2, help="scheduler replicas")
    parser.add_argument("--agents", type=int, default=1, help="agents")
    parser.add_argument("--interval", type=float, default=5.0, help="scheduling interval, s")
    parser.add_argument("--policy", default="", help="the schedulers' policy (default: pollux-jct)")
    parser.add_argument("--workdir", type=Path, help="state directory (default: a temp dir)")
    parser.add_argument(
        "--demo",
        nargs="?",
        const=str(DEMO_JOB),
        metavar="JOB_FILE",
        help="submit a job file (default: the sample elastic job) and follow it",
    )
    parser.add_argument(
        "--allow-root",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="another directory jobs may run in (repeatable; the current directory and this "
        "checkout always are, besides /tmp, /var/tmp, /srv and /home)",
    )
    parser.add_argument(
        "--etcd-dir",
        type=Path,
        help="where etcd keeps its data (default: the work dir); a filesystem of its own keeps "
        "a job that fills the work dir's from stopping etcd",
    )
    isolation = parser.add_mutually_exclusive_group()
    isolation.add_argument(
        "--insecure-replicas",
        action="store_true",
        help="run every job's replicas as the user running pollux-up (root too), not under a "
        "uid of the job's own: jobs can then read each other's files and the cluster's keys",
    )
    isolation.add_argument(
        "--isolated-replicas",
        action="store_true",
        help="refuse to start unless every job's replicas can run under a uid of the job's own "
        "(by default pollux-up falls back to running them as its own user, and says why)",
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="no TLS, no authentication, no replica isolation (loopback only; for debugging)",
    )
    parser.add_argument(
        "--context",
        default="local",
        help="name of the pollux-cli context written for this cluster (default local)",
    )
    return parser


def _isolation(args: argparse.Namespace) -> bool | None:
    """`LocalCluster.replica_isolation` from the flags: required, never, or where it can be."""
    if args.insecure or args.insecure_replicas:
        return False
    return True if args.isolated_replicas else None


def _job_dirs(demo: str | None) -> tuple[Path, ...]:
    """Where this session's jobs will run: here (pollux-cli's default) and the demo's dir."""
    dirs = [Path.cwd()]
    if demo:
        dirs.append(Path(demo).resolve().parent)
    return tuple(dict.fromkeys(dirs))


def _user() -> str:
    """This process's user, by name where it has one."""
    try:
        return f"{pwd.getpwuid(os.geteuid()).pw_name} (uid {os.geteuid()})"
    except KeyError:
        return f"uid {os.geteuid()}"


def _announce(cluster: LocalCluster, context_name: str) -> None:
    """Say where everything is, and write the CLI's context (a secure cluster)."""
    servers = ",".join(cluster.scheduler_addresses)
    logs = cluster.workdir / "logs"
    print(f"etcd {cluster.etcd_endpoint}; schedulers {servers}; logs in {logs}")
    link = cluster.dashboard_link(sign_in=False)
    if link is not None:
        print(f"dashboard: {link}")
        if cluster.secure:
            print(
                f"  (HTTPS under the cluster's own CA, {cluster.ca_file}: accept the browser's "
                "certificate warning once, or import that CA; `pollux-cli dashboard --link` "
                "prints a link that signs you in as the admin: keep it to yourself)"
            )
    if not cluster.isolated:
        why = cluster.isolation_note or "--insecure-replicas"
        print(
            f"pollux-up: WARNING: replicas run as {_user()}, not under a uid of their job's own "
            f"({why}), so a job can read the cluster's keys and other jobs' files; "
            "--isolated-replicas refuses to start instead",
            flush=True,
        )
    if cluster.secure:
        path = config_path(os.environ)
        made_current = cluster.write_cli_context(path, context_name)
        print(f"TLS and tokens on; pollux-cli context {context_name!r} (admin) written to {path}")
        if made_current:
            print("use it with:  pollux-cli ls", flush=True)
        else:  # the config's current context is another cluster's: leave it so
            print(
                f"use it with:  pollux-cli --context {context_name} ls  (the current context "
                f"stays {current_context(path)!r})",
                flush=True,
            )
    else:
        print(f"use it with:  export POLLUX_SERVER={servers}; pollux-cli ls", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point of `pollux-up`."""
    args = _parser().parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="pollux-up-"))
    cluster = LocalCluster(
        workdir,
        nodes=args.nodes,
        gpus_per_node=args.gpus,
        schedulers=args.schedulers,
        agents=args.agents,
        interval_s=args.interval,
        policy=args.policy,
        secure=not args.insecure,
        job_roots=tuple(dict.fromkeys([Path.cwd().resolve(), REPO, *args.allow_root])),
        replica_isolation=_isolation(args),
        job_dirs=_job_dirs(args.demo),
        etcd_dir=args.etcd_dir,
    )
    # Both explicitly: a shell that starts pollux-up in the background leaves SIGINT ignored.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    print(f"starting a local cluster in {workdir} ...", flush=True)
    try:
        cluster.start()
    except RuntimeError as error:
        print(f"pollux-up: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130  # start() stopped what it had started
    try:
        _announce(cluster, args.context)
        if args.demo:
            with cluster.client() as client:
                page = functools.partial(cluster.dashboard_link, sign_in=False)
                return follow_demo(client, Path(args.demo), dashboard=page)
        print("Ctrl-C stops it", flush=True)
        while True:
            time.sleep(1.0)
            cluster.watch_etcd(lambda line: print(line, flush=True))
    except KeyboardInterrupt:
        return 130
    finally:
        print("stopping the cluster ...", flush=True)
        # A second Ctrl-C or SIGTERM must not cut the orderly stop short.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        cluster.stop()
        print("stopped", flush=True)


if __name__ == "__main__":
    sys.exit(main())
