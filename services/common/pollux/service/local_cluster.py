"""`pollux-up`: a whole Pollux cluster on one machine, as real processes.

Starts a real etcd (Debian's `etcd-server`), scheduler replicas (one leads), an agent and
NodeLaunchers with CPU "GPU slots", each a separate process on loopback ports, then (with
`--demo`) submits the sample elastic training job and shows live progress until it completes.
Ctrl-C stops everything. The end-to-end tests and the control-plane benchmark use the same
`LocalCluster` class. The first scheduler replica serves the web dashboard on a free loopback
port; `pollux-up` prints its address (with the admin token in the fragment on a TLS cluster).

Secure by default: it makes a CA in the work dir (`pki/`, 0700, keys 0600), a certificate for
etcd and for each service, and an admin token (kept in `pki/admin-token` and reused when
started again on the same work dir); etcd demands client certificates, every port speaks TLS
and authenticates, and `pollux-up` writes a `pollux-cli` context (~/.config/pollux/config.toml,
0600 in a 0700 dir) so the CLI works against it with no flags. Run as root, every job's
replicas run under a uid of the job's own (the launchers' job_policy), so a job can read no key,
token or other job's files; run as another user it refuses to start unless told
`--insecure-replicas` (replicas then run as that user) or `--insecure` (that, and plaintext).

SIGTERM or Ctrl-C stops it in order: launchers first, whose replicas checkpoint and exit 143
while the rest of the cluster still runs, then schedulers and agents, then etcd; started again
on the same work dir, the jobs resume from those checkpoints. It watches etcd: a member that
dies is said in one line (with its last log line and the free space under its data dir) and
started again once its disk has room.

    pollux-up [--nodes 2] [--gpus 2] [--schedulers 2] [--agents 1] [--policy NAME] [--demo]
              [--workdir DIR] [--etcd-dir DIR] [--insecure-replicas] [--insecure]
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from pollux.client import Client
from pollux.client.config import Context, config_path, write_context
from pollux.service import auth, pki
from pollux.service.bootstrap import create_token
from pollux.service.demo import follow_demo
from pollux.service.store import Store
from pollux.service.tls import TlsFiles
from pollux.v1 import types_pb2 as pb

ETCD_HEALTH_FLAGS = ("--auto-compaction-mode=periodic", "--auto-compaction-retention=5m")
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
        replica_isolation: Each job's replicas run under a uid of the job's own (the
            launchers' default job_policy), which needs root. None: isolated when run as root,
            else the replicas run as this user and the launchers are told --insecure (they warn
            at every start); `pollux-up` itself refuses that unless told so.
        etcd_dir: Where the etcd members keep their data (default: the work dir); a
            filesystem of its own keeps a job that fills the work dir's from stopping etcd.
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
    replica_isolation: bool | None = None
    etcd_dir: Path | None = None
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
    _etcd_down: dict[int, float] = field(default_factory=dict)
    """Members found dead by `watch_etcd`, with when they were found (monotonic)."""

    @property
    def isolated(self) -> bool:
        """Whether replicas run under their job's own uid (see `replica_isolation`)."""
        if self.replica_isolation is None:
            return os.geteuid() == 0
        return self.replica_isolation

    @property
    def admin_token_file(self) -> Path:
        """Where the admin token of a secure cluster is kept (0600), reused on restart."""
        return self.pki_dir / "admin-token"

    def etcd_data_dir(self, index: int) -> Path:
        """The data dir of etcd member `index`."""
        name = "etcd" if index == 0 else f"etcd-{index}"
        return (self.etcd_dir or self.workdir) / name

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
        """The admin token: the one kept in the work dir if etcd still has it, else a new one.

        So starting again on the same work dir does not mint a second never-expiring token.
        """
        identity = self._identity("pollux-up")
        tls = TlsFiles(self.pki_dir / "ca.pem", identity.cert, identity.key)
        store = await Store.connect(self.etcd_endpoint, tls=tls)
        try:
            kept = _read_private(self.admin_token_file)
            parsed = auth.parse_token(kept) if kept else None
            if parsed is not None:
                record = await store.get(store.keys.token(parsed[0]), pb.ApiToken)
                if record is not None and auth.token_matches(parsed[1], record.value.secret_sha256):
                    expiry = record.value.expire_time.ToNanoseconds()
                    if not expiry or expiry > time.time_ns():
                        return kept
            token = await create_token(store, "admin", description="pollux-up")
            _write_private(self.admin_token_file, token)
            return token
        finally:
            await store.close()

    def _prepare_workdir(self) -> None:
        """Make the work dir's layout with its modes; check job uids can reach their files.

        Keys and logs are the cluster's own (0700); the work dir itself is traversable (0711)
        so that job uids reach their own checkpoint and scratch directories (0700, theirs).
        """
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.workdir.chmod(0o711)
        for private in (self.workdir / "logs", self.pki_dir):
            private.mkdir(mode=0o700, exist_ok=True)
            private.chmod(0o700)
        if self.etcd_dir is not None:
            self.etcd_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not self.isolated:
            return
        if os.geteuid() != 0:
            raise RuntimeError(
                "replicas can only run under their job's own uid (so that no job reads a key, "
                "a token or another job's files) when pollux-up runs as root: run it as root, "
                "or pass --insecure-replicas to run them as your own user"
            )
        blocked = _untraversable(self.workdir.resolve())
        if blocked is not None:
            raise RuntimeError(
                f"jobs run under their own uids and cannot reach {self.workdir}: {blocked} is "
                "not traversable by others; use a --workdir under a directory others may "
                f"traverse (e.g. /var/tmp), or chmod o+x {blocked}"
            )
        environment = Path(sys.prefix).resolve()
        blocked = _untraversable(environment)
        if blocked is not None or not os.stat(environment).st_mode & 0o005:
            raise RuntimeError(
                f"jobs run under their own uids and cannot use this Python environment "
                f"({environment}): {blocked or environment} is not readable by others; "
                "install it where others may read it (chmod -R o+rX), or pass "
                "--insecure-replicas"
            )

    def start(self) -> LocalCluster:
        """Start every process and wait until each listens."""
        self._prepare_workdir()
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
            f"--data-dir={self.etcd_data_dir(index)}",
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
        for member in self.etcd_procs:
            if member.process.poll() is None:
                member.process.terminate()
        for member in self.etcd_procs:
            try:
                member.process.wait(10)
            except subprocess.TimeoutExpired:
                member.process.kill()
                member.process.wait()

    def write_cli_context(self, path: Path, name: str = "local") -> Path:
        """Write a `pollux-cli` context for this cluster as the admin: 0600 in a 0700 dir."""
        servers = ",".join(self.scheduler_addresses)
        context = Context(server=servers, ca_file=self.ca_file, token=self.admin_token)
        write_context(path, name, context)
        path.parent.chmod(0o700)  # the token's directory: the admin's alone
        return path

    def watch_etcd(self, say: Callable[[str], None] = print) -> list[int]:
        """Say in one line when an etcd member has died; start it again once it has room.

        Call it periodically (`pollux-up` does, every second). A member is started again once
        the filesystem under its data dir has `ETCD_ROOM_BYTES` free (a member that died of a
        full disk would die again at once), and that is said too. Returns the members started.
        """
        restarted = []
        for index, member in enumerate(self.etcd_procs):
            code = member.process.poll()
            if code is None:
                continue
            data = self.etcd_data_dir(index)
            free = _free_bytes(data)
            if index not in self._etcd_down:
                self._etcd_down[index] = time.monotonic()
                last = _last_line(member.log) or "(no output)"
                say(
                    f"pollux-up: etcd member {member.name} exited with code {code}: {last}; "
                    f"{_shown_bytes(free)} free under {data}"
                    + ("" if free >= ETCD_ROOM_BYTES else "; it starts again once space is freed")
                )
            if free < ETCD_ROOM_BYTES:
                continue
            try:
                self.restart_etcd_member(index)
            except RuntimeError as error:
                say(f"pollux-up: etcd member {member.name} did not start again: {error}")
                continue
            del self._etcd_down[index]
            restarted.append(index)
            say(f"pollux-up: etcd member {member.name} started again")
        return restarted

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


