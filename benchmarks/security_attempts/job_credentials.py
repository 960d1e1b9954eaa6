"""A job's credential speaks for that job only, and only while the job lives.

At an agent, job A's valid credential on ReportMetrics, GetBatchConfig and GetModel for job B
is PERMISSION_DENIED; a made-up credential, a person's API token or none is UNAUTHENTICATED;
and a FAILED job's credential gets no batch configuration and no report in (it died with its
job). Control: job A's credential reaches its own model.
"""

from __future__ import annotations

import secrets

from pollux.service import auth
from pollux.v1 import agent_service_pb2 as agpb
from pollux.v1 import agent_service_pb2_grpc as agpb_grpc
from pollux.v1 import types_pb2 as pb

from .session import CALL_TIMEOUT_S, OK, Session, unary_status


def report_for(job_id: str) -> agpb.ReportMetricsRequest:
    """A well-formed metrics report of one step for the job (what a replica would send)."""
    return agpb.ReportMetricsRequest(
        job_id=job_id,
        generation=1,
        seq=1,
        observations=[
            pb.StepObservation(
                num_nodes=1,
                num_replicas=1,
                local_batch_size=1,
                accum_steps=1,
                accum_step_time_s=0.1,
                optim_step_time_s=0.1,
                count=1,
            )
        ],
        gradient=pb.GradientStats(sqr=1.0, var=1.0),
    )


async def forged_agent_reports(session: Session, users: dict[str, str]) -> None:
    """A job's credential speaks for that job only, and only ours are credentials."""
    mine = await session.submit(users["alice"], "check-job-a")
    theirs = await session.submit(users["bob"], "check-job-b")
    credential = await session.job_credential(mine.id)
    made_up = f"{auth.JOB_CREDENTIAL_PREFIX}{theirs.id}.{secrets.token_hex(32)}"
    report = report_for(theirs.id)
    batch = agpb.GetBatchConfigRequest(job_id=theirs.id, num_nodes=1, num_replicas=1)
    for address in session.target.agents:
        forged = agpb_grpc.AgentServiceStub(session.channel(address, token=credential))
        where = f"agent {address}"
        await session.expect(
            f"job A's credential on ReportMetrics for job B at {where}",
            "PERMISSION_DENIED",
            forged.ReportMetrics(report, timeout=CALL_TIMEOUT_S),
        )
        await session.expect(
            f"job A's credential on GetBatchConfig for job B at {where}",
            "PERMISSION_DENIED",
            forged.GetBatchConfig(batch, timeout=CALL_TIMEOUT_S),
        )
        await session.expect(
            f"job A's credential on GetModel for job B at {where}",
            "PERMISSION_DENIED",
            forged.GetModel(agpb.GetModelRequest(job_id=theirs.id), timeout=CALL_TIMEOUT_S),
        )
        got, message, _ = await unary_status(
            forged.GetModel(agpb.GetModelRequest(job_id=mine.id), timeout=CALL_TIMEOUT_S)
        )
        # Its own job may have no model yet: anything but an auth refusal is acceptance.
        if got not in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
            message, got = f"{got}: {message}", OK
        session.record(
            f"(control) job A's credential on GetModel for job A at {where}", OK, got, message
        )
        for name, token in (
            ("a made-up job credential", made_up),
            ("a person's API token", users["bob"]),
            ("no credential", None),
        ):
            stub = agpb_grpc.AgentServiceStub(session.channel(address, token=token))
            await session.expect(
                f"{name} on ReportMetrics at {where}",
                "UNAUTHENTICATED",
                stub.ReportMetrics(report, timeout=CALL_TIMEOUT_S),
            )


async def dead_job_credentials(session: Session, users: dict[str, str]) -> None:
    """A FAILED job's credential gets no batch configuration and no report in."""
    job = await session.running(users["alice"], "check-failing", "raise SystemExit(3)")
    failed = await session.until(users["alice"], job.id, {pb.JOB_STATE_FAILED})
    credential = await session.job_credential(job.id)
    report = report_for(job.id)
    batch = agpb.GetBatchConfigRequest(job_id=job.id, num_nodes=1, num_replicas=1)
    state = "FAILED" if failed is not None else "not FAILED in time"
    for address in session.target.agents:
        stub = agpb_grpc.AgentServiceStub(session.channel(address, token=credential))
        await session.expect(
            f"a {state} job's credential on GetBatchConfig at agent {address}",
            "UNAUTHENTICATED",
            stub.GetBatchConfig(batch, timeout=CALL_TIMEOUT_S),
        )
        await session.expect(
            f"a {state} job's credential on ReportMetrics at agent {address}",
            "UNAUTHENTICATED",
            stub.ReportMetrics(report, timeout=CALL_TIMEOUT_S),
        )
