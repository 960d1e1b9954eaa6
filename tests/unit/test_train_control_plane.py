"""Where a trainer's batch sizes come from and its measurements go, without an agent."""

import pytest

torch = pytest.importorskip("torch")

import structlog  # noqa: E402

from pollux.train import (  # noqa: E402
    BatchConfig,
    ControlConfig,
    FixedBatchConfig,
    GradStats,
    InMemorySink,
    MeasureConfig,
    StepProfile,
    TrainEnv,
    WorkStatus,
)
from pollux.train.control_plane import ControlPlane, agent_link  # noqa: E402
from pollux.train.distributed import Replicas  # noqa: E402

LOG = structlog.get_logger("test")
CPU = torch.device("cpu")


def plane(rank=0, *, env=None, **kwargs):
    replicas = Replicas(rank, 2, 1, CPU, CPU)
    control = ControlConfig(connect_agent=kwargs.pop("connect_agent", True))
    return ControlPlane(env or TrainEnv(), replicas, control, log=LOG, **kwargs)


def test_given_source_and_sink_are_used_and_rank_0_reports_what_each_step_publishes():
    source, sink = FixedBatchConfig(BatchConfig(4)), InMemorySink()
    leader = plane(source=source, sink=sink)
    assert leader.link is None
    assert leader.poller.proposal() == BatchConfig(4)
    leader.start_reporting(StepProfile(), MeasureConfig(report_interval_s=60))
    assert leader.reporter is not None
    leader.publish(GradStats(1.0, 2.0), WorkStatus(3.0, 4.0))
    leader.close()  # flushes
    assert sink.batches[-1].grad == GradStats(1.0, 2.0)
    assert sink.batches[-1].work == WorkStatus(3.0, 4.0)


def test_other_ranks_neither_poll_nor_report():
    follower = plane(1, source=FixedBatchConfig(BatchConfig(4)), sink=InMemorySink())
    follower.start_reporting(StepProfile(), MeasureConfig())
    assert follower.reporter is None
    assert follower.poller.proposal() is None
    follower.publish(None, WorkStatus(0.0))  # nothing to hand it to
    follower.close()


def test_without_an_agent_address_or_when_told_not_to_there_is_no_link():
    assert plane(source=None, sink=None).link is None
    assert agent_link(TrainEnv(agent_addr=" , ")) is None
    env = TrainEnv(agent_addr="127.0.0.1:9")  # nothing listens; the link never blocks
    refused = plane(env=env, source=None, sink=None, connect_agent=False)
    assert (refused.link, refused.source, refused.sink) == (None, None, None)
    linked = plane(env=env, source=None, sink=None)
    assert linked.link is not None
    assert linked.source is linked.link
    assert linked.sink is linked.link
    linked.close()
