"""What a job may ask of the node it runs on: its directories, its environment, its user.

A job spec is user input and the launcher runs its command, so ``[job_policy]`` (`JobPolicy`)
bounds it; a refused job's replicas exit 127 (`replica.SPAWN_FAILED`) with the reason and the
fix in their log. ``working_dir`` must resolve (links and ``..`` followed) inside
`JobPolicy.allowed_roots` or ``default_working_dir``; the checkpoint directory
``<checkpoint_root>/<job id>`` inside the checkpoint root. The environment may not set the
loader's variables (``LD_*``, ``GLIBC_TUNABLES``, ``GCONV_PATH``: an image job's runtime
client, a host program, runs with it), ``POLLUX_*``, what `JobPolicy.deny_env` names, nor
for an image job what configures the runtime's client (`RUNTIME_CLIENT_PREFIXES`,
`RUNTIME_CLIENT_NAMES`); `JobPolicy.allow_env` lifts a name an operator trusts. A root
launcher runs each job under a uid of its own (job_users.py); one that cannot refuses to start
unless told ``--insecure`` (`isolation_problem`). Why each rule: docs/architecture.md §6, §9.
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from pollux.service.local.workdir import untraversable
from pollux.v1 import types_pb2 as pb

LOADER_PREFIXES = ("LD_",)
"""Environment prefixes of the dynamic loader, refused in a job's environment."""
LOADER_NAMES = ("GLIBC_TUNABLES", "GCONV_PATH")
"""Other variables that make glibc load job-chosen code or parse job input as root does."""
# What configures a container runtime's client, or the runtime it drives, from the client's
# environment (checked against the runtimes' own documentation):
# - podman(1), "Environment Variables" (https://docs.podman.io/en/latest/markdown/podman.1.html):
#   CONTAINERS_CONF, CONTAINERS_REGISTRIES_CONF, CONTAINERS_STORAGE_CONF, CONTAINER_CONNECTION,
#   CONTAINER_HOST, CONTAINER_SSHKEY, CONTAINER_PASSPHRASE, PODMAN_CONNECTIONS_CONF, STORAGE_DRIVER,
#   STORAGE_OPTS, TMPDIR, XDG_CONFIG_HOME, XDG_DATA_HOME, XDG_RUNTIME_DIR, and proxies ("podman
#   run" passes HTTP_PROXY, HTTPS_PROXY, FTP_PROXY, NO_PROXY into containers unless
#   --http-proxy=false); containers-storage.conf(5) (STORAGE_DRIVER, STORAGE_OPTS override the
#   file), containers.conf(5) (CONTAINERS_CONF, CONTAINERS_CONF_OVERRIDE, $HOME/.config),
#   containers-registries.conf(5), containers-auth.json(5) (REGISTRY_AUTH_FILE, DOCKER_CONFIG),
#   and podman's own re-exec markers for rootless user namespaces (_CONTAINERS_USERNS_CONFIGURED,
#   _CONTAINERS_ROOTLESS_UID, _CONTAINERS_ROOTLESS_GID);
# - docker's CLI, "Environment variables" (https://docs.docker.com/reference/cli/docker/):
#   DOCKER_API_VERSION, DOCKER_CERT_PATH, DOCKER_CONFIG, DOCKER_CONTENT_TRUST*,
#   DOCKER_CONTEXT, DOCKER_CUSTOM_HEADERS, DOCKER_DEFAULT_PLATFORM, DOCKER_HOST, DOCKER_TLS,
#   DOCKER_TLS_VERIFY, BUILDKIT_PROGRESS; "Use a proxy server with the Docker CLI"
#   (https://docs.docker.com/engine/cli/proxy/): HTTP_PROXY, HTTPS_PROXY, FTP_PROXY, NO_PROXY,
#   ALL_PROXY in either case;
# - both clients are Go programs: Go's net/http reads the proxy variables above and
#   crypto/x509 reads SSL_CERT_FILE and SSL_CERT_DIR (a job-chosen CA bundle would let it trust
#   a registry impostor); REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE and the other CA-bundle names go
#   too, for the helpers (credential helpers, hooks) the runtimes start; GODEBUG & co. tune the
#   Go runtime itself.
RUNTIME_CLIENT_PREFIXES = (
    "CONTAINERS_",
    "CONTAINER_",
    "_CONTAINERS_",
    "DOCKER_",
    "PODMAN_",
    "BUILDAH_",
    "BUILDKIT_",
    "XDG_",
)
"""Prefixes of variables that configure the runtime's client, refused in an image job's env."""
PROXY_NAMES = ("HTTP_PROXY", "HTTPS_PROXY", "FTP_PROXY", "NO_PROXY", "ALL_PROXY")
"""Proxy variables, refused in either case (http_proxy too: Go and curl read both)."""
CA_BUNDLE_NAMES = (
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NIX_SSL_CERT_FILE",
    "GIT_SSL_CAINFO",
    "NODE_EXTRA_CA_CERTS",
    "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH",
)
"""CA bundle variables: which authorities the client (or a helper it runs) trusts."""
RUNTIME_CLIENT_NAMES = (
    "HOME",
    "TMPDIR",
    "PATH",
    "STORAGE_DRIVER",
    "STORAGE_OPTS",
    "REGISTRY_AUTH_FILE",
    "REGISTRIES_CONFIG_PATH",
    "SSH_AUTH_SOCK",
    "NOTIFY_SOCKET",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
    "DBUS_SESSION_BUS_ADDRESS",
    "GODEBUG",
    "GOTRACEBACK",
    "GOMAXPROCS",
    "GOGC",
    "GOMEMLIMIT",
    *PROXY_NAMES,
    *(name.lower() for name in PROXY_NAMES),
    *CA_BUNDLE_NAMES,
)
"""More of them: configuration lookup (PATH finds the helpers the runtime starts: conmon,
the OCI runtime), storage, registries, socket activation, the Go runtime, proxies, CA bundles."""
RESERVED_PREFIX = "POLLUX_"
"""The replica contract's prefix (docs/architecture.md §7)."""
_ENV_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\*?")
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_MAX_ID = 2**32 - 2
"""Largest uid or gid (2**32 - 1 is the kernel's "no change")."""
DEFAULT_JOB_UIDS = (0x70000000, 0x7000FFFF)
"""65,536 uids from 1879048192: above every range systemd gives accounts, dynamic users and
containers (https://systemd.io/UIDS-GIDS/: containers end at 0x6FFFFFFF) and below 2**31,
which some tools still read as a signed number."""


