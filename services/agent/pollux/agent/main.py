"""``pollux-agent``: run one agent process.

Configuration comes from defaults, then ``--config FILE`` (TOML), then ``POLLUX_AGENT_*``
environment variables, then the command-line flags; every problem is reported at once and the
process exits 2 before touching anything (pollux.service.entry). On SIGTERM or SIGINT the agent
deregisters (revokes its lease, so launchers and other agents stop routing its jobs to it at
once), lets in-flight RPCs finish, and exits 0. It writes only logs.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence

from pollux.agent.agent import Agent
from pollux.agent.config import AgentConfig
from pollux.agent.servicer import SERVICE_NAME, AgentServicer
from pollux.service.app import ServiceApp, Servicer
from pollux.service.auth import Authenticator
from pollux.service.entry import Flag, ServiceSpec, run_service
from pollux.service.job_credentials import JobKeyring, JobLiveness
from pollux.service.server import ServiceHost
from pollux.service.store import Store
from pollux.v1 import agent_service_pb2_grpc as api_grpc


class AgentApp(ServiceApp):
    """An agent process: the `Agent` (the component) and its AgentService.

    Args:
        config: The validated configuration.
        store: The cluster state (owned by the caller).
        clock: Wall-clock seconds for the agent (injected by tests).
    """

    def __init__(
        self, config: AgentConfig, store: Store, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.agent = Agent(store, config, clock=clock)
        servicer = Servicer(
            api_grpc.add_AgentServiceServicer_to_server, AgentServicer(self.agent), SERVICE_NAME
        )
        # Replicas have no certificates: they prove their job with a job credential, which
        # dies with its job.
        keyring = JobKeyring(store)
        liveness = JobLiveness(store)
        host = ServiceHost.for_config(
            "agent",
            config.server,
            tls=store.tls,
            authenticator=Authenticator(job_key=keyring.key, job_ended=liveness.ended),
            insecure=config.tls.insecure,
        )
        super().__init__(host, config.server, self.agent, [servicer], agent_id=config.agent_id)


SPEC: ServiceSpec[AgentConfig, None] = ServiceSpec(
    name="agent",
    prog="pollux-agent",
    description="Pollux agent: fits job models, tunes batch sizes.",
    config=AgentConfig,
    env_prefix="POLLUX_AGENT",
    app=lambda config, _, store: AgentApp(config, store),
    flags=(Flag("--id", "agent_id", "unique agent id"),),
)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``pollux-agent``; returns the process exit status."""
    return run_service(SPEC, argv)


if __name__ == "__main__":
    sys.exit(main())
