"""The training library's link to its agent: a `MetricsSink` and a `BatchConfigSource` over gRPC.

A replica started by a launcher gets `POLLUX_AGENT_ADDR` (the job's owning agent first, then
the others); rank 0's trainer plugs this link in through `pollux.train.control_plane`, which
imports it lazily so that importing the library loads no gRPC (it lives beside the trainer so
that `pollux.client` needs no torch). Reports go to the first agent that answers and a failure
raises, so the reporter retries later; batch configurations are refreshed in the background,
so `batch_config()` never blocks a step; every answer names the live agents, and the link
follows them. With TLS it checks the agent against `POLLUX_TLS_CA` and sends
`POLLUX_JOB_CREDENTIAL` with every call (docs/architecture.md, "The training library").
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

import grpc
import structlog

from pollux.train.data import BatchConfig
from pollux.train.metrics import MetricsBatch
from pollux.v1 import agent_service_pb2 as apb
from pollux.v1 import agent_service_pb2_grpc as apb_grpc
from pollux.v1 import types_pb2 as pb

log = structlog.get_logger(__name__)

_FINAL = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND)
"""Codes with which the agent refuses a report for good."""


def channel_credentials(
    credential: str | None, ca_file: Path | None
) -> grpc.ChannelCredentials | None:
    """TLS checked against `ca_file`, sending the job credential with every call.

    None (plaintext) on a cluster without TLS.
    """
    if ca_file is None:
        return None
    credentials = grpc.ssl_channel_credentials(Path(ca_file).read_bytes())
    if credential:
        credentials = grpc.composite_channel_credentials(
            credentials, grpc.access_token_call_credentials(credential)
        )
    return credentials


def agent_channel(address: str, environ: Mapping[str, str] | None = None) -> grpc.Channel:
    """A channel to an agent as the environment contract says (TLS CA, job credential).

    For scripts that talk to their agent without `AgentLink`.
    """
    env = os.environ if environ is None else environ
    ca = env.get("POLLUX_TLS_CA")
    credentials = channel_credentials(env.get("POLLUX_JOB_CREDENTIAL"), Path(ca) if ca else None)
    if credentials is None:
        return grpc.insecure_channel(address)
    return grpc.secure_channel(address, credentials)


class AgentLink:
    """Reports metrics to, and reads batch configurations from, the job's agents.

    Args:
        addresses: Agent addresses, preferred first (POLLUX_AGENT_ADDR split on commas).
        job_id: The job.
        timeout_s: Deadline of one RPC.
        refresh_s: Seconds between background batch-configuration refreshes.
        credential: The job credential (POLLUX_JOB_CREDENTIAL); needs `ca_file`.
        ca_file: CA to check agents against (POLLUX_TLS_CA); None: plaintext.
    """

    def __init__(
        self,
        addresses: Sequence[str],
        job_id: str,
        *,
        timeout_s: float = 2.0,
        refresh_s: float = 2.0,
        credential: str | None = None,
        ca_file: Path | None = None,
    ) -> None:
        if not addresses:
            raise ValueError("AgentLink needs at least one agent address")
        if credential and ca_file is None:
            raise ValueError("a job credential is only sent over TLS: set POLLUX_TLS_CA too")
        self.job_id = job_id
        self.timeout_s = timeout_s
        self.addresses = list(addresses)
        self._credentials = channel_credentials(credential, ca_file)
        self._channels = [self._open(a) for a in addresses]
        self._stubs = [apb_grpc.AgentServiceStub(c) for c in self._channels]
        self._preferred = 0
        self._configs: dict[tuple[int, int], BatchConfig] = {}
        self._wanted: set[tuple[int, int]] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._refresh_s = refresh_s
        self._thread = threading.Thread(target=self._refresh_loop, name="agent-link", daemon=True)
        self._thread.start()

    def _open(self, address: str) -> grpc.Channel:
        if self._credentials is None:
            return grpc.insecure_channel(address)
        return grpc.secure_channel(address, self._credentials)

    def _call(self, method: str, request: object) -> object:
        with self._lock:
            stubs, preferred = self._stubs, self._preferred
        last: grpc.RpcError | None = None
        for offset in range(len(stubs)):
            index = (preferred + offset) % len(stubs)
            try:
                reply = getattr(stubs[index], method)(request, timeout=self.timeout_s)
            except grpc.RpcError as error:
                if error.code() not in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                ):
                    raise
                last = error
                continue
            except ValueError:  # the channel was closed by a re-point in flight: next one
                continue
            with self._lock:
                if self._stubs is stubs:
                    self._preferred = index
            self._follow(list(getattr(reply, "agents", ())))
            return reply
        if last is None:  # every channel was closed under us: shutting down or re-pointed
            raise _ClosedError()
        raise last

    def _follow(self, agents: list[str]) -> None:
        """Re-point the link when an agent names other agents for this job (agents moved)."""
        if not agents:
            return
        with self._lock:
            if agents == self.addresses or self._stop.is_set():
                return
            old_channels = self._channels
            self.addresses = agents
            self._channels = [self._open(a) for a in agents]
            self._stubs = [apb_grpc.AgentServiceStub(c) for c in self._channels]
            self._preferred = 0
        log.info("agent_link_repointed", job_id=self.job_id, agents=agents)
        for channel in old_channels:
            channel.close()

    def send(self, batch: MetricsBatch) -> None:
        """Deliver one report (MetricsSink); raises if no agent took it, to be retried.

        A report the agent rejects for good (INVALID_ARGUMENT, or NOT_FOUND: the job is gone)
        is logged and dropped instead: retrying it would only hold up the reports behind it.
        """
        request = apb.ReportMetricsRequest(
            job_id=batch.job_id,
            generation=batch.generation,
            rank=batch.rank,
            seq=batch.seq,
            observations=[
                pb.StepObservation(
                    num_nodes=o.num_nodes,
                    num_replicas=o.num_replicas,
                    local_batch_size=o.local_bsz,
                    accum_steps=o.accum_steps,
                    accum_step_time_s=o.accum_step_time_s,
                    optim_step_time_s=o.optim_step_time_s,
                    count=o.count,
                )
                for o in batch.observations
            ],
        )
        if batch.grad is not None:
            request.gradient.sqr = float(batch.grad.sqr)
            request.gradient.var = float(batch.grad.var)
        request.user_metrics.update(dict(batch.user_metrics))
        if batch.work is not None:
            request.work.progress = batch.work.progress
            if batch.work.remaining is not None:
                request.work.remaining = batch.work.remaining
            if batch.work.rescale_pause_s is not None:
                request.work.rescale_pause_s = batch.work.rescale_pause_s
        try:
            self._call("ReportMetrics", request)
        except grpc.RpcError as error:
            if error.code() not in _FINAL:
                raise
            log.warning(
                "metrics_rejected",
                job_id=self.job_id,
                seq=batch.seq,
                code=error.code().name,
                error=error.details(),
            )

    def batch_config(self, *, num_nodes: int, num_replicas: int) -> BatchConfig | None:
        """The latest configuration for this shape, or None before the agent has one.

        The first call for a shape asks the agent at once (at most one RPC deadline; a replica
        asks when it starts, so a restarted job trains with the agent's batch size from its
        first step rather than with the initial one until a refresh); later calls read the
        cache that the background thread refreshes, and never block.
        """
        key = (num_nodes, num_replicas)
        with self._lock:
            first = key not in self._wanted
            self._wanted.add(key)
        if first:
            self._refresh(key)
        with self._lock:
            return self._configs.get(key)

    def _refresh(self, key: tuple[int, int]) -> None:
        request = apb.GetBatchConfigRequest(
            job_id=self.job_id, num_nodes=key[0], num_replicas=key[1]
        )
        try:
            reply = self._call("GetBatchConfig", request)
        except grpc.RpcError as error:
            log.debug("batch_config_unavailable", job_id=self.job_id, code=error.code().name)
            return
        except ValueError:  # the channel was closed under a refresh in flight: shutting down
            return
        config = reply.config  # type: ignore[attr-defined]
        if config.local_batch_size < 1:
            return
        with self._lock:
            self._configs[key] = BatchConfig(
                local_bsz=int(config.local_batch_size), accum_steps=max(1, int(config.accum_steps))
            )

    def _refresh_loop(self) -> None:
        while not self._stop.wait(self._refresh_s):
            with self._lock:
                wanted = list(self._wanted)
            for key in wanted:
                self._refresh(key)

    def close(self) -> None:
        """Stop the refresh thread, wait for it (at most one RPC deadline), close the channels."""
        self._stop.set()
        self._thread.join(timeout=self.timeout_s + 1.0)
        with self._lock:
            channels = self._channels
        for channel in channels:
            channel.close()


class _ClosedError(grpc.RpcError):  # type: ignore[misc]
    """UNAVAILABLE: every channel of the link was closed while a call was being made."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "agent link closed or re-pointed during the call"
