"""``pollux-launcher``: run one node's launcher.

Configuration comes from defaults, then ``--config FILE`` (TOML), then ``POLLUX_LAUNCHER_*``
environment variables, then the command-line flags (pollux.service.entry); every problem
(including a node with neither GPUs nor a ``--gpus`` slot count, an unwritable checkpoint, log
or scratch root, or replicas that could not each run under their job's own uid — a launcher
that is not root, or one uid for all jobs — without ``--insecure``) is reported at once and
the process exits 2 before registering anything. On SIGTERM
or SIGINT the launcher stops its replicas gracefully (they checkpoint and exit 143), reports
their exits, revokes its lease (the node disappears from the cluster), stops its gRPC server
and exits 0.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from pollux.launcher.config import LauncherConfig
from pollux.launcher.gpus import GpuDetectionError, Inventory, detect
from pollux.launcher.job_files import ROOT_MODES, make_root
from pollux.launcher.launcher import Launcher
from pollux.launcher.servicer import SERVICE_NAME, LauncherServicer
from pollux.service.app import ServiceApp, Servicer
from pollux.service.auth import ADMIN, SERVICE, Authenticator
from pollux.service.config import ConfigError
from pollux.service.entry import Flag, ServiceSpec, run_service
from pollux.service.server import ServiceHost
from pollux.service.store import Store
from pollux.v1 import launcher_service_pb2_grpc as api_grpc


def prepare(config: LauncherConfig) -> Inventory:
    """Check what only the machine can tell: the GPU inventory and the writable roots.

    Raises:
        ConfigError: With every problem found.
    """
    problems = []
    inventory = None
    try:
        inventory = detect(config.gpus)
    except GpuDetectionError as error:
        problems.append(str(error))
    for name, mode in ROOT_MODES.items():
        path: Path = getattr(config, name)
        try:
            make_root(path, mode)
        except OSError as error:
            problems.append(f"{name}: cannot create {path}: {error.strerror}")
    problem = config.job_policy.isolation_problem(os.geteuid())
    if problem and not config.tls.insecure:
        problems.append(
            f"job_policy: {problem}; or start the launcher with --insecure to run replicas "
            "without that isolation"
        )
    if problems or inventory is None:
        raise ConfigError(problems)
    return inventory


class LauncherApp(ServiceApp):
    """One launcher process: the node's `Launcher` (the component) and its LauncherService.

    Args:
        config: The validated configuration.
        inventory: The node's GPUs or CPU slots.
        store: The cluster state (owned by the caller).
    """

    def __init__(self, config: LauncherConfig, inventory: Inventory, store: Store) -> None:
        self.config = config
        self.launcher = Launcher(config, store, inventory, advertise="")
        servicer = Servicer(
            api_grpc.add_LauncherServiceServicer_to_server,
            LauncherServicer(self.launcher),
            SERVICE_NAME,
        )
        # Only services (the schedulers relaying logs) and operators with certificates call in.
        host = ServiceHost.for_config(
            "launcher",
            config.server,
            tls=store.tls,
            authenticator=Authenticator(roles=(SERVICE, ADMIN)),
            require_client_certificate=True,
            insecure=config.tls.insecure,
        )
        super().__init__(host, config.server, self.launcher, [servicer], node_id=config.node_name)


SPEC: ServiceSpec[LauncherConfig, Inventory] = ServiceSpec(
    name="launcher",
    prog="pollux-launcher",
    description="Pollux node launcher: registers the node and runs job replicas.",
    config=LauncherConfig,
    env_prefix="POLLUX_LAUNCHER",
    app=LauncherApp,
    prepare=prepare,
    flags=(
        Flag("--node-name", "node_name", "unique node name (default: the hostname)"),
        Flag("--gpus", "gpus", "serve N CPU slots instead of detected GPUs", int),
        Flag("--checkpoint-root", "checkpoint_root", "replica checkpoint root", Path),
        Flag("--log-root", "log_root", "replica log root", Path),
        Flag("--scratch-root", "scratch_root", "replicas' HOME and TMPDIR root", Path),
    ),
)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``pollux-launcher``; returns the process exit status."""
    return run_service(SPEC, argv)


if __name__ == "__main__":
    sys.exit(main())
