"""Where a trainer's batch configurations come from and where its measurements go.

Either may be given by the caller (a `BatchConfigSource`, a `MetricsSink`); whichever is not
is the job's agent, reached through the `AgentLink` named by ``POLLUX_AGENT_ADDR``. Only rank 0
polls and reports, so only rank 0 connects. The link module is imported here, lazily, so that
importing `pollux.train` never loads gRPC: a script run outside a cluster does not pay for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from structlog.typing import FilteringBoundLogger

from pollux.train.config import ControlConfig, MeasureConfig
from pollux.train.data import BatchConfigSource
from pollux.train.distributed import Replicas
from pollux.train.env import TrainEnv
from pollux.train.gns import GradStats
from pollux.train.metrics import MetricsReporter, MetricsSink, StepProfile, WorkStatus
from pollux.train.poller import ConfigPoller

if TYPE_CHECKING:
    from pollux.train.agent_link import AgentLink


class ControlPlane:
    """A replica's batch source and metrics sink, their poller and reporter, the agent link.

    Args:
        env: The environment contract (job, generation, agent address).
        replicas: The job's process group; only rank 0 connects, polls and reports.
        control: Whether to connect to the agent, and the poll interval.
        source: The caller's batch source, or None for the agent's.
        sink: The caller's metrics sink, or None for the agent's.
        log: The trainer's logger.
    """

    def __init__(
        self,
        env: TrainEnv,
        replicas: Replicas,
        control: ControlConfig,
        *,
        source: BatchConfigSource | None,
        sink: MetricsSink | None,
        log: FilteringBoundLogger,
    ) -> None:
        self.env = env
        self.rank = replicas.rank
        self.link: AgentLink | None = None
        if control.connect_agent and replicas.leader and (source is None or sink is None):
            self.link = agent_link(env)
        self.source: BatchConfigSource | None = source or self.link
        self.sink: MetricsSink | None = sink or self.link
        self.poller = ConfigPoller(
            self.source,
            rank=replicas.rank,
            num_nodes=replicas.num_nodes,
            num_replicas=replicas.world_size,
            interval_s=control.config_poll_interval_s,
            log=log,
        )
        self.reporter: MetricsReporter | None = None
        """Rank 0's reporter into `sink`, once `start_reporting` started it."""

    def start_reporting(self, profile: StepProfile, measure: MeasureConfig) -> None:
        """Start rank 0's reporter of `profile` into the sink (nothing without one)."""
        if self.sink is None or self.rank != 0 or self.reporter is not None:
            return
        self.reporter = MetricsReporter(
            self.sink,
            job_id=self.env.job_id,
            generation=self.env.allocation_gen,
            rank=self.rank,
            interval_s=measure.report_interval_s,
            profile=profile,
        )
        self.reporter.start()

    def publish(self, stats: GradStats | None, work: WorkStatus) -> None:
        """Hand the reporter what changed with a step (sent with its next report)."""
        if self.reporter is None:
            return
        if stats is not None:
            self.reporter.set_grad_stats(stats)
        self.reporter.set_work(work)

    def publish_user_metrics(self, values: tuple[tuple[str, float], ...]) -> None:
        """Hand the reporter the values the job logged (sent with its next report)."""
        if self.reporter is not None:
            self.reporter.set_user_metrics(values)

    def close(self) -> None:
        """Flush and stop the reporter, then close the agent link (its threads and channels)."""
        if self.reporter is not None:
            self.reporter.close()
        if self.link is not None:
            self.link.close()


def agent_link(env: TrainEnv) -> AgentLink | None:
    """The gRPC link to the job's agents named by ``POLLUX_AGENT_ADDR``, or None without one."""
    if env.agent_addr is None:
        return None
    from pollux.train.agent_link import AgentLink  # noqa: PLC0415 - optional control plane

    addresses = [a.strip() for a in env.agent_addr.split(",") if a.strip()]
    if not addresses:
        return None
    return AgentLink(addresses, env.job_id, credential=env.job_credential, ca_file=env.tls_ca)
