"""What a job may ask of the node it runs on: its directories, its environment, its user.

A job spec is user input and the launcher runs its command, so the launcher's ``[job_policy]``
section (`JobPolicy`) bounds it. A job the policy refuses is not run: each of its replicas on
the node exits 127 (`replica.SPAWN_FAILED`) with the reason, which says what to fix, in its log,
like any replica that cannot start. The rules, and why:

- **working_dir** (when the spec names one) must be absolute and resolve — symlinks and ``..``
  followed, `os.path.realpath` — inside one of `JobPolicy.allowed_roots` (themselves resolved)
  or the launcher's own ``default_working_dir``. The default roots, ``/tmp``, ``/var/tmp``,
  ``/srv`` and ``/home``, are where job code and data conventionally live, and none holds the
  host's configuration or another service's state, which a replica's relative paths would
  otherwise reach (``/etc``, ``/root``, ``/var/lib``, ``/proc``).
- **Checkpoint directory** ``<checkpoint_root>/<job id>``: the job id must be one path
  component, and the directory must resolve inside the resolved checkpoint root, so a symlink
  planted there cannot make the launcher write the generation fence, or hand ownership of a
  directory to the replica user, anywhere else.
- **Environment** (``env`` and ``secret_env``). Refused: the dynamic loader's variables
  (``LD_*``: ``LD_PRELOAD``, ``LD_AUDIT``, ``LD_LIBRARY_PATH``, …), ``GLIBC_TUNABLES`` and
  ``GCONV_PATH``, which make a program load code its command line does not name. The launcher
  execs host programs with the job's environment before the job's own (setpriv, for the
  parent-death signal), so these would run job code inside them; a job that needs them sets
  them in its own command (``env LD_LIBRARY_PATH=… python train.py``, or a wrapper script),
  where they only reach the job's program. `JobPolicy.allow_env` lifts that for names an
  operator trusts (``LD_LIBRARY_PATH`` for site CUDA libraries, say). Interpreter variables
  (``PYTHONPATH``, ``PYTHONSTARTUP``, …) are allowed: the launcher runs no interpreter for a
  job, so they reach only the job's own program, and jobs legitimately set ``PYTHONPATH``.
  Refused too: ``POLLUX_*``, reserved for the replica contract (the API never accepts them),
  and whatever `JobPolicy.deny_env` names. The contract's other variables (``RANK``,
  ``WORLD_SIZE``, ``MASTER_ADDR``, ``CUDA_VISIBLE_DEVICES``, …) may be set, for runs outside
  Pollux, but the launcher's values replace them (placement.replica_env), so none can be
  overridden.
- **User.** A launcher that is not root runs replicas as itself. A root launcher runs them as
  `JobPolicy.run_as_uid` / `run_as_gid` (with no supplementary groups; setpriv switches, in
  the replica's own process, keeping its parent-death signal) and gives that user the
  job's checkpoint directory, the one place a replica must write (its output goes through a
  pipe to the launcher, which writes the log). Unset, replicas run as root — the default, so
  that existing clusters, whose job files may be readable by root alone, keep working — with a
  warning at every launcher start; ``allow_root = false`` refuses to run them as root instead.
  All jobs share the one uid, so they are isolated from the host, not from each other.
- **Containers** (a job naming an ``image``; containers.py). ``working_dir`` is a path in the
  image, so it need only be absolute; the replica user is the same ``run_as_uid``, or nobody
  (65534) for a root launcher with none set, so ``allow_root = false`` has nothing to refuse.
  The environment rules stand (the runtime's client, a host program running as the launcher's
  user, gets the job's variables so that it can pass them on by name), and a job may not set
  what configures that client either (`RUNTIME_CLIENT_PREFIXES`, `RUNTIME_CLIENT_NAMES`:
  ``CONTAINERS_CONF`` or ``HOME`` could point root's podman at a job-written configuration,
  ``DOCKER_HOST`` docker at another daemon); `JobPolicy.allow_env` lifts that too. A host
  path a job mounts must lie in the launcher's ``container_mounts_allowed``
  (`containers.mount_problems`).
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from pollux.v1 import types_pb2 as pb

LOADER_PREFIXES = ("LD_",)
"""Environment prefixes of the dynamic loader, refused in a job's environment."""
LOADER_NAMES = ("GLIBC_TUNABLES", "GCONV_PATH")
"""Other variables that make glibc load job-chosen code or parse job input as root does."""
RUNTIME_CLIENT_PREFIXES = ("CONTAINERS_", "CONTAINER_", "DOCKER_", "PODMAN_", "BUILDAH_", "XDG_")
"""Variables the container runtimes' clients read, refused in an image job's environment."""
RUNTIME_CLIENT_NAMES = (
    "HOME",
    "TMPDIR",
    "REGISTRY_AUTH_FILE",
    "NOTIFY_SOCKET",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
    "GODEBUG",
    "GOTRACEBACK",
    "GOMAXPROCS",
    "GOGC",
    "GOMEMLIMIT",
)
"""More of them (configuration lookup, socket activation, the Go runtime's knobs)."""
RESERVED_PREFIX = "POLLUX_"
"""The replica contract's prefix (docs/architecture.md §7)."""
_ENV_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\*?")
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_MAX_ID = 2**32 - 2
"""Largest uid or gid (2**32 - 1 is the kernel's "no change")."""


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
    run_as_uid: int | None = None
    """Uid replicas run as when the launcher is root (e.g. 65534, nobody); unset: root."""
    run_as_gid: int | None = None
    """Gid replicas run as; unset: the primary group of `run_as_uid` (else the same number)."""
    allow_root: bool = True
    """Whether a root launcher may run replicas as root (only with `run_as_uid` unset or 0)."""

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
        return out

    def run_as(self, launcher_uid: int) -> RunAs | None:
        """Whom replicas run as, or None for the launcher's own user (see module docstring)."""
        if launcher_uid != 0 or self.run_as_uid is None:
            return None
        gid = self.run_as_gid
        if gid is None:
            try:
                gid = pwd.getpwuid(self.run_as_uid).pw_gid
            except KeyError:  # a uid with no passwd entry: its own number as its group
                gid = self.run_as_uid
        return RunAs(self.run_as_uid, gid)

    def root_refused(self, launcher_uid: int) -> bool:
        """Whether replicas would run as root, which `allow_root = false` forbids."""
        runs_as_root = launcher_uid == 0 and not self.run_as_uid
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
        if self.root_refused(launcher_uid) and not image:
            problems.append(
                "replicas would run as root, which job_policy.allow_root = false forbids: set "
                "job_policy.run_as_uid on the launcher (e.g. 65534, nobody)"
            )
        return "; ".join(problems)

    def _working_dir_problems(self, working_dir: str, default: Path | None) -> list[str]:
        if not working_dir:
            return []  # the launcher's default: the operator's choice
        roots = [*self.allowed_roots, *([default] if default is not None else [])]
        shown = ", ".join(str(r) for r in roots) or "(none)"
        fix = "set job_policy.allowed_roots on the launcher or use a directory under them"
        if "\0" in working_dir:
            return ["working_dir contains a NUL byte: remove it"]
        if not os.path.isabs(working_dir):
            return [f"working_dir {working_dir!r} is not an absolute path: give the full path"]
        if inside(working_dir, roots):
            return []
        real = os.path.realpath(working_dir)
        via = "" if real == working_dir else f" (it resolves to {real})"
        return [f"working_dir {working_dir}{via} is outside the allowed roots {shown}: {fix}"]

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


def give_checkpoint_dir(directory: Path, run_as: RunAs | None) -> None:
    """Make the job's checkpoint directory (already created) the replica user's.

    The directory itself only, never followed if it is a link: its files are the replicas' own.

    Raises:
        OSError: It is not a directory, or could not be changed.
    """
    if run_as is None:
        return
    if directory.is_symlink() or not directory.is_dir():
        raise NotADirectoryError(f"{directory} is not a directory")
    os.chown(directory, run_as.uid, run_as.gid, follow_symlinks=False)
