"""How each replica of a job's generation is started here: admitted, then its `LaunchSpec`.

Admission asks the launcher's job policy (job_policy.py), the container runtime and the job's
uid claim whether the job may run on this node; a refused job still gets its replicas, which
exit 127 with the reason in their log (nothing of the job is created). An admitted replica
gets its directories (workspaces.py) and the environment contract (placement.contract_env),
as a process under the job's user or as the runtime's ``run`` client (container_runtime.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pollux.launcher import job_users
from pollux.launcher.config import LauncherConfig
from pollux.launcher.container_runtime import ContainerRuntime
from pollux.launcher.gpus import Inventory
from pollux.launcher.job_policy import RunAs, checkpoint_problems
from pollux.launcher.placement import ReplicaPlan, contract_env, replica_env
from pollux.launcher.replica import LaunchSpec
from pollux.launcher.workspaces import JobDirs, Workspaces
from pollux.service.auth import job_credential
from pollux.service.job_credentials import JobKeyring
from pollux.service.store import Store
from pollux.v1 import types_pb2 as pb

_SESSION_VARIABLES = frozenset({"SSH_AUTH_SOCK", "DBUS_SESSION_BUS_ADDRESS", "KRB5CCNAME", "MAIL"})
"""The launcher's own session's variables, not passed on to replicas."""


@dataclass(frozen=True, slots=True)
class JobLaunch:
    """What the replicas of one job's generation on this node share.

    Attributes:
        job_id: The job.
        generation: Its allocation's generation.
        spec: Its spec.
        refusal: Why it may not run here (empty: it may).
        refusal_final: The refusal is of the job itself (policy, image): every start here
            would be refused alike; False for a shortage that passes (no free job uid).
        owner: Whom its replicas run as (None: the launcher's user).
        agent_addrs: Its agents, owner first (pollux.service.ownership).
        credential: Its replicas' credential (empty without TLS).
        ca_pem: The cluster CA a process replica reads from its scratch directory.
        log_dir: Its directory under the log root (None: logs kept in memory only).
    """

    job_id: str
    generation: int
    spec: pb.JobSpec
    refusal: str
    owner: RunAs | None
    agent_addrs: Sequence[str]
    credential: str
    ca_pem: bytes
    log_dir: str | None
    refusal_final: bool = False


class LaunchSpecs:
    """Admits jobs to this node and says how to start each replica.

    Args:
        config: The launcher configuration.
        store: The cluster state (its TLS files; the job-credential key).
        inventory: The node's GPUs or CPU slots.
        workspaces: The jobs' users and directories.
        runtime: The container runtime.
        uid: The launcher's effective uid.
        environ: Environment replicas inherit.
    """

    def __init__(
        self,
        config: LauncherConfig,
        store: Store,
        inventory: Inventory,
        workspaces: Workspaces,
        runtime: ContainerRuntime,
        *,
        uid: int,
        environ: Mapping[str, str],
    ) -> None:
        self.config = config
        self.store = store
        self.inventory = inventory
        self.workspaces = workspaces
        self.runtime = runtime
        self._uid = uid
        self.environ = dict(environ)
        self._keyring = JobKeyring(store)

    async def admit(
        self, job_id: str, generation: int, spec: pb.JobSpec, agent_addrs: Sequence[str]
    ) -> JobLaunch:
        """What this node's replicas of the generation share, with the refusal if any.

        Raises:
            StoreError: etcd failed (the launch is retried on the next pass).
        """
        config = self.config
        refusal = config.job_policy.refusal(
            spec,
            job_id=job_id,
            checkpoint_root=config.checkpoint_root,
            default_working_dir=config.default_working_dir,
            launcher_uid=self._uid,
        )
        if spec.image:
            refusal = "; ".join(filter(None, [*self.runtime.problems(job_id, spec), refusal]))
        owner = self.workspaces.run_as
        final = bool(refusal)
        if not refusal:
            try:
                owner = await self.workspaces.job_user(job_id)
            except job_users.NoFreeUid as error:
                refusal = str(error)
            except ValueError as error:  # a claim outside this launcher's range
                refusal = str(error)
        tls = self.store.tls
        credential = job_credential(await self._keyring.key(), job_id) if tls else ""
        # A process replica reads the CA from its scratch directory (the launcher's copy may
        # lie where job uids cannot read); a container gets the launcher's file mounted.
        ca_pem = tls.paths[0].read_bytes() if tls and not refusal and not spec.image else b""
        log_dir = None if checkpoint_problems(job_id, config.log_root) else job_id
        return JobLaunch(
            job_id=job_id,
            generation=generation,
            spec=spec,
            refusal=refusal,
            owner=owner,
            agent_addrs=list(agent_addrs),
            refusal_final=final,
            credential=credential,
            ca_pem=ca_pem,
            log_dir=log_dir,
        )

    def launch_spec(self, launch: JobLaunch, plan: ReplicaPlan) -> LaunchSpec:
        """How to start one replica (called as it starts: directories are made here).

        Raises:
            OSError: A directory could not be made (the replica fails saying so).
        """
        config, spec, owner = self.config, launch.spec, launch.owner
        log_path = (
            None
            if launch.log_dir is None
            else config.log_root / launch.log_dir / f"{launch.generation}-{plan.rank}.log"
        )
        if launch.refusal:
            return LaunchSpec(
                command=list(spec.command),
                env={},
                cwd=None,
                log_path=log_path,
                run_as=owner,
                refusal=launch.refusal,
                refusal_final=launch.refusal_final,
            )
        dirs = self.workspaces.prepare_dirs(
            launch.job_id, launch.generation, owner, launch.ca_pem, scratch=not spec.image
        )
        tls = self.store.tls
        ca = dirs.ca if dirs.ca is not None else (tls.paths[0] if tls else None)
        contract = contract_env(
            plan,
            job_id=launch.job_id,
            generation=launch.generation,
            agent_addrs=launch.agent_addrs,
            checkpoint_dir=str(dirs.checkpoint),
            cuda=self.inventory.cuda,
            fence_token=self.runtime.fence_token,
            credential=launch.credential,
            tls_ca=str(ca) if ca is not None else "",
        )
        if spec.image:
            return self.runtime.launch_spec(
                launch.job_id,
                launch.generation,
                spec,
                plan,
                contract,
                environ=self.environ,
                log_path=log_path,
                owner=owner,
                gpu=self.inventory.cuda,
            )
        default_dir = config.default_working_dir
        return LaunchSpec(
            command=list(spec.command),
            env=replica_env(self.replica_environ(dirs, owner), spec, contract),
            cwd=spec.working_dir or (None if default_dir is None else str(default_dir)),
            log_path=log_path,
            run_as=owner,
            log_max_bytes=config.log_max_bytes,
            log_rotations=config.log_rotations,
        )

    def replica_environ(self, dirs: JobDirs, owner: RunAs | None) -> dict[str, str]:
        """What a replica inherits: the launcher's environment with a HOME, TMPDIR of its own.

        Variables that point at the launcher's own sessions (XDG dirs, agent sockets) go.
        """
        env = {
            name: value
            for name, value in self.environ.items()
            if not name.startswith("XDG_") and name not in _SESSION_VARIABLES
        }
        env["HOME"] = str(dirs.home)
        env["TMPDIR"] = str(dirs.tmp)
        if owner is not None and self.workspaces.per_job_uids:
            # No passwd entry names the uid: getpass and friends read these first.
            env["USER"] = env["LOGNAME"] = f"pollux-{owner.uid}"
        return env
