"""`pollux-up`: a whole Pollux cluster on one machine, as real processes.

Starts a real etcd (Debian's `etcd-server`), scheduler replicas (one leads), an agent and
NodeLaunchers with CPU "GPU slots", each a separate process on loopback ports, then (with
`--demo`) submits the sample elastic training job and shows live progress until it completes.
Ctrl-C stops everything. The end-to-end tests and the control-plane benchmark use the same
`LocalCluster` class. The first scheduler replica serves the web dashboard on a free loopback
port; `pollux-up` prints its address (with the admin token in the fragment on a TLS cluster).

Secure by default: it makes a CA in the work dir (`pki/`), a certificate for etcd and for each
service, and an admin token; etcd demands client certificates, every port speaks TLS and
authenticates, and `pollux-up` writes a `pollux-cli` context (~/.config/pollux/config.toml)
so the CLI works against it with no flags. `--insecure` starts it all in plaintext instead.

    pollux-up [--nodes 2] [--gpus 2] [--schedulers 2] [--policy NAME] [--demo] [--insecure]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from pollux.client import Client
from pollux.client.config import Context, config_path, write_context
from pollux.service import pki
from pollux.service.bootstrap import create_token
from pollux.service.demo import follow_demo
from pollux.service.store import Store
from pollux.service.tls import TlsFiles

ETCD_HEALTH_FLAGS = ("--auto-compaction-mode=periodic", "--auto-compaction-retention=5m")


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


"""Every etcd Pollux starts compacts its history itself (deploy/README.md says the same)."""


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


@dataclass
class LocalCluster:
    """Real etcd + scheduler replicas + agents + launchers on loopback.

    Attributes:
        workdir: Directory for etcd data, service logs, replica logs and checkpoints.
        nodes: Launchers (nodes) to start.
        gpus_per_node: CPU slots per node.
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
            default roots (/tmp, /var/tmp, /srv, /home): `pollux-up` adds the directory it
            was started from and this checkout, so a job file of a clone anywhere runs.
        dashboard: The first scheduler replica ("scheduler-0") serves the web dashboard on a
            free loopback port (`dashboard_port`, kept across its restarts).
        policy: The schedulers' policy (`scheduling.policy`); "": their default.
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
    dashboard_port: int | None = None
    """The dashboard's port, once scheduler-0 started with it."""
    admin_token: str | None = None
    """The admin's API token (secure clusters, once started)."""
    etcd: Proc | None = None
    """The first etcd member."""
    etcd_procs: list[Proc] = field(default_factory=list)
    """Every etcd member, in member order."""
    procs: dict[str, Proc] = field(default_factory=dict)
    _etcd_ports: list[tuple[int, int]] = field(default_factory=list)

    @property
    def etcd_endpoint(self) -> str:
        """host:port of etcd; with several members, every member's, comma-separated."""
        assert self._etcd_ports, "cluster not started"
        return ",".join(f"127.0.0.1:{client}" for client, _ in self._etcd_ports)

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
        return self.workdir / "pki"

    @property
    def ca_file(self) -> Path | None:
        """The CA certificate clients check the schedulers against (None: plaintext)."""
        return self.pki_dir / "ca.pem" if self.secure else None

    def _identity(self, name: str) -> pki.Issued:
        """The certificate of a service process (made on first use, valid on loopback)."""
        issued = pki.Issued(self.pki_dir / f"{name}.pem", self.pki_dir / f"{name}-key.pem")
        if not issued.cert.exists():
            ca = pki.Issued(self.pki_dir / "ca.pem", self.pki_dir / "ca-key.pem")
            if not ca.cert.exists():
                ca = pki.create_ca(self.pki_dir, "pollux-up local CA")
            hosts = ("127.0.0.1", "localhost", socket.gethostname())
            issued = pki.issue(ca, self.pki_dir, name, "service", hosts=hosts)
        return issued

    def _tls_flags(self, name: str) -> list[str]:
        if not self.secure:
            return []
        issued = self._identity(name)
        return [
            *("--tls-ca", str(self.pki_dir / "ca.pem")),
            *("--tls-cert", str(issued.cert), "--tls-key", str(issued.key)),
        ]

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
        identity = self._identity("operator")
        credentials = grpc.ssl_channel_credentials(
            (self.pki_dir / "ca.pem").read_bytes(),
            identity.key.read_bytes(),
            identity.cert.read_bytes(),
        )
        return grpc.secure_channel(address, credentials)

    def etcd_tls(self) -> TlsFiles | None:
        """An operator's TLS files for etcd; None on an insecure cluster.

        For tools that write etcd directly, such as benchmarks seeding many records.
        """
        if not self.secure:
            return None
        identity = self._identity("operator")
        return TlsFiles(self.pki_dir / "ca.pem", identity.cert, identity.key)

    async def _bootstrap_admin(self) -> str:
        identity = self._identity("pollux-up")
        tls = TlsFiles(self.pki_dir / "ca.pem", identity.cert, identity.key)
        store = await Store.connect(self.etcd_endpoint, tls=tls)
        try:
            return await create_token(store, "admin", description="pollux-up")
        finally:
            await store.close()

    def start(self) -> LocalCluster:
        """Start every process and wait until each listens."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        try:
            self._start_etcd()
            if self.secure:
                self.admin_token = asyncio.run(self._bootstrap_admin())
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

    def _spawn(
        self,
        name: str,
        argv: list[str],
        port: int,
        env: dict[str, str] | None = None,
        *,
        wait: bool = True,
    ) -> Proc:
        log = self.workdir / "logs" / f"{name}.log"
        # Replicas inherit the launcher's environment: `python` in a job's command is then the
        # interpreter that runs this cluster, whether or not its virtualenv is activated.
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
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

    def _start_etcd(self) -> None:
        # Members are waited for only once all were started: a member of a new multi-member
        # cluster joins once its peers are up.
        self._etcd_ports = [(free_port(), free_port()) for _ in range(self.etcd_members)]
        self.etcd_procs = [self._spawn_etcd(i) for i in range(self.etcd_members)]
        self.etcd = self.etcd_procs[0]
        for member in self.etcd_procs:
            wait_for_port(member.port, member.process, member.name, timeout=30)

    def restart_etcd(self) -> None:
        """Start every etcd member again (after all were killed), then wait for them."""
        self.etcd_procs = [self._spawn_etcd(i) for i in range(len(self._etcd_ports))]
        self.etcd = self.etcd_procs[0]
        for member in self.etcd_procs:
            wait_for_port(member.port, member.process, member.name, timeout=30)

    def restart_etcd_member(self, index: int) -> Proc:
        """Start etcd member `index` again on its ports and data directory (after a kill)."""
        proc = self._spawn_etcd(index)
        self.etcd_procs[index] = proc
        self.etcd = self.etcd_procs[0]
        wait_for_port(proc.port, proc.process, proc.name, timeout=30)
        return proc

    def _spawn_etcd(self, index: int) -> Proc:
        etcd = shutil.which("etcd")
        if etcd is None:
            raise RuntimeError("etcd is not installed: apt-get install etcd-server")
        scheme = "https" if self.secure else "http"
        peers = ",".join(
            f"pollux-local-{i}={scheme}://127.0.0.1:{peer}"
            for i, (_, peer) in enumerate(self._etcd_ports)
        )
        client, peer = self._etcd_ports[index]
        name = "etcd" if index == 0 else f"etcd-{index}"
        argv = [
            etcd,
            f"--name=pollux-local-{index}",
            f"--data-dir={self.workdir / name}",
            f"--listen-client-urls={scheme}://127.0.0.1:{client}",
            f"--advertise-client-urls={scheme}://127.0.0.1:{client}",
            f"--listen-peer-urls={scheme}://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls={scheme}://127.0.0.1:{peer}",
            f"--initial-cluster={peers}",
            "--max-txn-ops=1024",
            *ETCD_HEALTH_FLAGS,
            "--log-level=error",
        ]
        if self.secure:
            argv += etcd_tls_flags(self.pki_dir / "ca.pem", self._identity(name))
        return self._spawn(name, argv, client, wait=False)

    def _start_service(
        self, name: str, module: str, *flags: str, env: dict[str, str] | None = None
    ) -> Proc:
        """Start `python -m module` on a free loopback port with the common flags."""
        port = free_port()
        command = [sys.executable, "-m", module, "--etcd", self.etcd_endpoint]
        command += ["--listen", f"127.0.0.1:{port}", *self._tls_flags(name), *flags]
        env = dict(env or {})
        if self.registration_ttl_s is not None:
            ttl = str(self.registration_ttl_s)
            env |= {"POLLUX_AGENT_LEASE_TTL_S": ttl, "POLLUX_LAUNCHER_LEASE_TTL_S": ttl}
        proc = self._spawn(name, command, port, env)
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

    def dashboard_link(self, route: str = "/") -> str | None:
        """The dashboard's address at `route` ("/jobs/<id>"); None without a dashboard.

        On a TLS cluster the admin token rides in the fragment (``#token=...&next=ROUTE``),
        which the page stores in the tab and removes from the address bar: one click signs
        in. A fragment is never sent to the server, logged by it, or put in a Referer.
        """
        if self.dashboard_port is None:
            return None
        scheme = "https" if self.secure else "http"
        base = f"{scheme}://127.0.0.1:{self.dashboard_port}/"
        if self.secure and self.admin_token:
            return f"{base}#token={self.admin_token}" + (f"&next={route}" if route != "/" else "")
        return f"{base}#{route}"

    def start_agent(self, name: str) -> Proc:
        """Start an agent."""
        return self._start_service(name, "pollux.agent.main", "--id", name)

    def start_launcher(self, name: str) -> Proc:
        """Start a launcher for node `name`, its job policy allowing `job_roots` too."""
        env = {}
        if self.job_roots:
            # Imported here: this module runs launchers as processes and needs their package
            # only for this default (the distribution `pollux-common` does not depend on it).
            from pollux.launcher.job_policy import JobPolicy  # noqa: PLC0415

            roots = [*JobPolicy().allowed_roots, *self.job_roots]
            env["POLLUX_LAUNCHER_JOB_POLICY__ALLOWED_ROOTS"] = ",".join(map(str, roots))
        return self._start_service(
            name,
            "pollux.launcher.main",
            *("--node-name", name, "--gpus", str(self.gpus_per_node)),
            *("--checkpoint-root", str(self.workdir / "checkpoints")),
            *("--log-root", str(self.workdir / "replica-logs")),
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
        """SIGTERM every process (launchers first, so replicas checkpoint), then etcd."""
        order = sorted(self.procs, key=lambda n: (not n.startswith("node"), n))
        for name in order:
            proc = self.procs[name].process
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for name in order:
            proc = self.procs[name].process
            try:
                proc.wait(40)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for member in self.etcd_procs:
            if member.process.poll() is None:
                member.process.terminate()
        for member in self.etcd_procs:
            try:
                member.process.wait(10)
            except subprocess.TimeoutExpired:
                member.process.kill()
                member.process.wait()

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


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point of `pollux-up`."""
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
        "--insecure",
        action="store_true",
        help="no TLS, no authentication (loopback only; for debugging)",
    )
    parser.add_argument(
        "--context",
        default="local",
        help="name of the pollux-cli context written for this cluster (default local)",
    )
    args = parser.parse_args(argv)
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
    servers = ",".join(cluster.scheduler_addresses)
    print(f"etcd {cluster.etcd_endpoint}; schedulers {servers}; logs in {workdir / 'logs'}")
    link = cluster.dashboard_link()
    if link is not None:
        print(f"dashboard: {link}")
        if cluster.secure:
            print(
                f"  (HTTPS under the cluster's own CA, {cluster.ca_file}: accept the browser's "
                "certificate warning once, or import that CA)"
            )
    if cluster.secure:
        path = config_path(os.environ)
        context = Context(server=servers, ca_file=cluster.ca_file, token=cluster.admin_token)
        write_context(path, args.context, context)
        print(f"TLS and tokens on; pollux-cli context {args.context!r} (admin) written to {path}")
        print("use it with:  pollux-cli ls", flush=True)
    else:
        print(f"use it with:  export POLLUX_SERVER={servers}; pollux-cli ls", flush=True)
    try:
        if args.demo:
            with cluster.client() as client:
                return follow_demo(client, Path(args.demo), dashboard=cluster.dashboard_link)
        print("Ctrl-C stops it", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 130
    finally:
        print("stopping the cluster ...", flush=True)
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