@dataclasses.dataclass(frozen=True, slots=True)
class RunAs:
    """The user and group replicas run as (no supplementary groups)."""

    uid: int
    gid: int


@dataclasses.dataclass(frozen=True, slots=True)
class JobPolicy:
    """The launcher's ``[job_policy]``: what a job may ask of the node (module docstring)."""

    allowed_roots: tuple[Path, ...] = (Path("/tmp"), Path("/var/tmp"), Path("/srv"), Path("/home"))
    """Directories a job's working_dir must resolve inside (the default working dir is too)."""
    deny_env: tuple[str, ...] = ()
    """More environment variables jobs may not set: names, or prefixes ending in ``*``."""
    allow_env: tuple[str, ...] = ()
    """Names exempt from the built-in loader denylist (e.g. ``LD_LIBRARY_PATH``)."""
    job_uids: tuple[int, ...] = DEFAULT_JOB_UIDS
    """Inclusive [low, high] range of the uids jobs' replicas run as, one per job (the same
    range on every launcher of a cluster; no account of the node may use these uids)."""
    run_as_uid: int | None = None
    """One uid for every job's replicas instead of one per job: jobs can then read each
    other's files, so the launcher needs --insecure (unset: per-job uids)."""
    run_as_gid: int | None = None
    """Gid with `run_as_uid`; unset: the primary group of `run_as_uid` (else the same number)."""
    allow_root: bool = False
    """Whether `run_as_uid` may be 0 (root)."""

    def problems(self) -> list[str]:
        """Every invalid value, as "field: problem"."""
        out = []
        for root in self.allowed_roots:
            if not root.is_absolute():
                out.append(f"allowed_roots: {str(root)!r} must be an absolute path")
        for name in ("deny_env", "allow_env"):
            for entry in getattr(self, name):
                if not _ENV_PATTERN.fullmatch(entry) or (name == "allow_env" and "*" in entry):
                    what = "a variable name" + (" or a prefix ending in *" * (name == "deny_env"))
                    out.append(f"{name}: {entry!r} is not {what}")
        for name in ("run_as_uid", "run_as_gid"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= _MAX_ID:
                out.append(f"{name}: {value} must be in [0, {_MAX_ID}]")
        if self.run_as_gid is not None and self.run_as_uid is None:
            out.append("run_as_gid: set run_as_uid too (a group alone changes nothing)")
        if self.run_as_uid == 0 and not self.allow_root:
            out.append("run_as_uid: 0 is root, which allow_root = false forbids")
        uids = self.job_uids
        if len(uids) != 2 or not 1 <= uids[0] <= uids[1] <= _MAX_ID:
            out.append(
                f"job_uids: {list(uids)} must be [low, high] with 1 <= low <= high <= {_MAX_ID}"
            )
        return out

    def isolation_problem(self, launcher_uid: int) -> str:
        """Why replicas would not each run under their job's own uid; "" when they will."""
        if launcher_uid != 0:
            return (
                f"the launcher runs as uid {launcher_uid}, not root, so every replica would run "
                "as the launcher's own user and could read its key and every other job's "
                "files: run the launcher as root (replicas then get a uid of their job's own "
                "from job_policy.job_uids)"
            )
        if self.run_as_uid is not None:
            return (
                f"job_policy.run_as_uid = {self.run_as_uid} runs every job's replicas as one "
                "user, who can read every job's checkpoints and logs: unset it (replicas then "
                "get a uid of their job's own from job_policy.job_uids)"
            )
        return ""

    def run_as(self, launcher_uid: int, job_uid: int | None = None) -> RunAs | None:
        """Whom a job's replicas run as, or None for the launcher's own user.

        `job_uid` is the job's claimed uid (job_users.py), used when the launcher is root and
        `run_as_uid` is unset.

        Raises:
            ValueError: A root launcher with per-job uids was given no `job_uid`.
        """
        if launcher_uid != 0:
            return None
        if self.run_as_uid is None:
            if job_uid is None:
                raise ValueError("a root launcher runs replicas under their job's uid: give it")
            return RunAs(job_uid, job_uid)
        gid = self.run_as_gid
        if gid is None:
            try:
                gid = pwd.getpwuid(self.run_as_uid).pw_gid
            except KeyError:  # a uid with no passwd entry: its own number as its group
                gid = self.run_as_uid
        return RunAs(self.run_as_uid, gid)

    def per_job_uids(self, launcher_uid: int) -> bool:
        """Whether each job's replicas get a uid of their own (`isolation_problem` is "")."""
        return not self.isolation_problem(launcher_uid)

    def root_refused(self, launcher_uid: int) -> bool:
        """Whether replicas would run as root, which `allow_root = false` forbids."""
        runs_as_root = launcher_uid == 0 and self.run_as_uid == 0
        return runs_as_root and not self.allow_root

    def refusal(
        self,
        spec: pb.JobSpec,
        *,
        job_id: str,
        checkpoint_root: Path,
        default_working_dir: Path | None,
        launcher_uid: int,
    ) -> str:
        """Why the job may not run here, each problem with its fix; empty when it may."""
        # Read by name, like secret_env: a container's working_dir is a path in its image.
        image = getattr(spec, "image", "")
        if image:
            work = _container_working_dir_problems(spec.working_dir)
        else:
            work = self._working_dir_problems(spec.working_dir, default_working_dir)
        problems = [
            *work,
            *checkpoint_problems(job_id, checkpoint_root),
            *self.env_problems(spec.env, "env", container=bool(image)),
            # Read by name: the field is newer than some JobSpec builds this runs beside.
            *self.env_problems(
                getattr(spec, "secret_env", {}), "secret_env", container=bool(image)
            ),
        ]
        if not work and not image and self.per_job_uids(launcher_uid):
            problems += _closed_to_job_uids(spec.working_dir or default_working_dir)
        if self.root_refused(launcher_uid) and not image:
            problems.append(
                "replicas would run as root, which job_policy.allow_root = false forbids: unset "
                "job_policy.run_as_uid on the launcher (replicas then get their job's own uid)"
            )
        return "; ".join(problems)

    def _working_dir_problems(self, working_dir: str, default: Path | None) -> list[str]:
        if not working_dir:
            return []  # the launcher's default: the operator's choice
        roots = [*self.allowed_roots, *([default] if default is not None else [])]
        roots_list = ", ".join(str(r) for r in roots) or "(none)"
        fix = "set job_policy.allowed_roots on the launcher or use a directory under them"
        if "\0" in working_dir:
            return ["working_dir contains a NUL byte: remove it"]
        if not os.path.isabs(working_dir):
            return [f"working_dir {working_dir!r} is not an absolute path: give the full path"]
        if inside(working_dir, roots):
            return []
        real = os.path.realpath(working_dir)
        via = "" if real == working_dir else f" (it resolves to {real})"
        return [f"working_dir {working_dir}{via} is outside the allowed roots {roots_list}: {fix}"]

    def env_problems(
        self, env: Mapping[str, str], where: str, *, container: bool = False
    ) -> list[str]:
        """The job's variables this policy refuses, by name with the reason.

        `container`: the job runs in an image, so its variables also pass through the
        runtime's client (module docstring).
        """
        refused = []
        for name in sorted(env):
            reason = self._env_reason(name)
            if not reason and container and name not in self.allow_env:
                reason = _runtime_client_reason(name)
            if reason:
                refused.append(f"{where} variable {name} is refused, {reason}")
        return refused

    def _env_reason(self, name: str) -> str:
        if name.startswith(RESERVED_PREFIX):
            return "as POLLUX_* is reserved for the variables the launcher sets: rename it"
        if _matches(name, self.deny_env):
            return "as job_policy.deny_env on the launcher names it: drop it from the job"
        if name in self.allow_env:
            return ""
        if name.startswith(LOADER_PREFIXES) or name in LOADER_NAMES:
            return (
                "as it makes programs the launcher starts load other code: set it in the job's "
                "command instead (env NAME=value program …) or have the operator add it to "
                "job_policy.allow_env"
            )
        return ""


def _closed_to_job_uids(working_dir: str | Path | None) -> list[str]:
    """Why a replica under its job's own uid (an "other", in no group) cannot enter the dir."""
    real = Path(os.path.realpath(working_dir)) if working_dir else None
    if real is None or not real.is_dir():
        return []  # none, or missing: the start says so
    blocked = untraversable(real)
    if blocked is None:
        return []
    mode = f"{blocked.stat().st_mode & 0o777:o}"
    return [
        f"working_dir {working_dir} cannot be entered by the job's own uid, which replicas run "
        f"under: {blocked} (mode {mode}) is closed to other users; chmod o+x {blocked}, or keep "
        "the job's files under a directory others may enter"
    ]


def _runtime_client_reason(name: str) -> str:
    if name.startswith(RUNTIME_CLIENT_PREFIXES) or name in RUNTIME_CLIENT_NAMES:
        return (
            "as it configures the container runtime the launcher runs the image with: set it "
            "in the image or the job's command instead, or have the operator add it to "
            "job_policy.allow_env"
        )
    return ""


def _container_working_dir_problems(working_dir: str) -> list[str]:
    if "\0" in working_dir:
        return ["working_dir contains a NUL byte: remove it"]
    if working_dir and not os.path.isabs(working_dir):
        return [f"working_dir {working_dir!r} is not an absolute path in the image: give one"]
    return []


def checkpoint_problems(job_id: str, checkpoint_root: Path) -> list[str]:
    """Why ``<checkpoint_root>/<job_id>`` is not a safe checkpoint directory; empty if it is."""
    if not _JOB_ID.fullmatch(job_id) or job_id in (".", ".."):
        return [f"job id {job_id!r} is not one path component: the job cannot get a directory"]
    directory = checkpoint_root / job_id
    if inside(str(directory), [checkpoint_root]):
        return []
    return [
        f"checkpoint directory {directory} resolves to {os.path.realpath(directory)}, outside "
        f"the checkpoint root {checkpoint_root}: remove the link at {directory}"
    ]


def inside(path: str, roots: Iterable[Path]) -> bool:
    """Whether `path`, resolved, is one of `roots` (resolved) or below one of them."""
    real = os.path.realpath(path)
    for root in roots:
        base = os.path.realpath(root)
        if os.path.commonpath([real, base]) == base:
            return True
    return False


def _matches(name: str, patterns: Sequence[str]) -> bool:
    return any(name.startswith(p[:-1]) if p.endswith("*") else name == p for p in patterns)