STOP_WAIT_S = 60.0
"""How long `stop` waits for each process after SIGTERM before SIGKILL (a launcher's replicas
get their stop grace, 30 s by default, within it)."""


def _read_private(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""


def _write_private(path: Path, text: str) -> None:
    """Write a secret file: 0600 from its creation, replaced atomically."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text + "\n")
    os.replace(tmp, path)


def _untraversable(path: Path) -> Path | None:
    """The first of `path` and its parents that others may not traverse (no o+x), or None."""
    for directory in [*reversed(path.parents), path]:
        try:
            mode = directory.stat().st_mode
        except OSError:
            return directory
        if not mode & 0o001:
            return directory
    return None


def _free_bytes(path: Path) -> int:
    """Bytes free for root under `path` (or its nearest existing parent)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    info = os.statvfs(path)
    return info.f_bfree * info.f_frsize


def _shown_bytes(count: int) -> str:
    return f"{count / 2**20:.1f} MiB" if count >= 2**20 else f"{count} bytes"


def _last_line(log: Path) -> str:
    """The last non-empty line of a process's log (its dying words), cut to 300 characters."""
    try:
        with log.open("rb") as lines:
            lines.seek(0, os.SEEK_END)
            lines.seek(max(0, lines.tell() - 4096))
            tail = lines.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return tail[-1].strip()[:300] if tail else ""


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
    parser.add_argument(
        "--insecure-replicas",
        action="store_true",
        help="run every job's replicas as the user running pollux-up, not under a uid of the "
        "job's own (what a non-root pollux-up needs): jobs can then read each other's files "
        "and the cluster's keys",
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


def _announce(cluster: LocalCluster, context_name: str) -> None:
    """Say where everything is, and write the CLI's context (a secure cluster)."""
    servers = ",".join(cluster.scheduler_addresses)
    logs = cluster.workdir / "logs"
    print(f"etcd {cluster.etcd_endpoint}; schedulers {servers}; logs in {logs}")
    link = cluster.dashboard_link()
    if link is not None:
        print(f"dashboard: {link}")
        if cluster.secure:
            print(
                f"  (HTTPS under the cluster's own CA, {cluster.ca_file}: accept the browser's "
                "certificate warning once, or import that CA)"
            )
    if not cluster.isolated:
        print(
            "pollux-up: WARNING: replicas run as this user, not under a uid of their job's own: "
            "a job can read the cluster's keys, the admin token and other jobs' files",
            flush=True,
        )
    if cluster.secure:
        path = cluster.write_cli_context(config_path(os.environ), context_name)
        print(f"TLS and tokens on; pollux-cli context {context_name!r} (admin) written to {path}")
        print("use it with:  pollux-cli ls", flush=True)
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
        replica_isolation=not (args.insecure or args.insecure_replicas),
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
                return follow_demo(client, Path(args.demo), dashboard=cluster.dashboard_link)
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
