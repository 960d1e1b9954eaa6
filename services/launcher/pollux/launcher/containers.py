"""Replicas in containers: the ``podman run`` / ``docker run`` command line, and clean-up.

A job naming an ``image`` runs each replica as ``<runtime> run --rm … IMAGE COMMAND…`` on a
launcher with ``runtime = "podman"`` or ``"docker"``; the attached client is the replica
process to the rest of the launcher (replica.py) and exits with the container's code. A planned
stop signals the container by name (`Container.signal_argv`), since a remote client does not
forward signals: clients run with ``--sig-proxy=false`` so a replica never gets the stop twice,
and ``--init`` makes a replica without a SIGTERM handler die of it (143). ``runtime_global_flags``
go before every subcommand, so a launcher in a container drives the node's runtime through its
socket (its mounts must then be the node's paths). A SIGKILLed client leaves its container
running, so each is named ``pollux-<job>-<generation>-<rank>`` and labelled ``pollux.fence`` and
``pollux.job``: the replica removes it by name (`Container.remove_argv`), a restarted launcher
or the watchdog by label (`remove_fenced`). The contract's variables pass by name only (``-e
NAME``: no secret in a command line ``ps`` shows); see docs/architecture.md §7.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pollux.launcher.job_policy import RunAs, inside

Runtime = Literal["process", "podman", "docker"]
RUNTIMES: tuple[str, ...] = ("process", "podman", "docker")
"""Values of the launcher's ``runtime`` setting; "process" runs no containers."""
FENCE_LABEL = "pollux.fence"
"""Label carrying the node's fence token (fence.fence_token) on every container it starts."""
JOB_LABEL = "pollux.job"
"""Label carrying the job id."""
NOBODY = RunAs(65534, 65534)
"""Whom a root launcher runs containers as when its job policy names no user."""
_CLI_TIMEOUT_S = 30.0
"""Longest a runtime's ps/rm may take (a wedged runtime must not hang the watchdog)."""


@dataclass(frozen=True, slots=True)
class Container:
    """One replica's container: the runtime client that runs it and its name.

    Attributes:
        runtime: "podman" or "docker".
        binary: The runtime client's path.
        name: The container's name (unique per job, generation and rank).
        global_flags: The launcher's ``runtime_global_flags``, before every subcommand.
    """

    runtime: str
    binary: str
    name: str
    global_flags: tuple[str, ...] = ()

    @property
    def client(self) -> list[str]:
        """The runtime client's argv before a subcommand."""
        return [self.binary, *self.global_flags]

    def remove_argv(self) -> list[str]:
        """The command that kills (SIGKILL, no grace) and removes the container, if it exists."""
        if self.runtime == "podman":
            return [*self.client, "rm", "--force", "--time", "0", "--ignore", self.name]
        return [*self.client, "rm", "--force", self.name]  # docker: SIGKILL, no grace

    def signal_argv(self, signal_name: str = "TERM") -> list[str]:
        """The command that signals the container's init (PID 1), which passes it on.

        It fails while the container does not exist yet.
        """
        return [*self.client, "kill", "--signal", signal_name, self.name]


@dataclass(frozen=True, slots=True)
class RunRequest:
    """What one replica's ``run`` command is made of (container_runtime.py fills it in).

    Attributes:
        runtime: "podman" or "docker".
        binary: The runtime client's path.
        image: The job's image reference (validated by the scheduler).
        command: The job's argv, run in the image.
        env_names: Names of the variables the container gets from the client's environment.
        job_id: The job.
        generation: The allocation generation.
        rank: The replica's global rank.
        fence_token: The node's fence token (labels the container).
        user: Whom the container runs as.
        checkpoint_dir: Mounted read-write at the same path.
        tls_ca: CA file mounted read-only at the same path ("" without TLS).
        working_dir: Working directory in the container ("" for the image's).
        shm_size_mb: /dev/shm size ("0" for the runtime's default).
        mounts: The job's extra (host, container, read_only) mounts, already allowed.
        gpu: The GPU index the replica holds, or None for a CPU slot.
        flags: The launcher's ``runtime_flags``, placed right after ``run``.
        rootless: Whether the runtime runs containers without root (podman then keeps the
            user's uid, --userns=keep-id): `runtime_is_rootless`.
        global_flags: The launcher's ``runtime_global_flags``, before the subcommand.
    """

    runtime: str
    binary: str
    image: str
    command: Sequence[str]
    env_names: Sequence[str]
    job_id: str
    generation: int
    rank: int
    fence_token: str
    user: RunAs
    checkpoint_dir: str
    tls_ca: str = ""
    working_dir: str = ""
    shm_size_mb: int = 0
    mounts: Sequence[tuple[str, str, bool]] = ()
    gpu: int | None = None
    flags: Sequence[str] = ()
    rootless: bool = False
    global_flags: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """``pollux-<job>-<generation>-<rank>``: findable by the replica that started it."""
        return f"pollux-{self.job_id}-{self.generation}-{self.rank}"

    def container(self) -> Container:
        """The handle the replica removes its container with."""
        return Container(self.runtime, self.binary, self.name, self.global_flags)


