"""This launcher's container runtime: whether it can run a job's image, and how (containers.py).

On a launcher with ``runtime = "podman"`` or ``"docker"``, a job naming an image runs each
replica as the runtime's ``run`` client, supervised like any replica process; a launcher with
``runtime = "process"`` (or whose runtime is not installed) refuses such a job (its replicas
exit 127 saying why), and jobs without an image run as processes whatever the runtime.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from pathlib import Path

import structlog

from pollux.launcher.config import LauncherConfig
from pollux.launcher.containers import (
    NOBODY,
    RunRequest,
    container_env,
    find_runtime,
    mount_problems,
    remove_fenced,
    run_argv,
    runtime_is_rootless,
)
from pollux.launcher.job_policy import RunAs
from pollux.launcher.placement import ReplicaPlan, replica_env
from pollux.launcher.replica import LaunchSpec
from pollux.v1 import types_pb2 as pb


def mounts(spec: pb.JobSpec) -> list[tuple[str, str, bool]]:
    """The job's mounts as (host path, container path, read-only)."""
    return [(m.host_path, m.container_path, m.read_only) for m in spec.mounts]


class ContainerRuntime:
    """The runtime's client as this launcher drives it.

    Args:
        config: The launcher configuration (runtime, its flags, allowed mounts).
        uid: The launcher's effective uid.
        fence_token: The node's fence token, labelled on every container.
    """

    def __init__(self, config: LauncherConfig, *, uid: int, fence_token: str) -> None:
        self.config = config
        self.runtime = config.runtime
        self.node_name = config.node_name
        self._uid = uid
        self.fence_token = fence_token
        self.binary = None if config.runtime == "process" else find_runtime(config.runtime)
        """The client's executable (None: plain processes only, or it is missing)."""
        self.client: tuple[str, ...] = (
            () if self.binary is None else (self.binary, *config.runtime_global_flags)
        )
        """The client's argv before a subcommand (binary and runtime_global_flags)."""
        self.rootless = uid != 0
        """Whether containers run without root (asked of podman at start)."""
        self._log = structlog.get_logger(__name__).bind(node_id=self.node_name)

    async def start(self) -> None:
        """Learn whether podman is rootless; remove the containers a previous launcher left."""
        if self.runtime == "process":
            return
        if self.binary is None:
            self._log.warning(
                "container_runtime_missing",
                runtime=self.runtime,
                reason=f"runtime = {self.runtime} but no {self.runtime} executable is on the "
                "launcher's PATH: every job naming an image fails here until it is installed",
            )
            return
        if self.runtime == "podman":
            rootless = await asyncio.to_thread(runtime_is_rootless, self.client)
            if rootless is not None:
                self.rootless = rootless
        names = await asyncio.to_thread(remove_fenced, self.runtime, self.client, self.fence_token)
        if names:
            self._log.warning("stray_containers_removed", containers=names)

    def problems(self, job_id: str, spec: pb.JobSpec) -> list[str]:
        """Why this node cannot run the job's image; empty when it can."""
        runtime = self.runtime
        if runtime == "process":
            return [
                f"job {job_id} names image {spec.image} but launcher {self.node_name} has "
                "runtime = process: set runtime = podman or docker on the launcher, or submit "
                "without --image"
            ]
        if self.binary is None:
            return [
                f"job {job_id} names image {spec.image} but launcher {self.node_name} has "
                f"runtime = {runtime} and no {runtime} executable on its PATH: install "
                f"{runtime} on the node"
            ]
        return mount_problems(
            mounts(spec), self.config.container_mounts_allowed, node=self.node_name
        )

    def user(self, owner: RunAs | None) -> RunAs:
        """Whom containers run as: the job's user, else nobody (root launcher) or its own."""
        if owner is not None:
            return owner
        return NOBODY if self._uid == 0 else RunAs(self._uid, os.getegid())

    def launch_spec(
        self,
        job_id: str,
        generation: int,
        spec: pb.JobSpec,
        plan: ReplicaPlan,
        contract: Mapping[str, str],
        *,
        environ: Mapping[str, str],
        log_path: Path | None,
        owner: RunAs | None,
        gpu: bool,
    ) -> LaunchSpec:
        """The LaunchSpec of a replica that runs in the job's image.

        Args:
            job_id: The job.
            generation: Its allocation's generation.
            spec: Its spec (naming the image; `problems` found none).
            plan: The replica.
            contract: The replica's environment contract (placement.contract_env).
            environ: The launcher's environment (the client is a host program).
            log_path: The replica's log file, if any.
            owner: The job's user (None: the launcher's).
            gpu: Whether the slot is a GPU (else a CPU slot).
        """
        assert self.binary is not None  # else problems() refused the job
        inside = container_env({**spec.env, **spec.secret_env, **contract}, gpu=gpu)
        request = RunRequest(
            runtime=self.runtime,
            binary=self.binary,
            image=spec.image,
            command=list(spec.command),
            env_names=list(inside),
            job_id=job_id,
            generation=generation,
            rank=plan.rank,
            fence_token=self.fence_token,
            user=self.user(owner),
            checkpoint_dir=contract["POLLUX_CHECKPOINT_DIR"],
            tls_ca=contract.get("POLLUX_TLS_CA", ""),
            working_dir=spec.working_dir,
            shm_size_mb=spec.shm_size_mb,
            mounts=mounts(spec),
            gpu=plan.slot if gpu else None,
            flags=self.config.runtime_flags,
            rootless=self.rootless,
            global_flags=self.config.runtime_global_flags,
        )
        # The client gets the launcher's environment plus the values the container takes by
        # name, so no value appears in its command line.
        client_env = replica_env(environ, spec, contract)
        client_env.update(inside)
        return LaunchSpec(
            command=run_argv(request),
            env=client_env,
            cwd=None,
            log_path=log_path,
            container=request.container(),
            log_max_bytes=self.config.log_max_bytes,
            log_rotations=self.config.log_rotations,
        )