def run_argv(request: RunRequest) -> list[str]:
    """The ``<runtime> run`` argv of one replica (module docstring)."""
    argv = [request.binary, *request.global_flags, "run", *request.flags]
    argv += ["--rm", "--init", "--sig-proxy=false"]
    argv += ["--name", request.name, "--network=host"]
    argv += ["--label", f"{FENCE_LABEL}={request.fence_token}"]
    argv += ["--label", f"{JOB_LABEL}={request.job_id}"]
    argv += ["--user", f"{request.user.uid}:{request.user.gid}"]
    if request.rootless and request.runtime == "podman":
        argv.append("--userns=keep-id")
    if request.runtime == "podman":
        # The launcher writes the log file itself; podman's own copy would double the disk use.
        argv.append("--log-driver=none")
    for name in sorted(request.env_names):
        argv += ["-e", name]
    argv += ["-v", f"{request.checkpoint_dir}:{request.checkpoint_dir}"]
    if request.tls_ca:
        argv += ["-v", f"{request.tls_ca}:{request.tls_ca}:ro"]
    for host, target, read_only in request.mounts:
        argv += ["-v", f"{host}:{target}" + (":ro" if read_only else "")]
    if request.working_dir:
        argv += ["-w", request.working_dir]
    if request.shm_size_mb:
        argv += ["--shm-size", f"{request.shm_size_mb}m"]
    if request.gpu is not None:
        if request.runtime == "podman":
            argv += ["--device", f"nvidia.com/gpu={request.gpu}"]
        else:
            argv += ["--gpus", f"device={request.gpu}"]
    return [*argv, request.image, *request.command]


def container_env(env: Mapping[str, str], *, gpu: bool) -> dict[str, str]:
    """The environment a container gets, from the one a plain process would get.

    Only the job's variables and the contract go in (the caller passes just those); on a GPU
    slot ``CUDA_VISIBLE_DEVICES`` becomes ``0``, the one GPU the container sees.
    """
    out = dict(env)
    if gpu:
        out["CUDA_VISIBLE_DEVICES"] = "0"
    return out


def find_runtime(runtime: str, path: str | None = None) -> str | None:
    """The runtime client's path on `path` (default PATH), or None when it is not installed."""
    return shutil.which(runtime, path=path)


def mount_problems(
    mounts: Sequence[tuple[str, str, bool]], allowed: Sequence[Path], *, node: str
) -> list[str]:
    """Why the job's mounts may not be made on this node; empty when all are allowed.

    A host path must resolve (symlinks and ``..`` followed) inside one of the launcher's
    ``container_mounts_allowed`` prefixes, themselves resolved: a job may not mount the host's
    /etc, a service's state, or the container runtime's socket.
    """
    prefixes = ", ".join(map(str, allowed)) or "(none)"
    problems = []
    for host, _, _ in mounts:
        if not inside(host, allowed):
            problems.append(
                f"mount of {host} is not allowed on {node} (container_mounts_allowed: {prefixes}): "
                "have the operator allow it or drop the mount"
            )
    return problems


def runtime_is_rootless(client: Sequence[str]) -> bool | None:
    """Whether podman runs containers without root, as it says itself; None if it cannot say.

    Not the launcher's own uid: a non-root launcher in a container may drive the node's
    rootful podman through its socket, where ``--userns=keep-id`` would be refused.
    """
    argv = [*client, "info", "--format", "{{.Host.Security.Rootless}}"]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=_CLI_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    answer = done.stdout.strip().lower()
    return {"true": True, "false": False}.get(answer) if done.returncode == 0 else None


def fenced_containers(client: Sequence[str], token: str) -> list[str]:
    """Names of the containers (running or not) labelled with the node's fence `token`."""
    argv = [*client, "ps", "--all", "--filter", f"label={FENCE_LABEL}={token}"]
    argv += ["--format", "{{.Names}}"]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=_CLI_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def remove_fenced(runtime: str, client: Sequence[str], token: str) -> list[str]:
    """Kill and remove every container carrying the node's fence `token`; their names.

    For a restarted launcher (its predecessor's replicas must not train beside the next
    generation) and the watchdog (the node's lease lapsed), as fence.kill_fenced does for
    processes. Errors are swallowed: a runtime that cannot answer has no containers to remove.
    """
    names = fenced_containers(client, token)
    binary, *flags = client
    for name in names:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(
                Container(runtime, binary, name, tuple(flags)).remove_argv(),
                capture_output=True,
                timeout=_CLI_TIMEOUT_S,
                check=False,
            )
    return names
