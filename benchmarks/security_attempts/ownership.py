"""One user against another's jobs: nothing seen, changed or reached, and secrets withheld.

Bob cannot get, cancel, delete, explain, stream the logs of or watch alice's job: each answers
NOT_FOUND as for an id of no job, word for word, so ids and owners cannot be probed; his node
list counts her GPUs without her job's id; admin RPCs are PERMISSION_DENIED; her job is
unchanged afterwards. Secret environment
values show as ``<secret>`` in every response. A job named after another user's (deleted) job
id is refused at submit (INVALID_ARGUMENT), and logs, describe and cancel by that id reach
nothing (NOT_FOUND), never the other's log.
"""

from __future__ import annotations

import secrets

from pollux.service import auth
from pollux.v1 import admin_service_pb2 as apb
from pollux.v1 import launcher_service_pb2 as lpb
from pollux.v1 import scheduler_service_pb2 as spb
from pollux.v1 import types_pb2 as pb

from .session import CALL_TIMEOUT_S, OK, SECRET, Session, unary_status


async def other_users_jobs(session: Session, users: dict[str, str]) -> None:
    """A user may not see, change or stream another user's job, nor administer."""
    victim = await session.submit(users["alice"], "check-victim")
    bob = session.jobs(users["bob"])
    for name, call in (
        ("GetJob", bob.GetJob(spb.GetJobRequest(job_id=victim.id), timeout=CALL_TIMEOUT_S)),
        (
            "CancelJob",
            bob.CancelJob(spb.CancelJobRequest(job_id=victim.id), timeout=CALL_TIMEOUT_S),
        ),
        (
            "DeleteJob",
            bob.DeleteJob(spb.DeleteJobRequest(job_id=victim.id), timeout=CALL_TIMEOUT_S),
        ),
        ("Explain", bob.Explain(spb.ExplainRequest(job_id=victim.id), timeout=CALL_TIMEOUT_S)),
    ):
        await session.expect(f"bob {name} of alice's job", "NOT_FOUND", call)
    await session.expect_stream(
        "bob StreamLogs of alice's job",
        "NOT_FOUND",
        bob.StreamLogs(lpb.StreamLogsRequest(job_id=victim.id), timeout=CALL_TIMEOUT_S),
    )
    await session.expect_stream(
        "bob WatchJobs of alice's job",
        "NOT_FOUND",
        bob.WatchJobs(spb.WatchJobsRequest(job_id=victim.id), timeout=CALL_TIMEOUT_S),
    )
    # Her job's id answers as an id of no job does, word for word: bob cannot probe ids.
    made_up = "j-" + "0" * (len(victim.id) - 2)
    real = await unary_status(bob.GetJob(spb.GetJobRequest(job_id=victim.id)))
    none = await unary_status(bob.GetJob(spb.GetJobRequest(job_id=made_up)))
    alike = real[:2] == (none[0], none[1].replace(made_up, victim.id))
    session.record(
        "the answer bob gets for alice's job id and for an id of no job",
        "ALIKE",
        "ALIKE" if alike else "DIFFERENT",
        f"{real[0]}: {real[1]}" if alike else f"{real[:2]} against {none[:2]}",
    )
    # A job of alice's that holds a GPU: bob's node list counts it without naming it.
    holder = await session.running(users["alice"], "check-holder", "import time; time.sleep(60)")
    await session.until(users["alice"], holder.id, {pb.JOB_STATE_RUNNING})
    for who, token, expected in (
        ("bob", users["bob"], "HIDDEN"),
        ("(control) the admin", None, "SHOWN"),
    ):
        status = await session.jobs(token or session.target.admin_token).ClusterStatus(
            spb.ClusterStatusRequest(), timeout=CALL_TIMEOUT_S
        )
        held = [job for node in status.nodes for job in node.jobs]
        session.record(
            f"{who}'s nodes list names alice's running job",
            expected,
            "SHOWN" if holder.id in held else "HIDDEN",
            f"GPUs held: {held}",
        )
    await session.cancel([holder.id])
    listed = await bob.ListJobs(spb.ListJobsRequest(), timeout=CALL_TIMEOUT_S)
    seen = [j.id for j in listed.jobs if j.id == victim.id]
    session.record(
        "bob ListJobs includes alice's job",
        "HIDDEN",
        "SHOWN" if seen else "HIDDEN",
        "bob's listing has only his own jobs" if not seen else f"bob sees {victim.id}",
    )
    after = await session.jobs(session.target.admin_token).GetJob(
        spb.GetJobRequest(job_id=victim.id), timeout=CALL_TIMEOUT_S
    )
    session.record(
        "alice's job after bob's attempts",
        "UNCHANGED",
        "CHANGED" if after.job.cancel_requested else "UNCHANGED",
        f"cancel_requested={after.job.cancel_requested}; the job still exists",
    )
    user_admin = session.admin(users["bob"])
    for name, call in (
        (
            "CreateToken",
            user_admin.CreateToken(
                apb.CreateTokenRequest(user=f"check-eve-{session.suffix}", role=auth.ADMIN),
                timeout=CALL_TIMEOUT_S,
            ),
        ),
        (
            "PutTenant",
            user_admin.PutTenant(
                apb.PutTenantRequest(tenant=pb.Tenant(name="check-tenant", guarantee_gpus=1)),
                timeout=CALL_TIMEOUT_S,
            ),
        ),
        (
            "RevokeToken",
            user_admin.RevokeToken(
                apb.RevokeTokenRequest(token_id=session.target.admin_token), timeout=CALL_TIMEOUT_S
            ),
        ),
        ("ListAudit", user_admin.ListAudit(apb.ListAuditRequest(), timeout=CALL_TIMEOUT_S)),
        ("ListTokens", user_admin.ListTokens(apb.ListTokensRequest(), timeout=CALL_TIMEOUT_S)),
    ):
        await session.expect(f"user bob calls admin {name}", "PERMISSION_DENIED", call)


async def secret_values(session: Session, users: dict[str, str]) -> None:
    """Secret environment values are stored for launchers, never returned to anyone."""
    value = f"s3cret-{secrets.token_hex(8)}"
    alice = session.jobs(users["alice"])
    reply = await alice.SubmitJob(
        spb.SubmitJobRequest(
            spec=pb.JobSpec(
                name="check-secret",
                command=["python", "-c", "pass"],
                batch=pb.BatchLimits(initial_batch_size=1),
                secret_env={"CHECK_SECRET": value},
            ),
            request_id=f"check-{secrets.token_hex(8)}",
        ),
        timeout=CALL_TIMEOUT_S,
    )
    job_id = reply.job.id
    session.cleanup_jobs.append(job_id)
    shown: list[tuple[str, pb.Job | None]] = [("SubmitJob", reply.job)]
    for who, token in (("alice", users["alice"]), ("admin", session.target.admin_token)):
        stub = session.jobs(token)
        got = await stub.GetJob(spb.GetJobRequest(job_id=job_id), timeout=CALL_TIMEOUT_S)
        shown.append((f"{who} GetJob", got.job))
        listed = await stub.ListJobs(spb.ListJobsRequest(), timeout=CALL_TIMEOUT_S)
        shown.append((f"{who} ListJobs", next((j for j in listed.jobs if j.id == job_id), None)))
    watch = session.jobs(users["alice"]).WatchJobs(
        spb.WatchJobsRequest(job_id=job_id), timeout=CALL_TIMEOUT_S
    )
    async for event in watch:
        shown.append(("alice WatchJobs", event.job))
        watch.cancel()
        break
    for where, job in shown:
        values = dict(job.spec.secret_env) if job is not None else {}
        leaked = value in str(job)
        session.record(
            f"secret_env value in the {where} response",
            "WITHHELD",
            "LEAKED" if leaked or values != {"CHECK_SECRET": SECRET} else "WITHHELD",
            f"secret_env shows {values}",
        )


async def jobs_named_after_ids(session: Session, users: dict[str, str]) -> None:
    """A job named after another user's job id reaches neither that job nor its log."""
    secret = f"check-log-{secrets.token_hex(6)}"
    victim = await session.running(users["alice"], "check-diary", f"print({secret!r})")
    done = await session.until(users["alice"], victim.id, {pb.JOB_STATE_SUCCEEDED})
    got, text = await session.log_text(users["alice"], "check-diary")
    session.record(
        "(control) alice reads her finished job's log by its name",
        OK,
        got if got != OK or secret in text else "WRONG LOG",
        text[:100] if done is not None else "the job did not finish in time",
    )
    await session.jobs(users["alice"]).DeleteJob(
        spb.DeleteJobRequest(job_id=victim.id), timeout=CALL_TIMEOUT_S
    )
    bob = session.jobs(users["bob"])
    for name in (victim.id[:8], victim.id):
        # It runs a while: a cluster that accepts it would relay its node's log.
        spec = pb.JobSpec(
            name=name,
            command=["python", "-c", "import time; time.sleep(60)"],
            batch=pb.BatchLimits(initial_batch_size=1),
        )
        request = spb.SubmitJobRequest(spec=spec, request_id=f"check-{secrets.token_hex(8)}")
        reply = await session.expect(
            f"bob submits a job named {'after' if name == victim.id else 'a prefix of'} "
            "alice's job id",
            "INVALID_ARGUMENT",
            bob.SubmitJob(request, timeout=CALL_TIMEOUT_S),
        )
        if reply is not None:
            session.cleanup_jobs.append(reply.job.id)
            if name == victim.id:
                await session.until(users["bob"], reply.job.id, {pb.JOB_STATE_RUNNING})
    got, text = await session.log_text(users["bob"], victim.id)
    session.record(
        "bob reads logs by alice's (deleted) job id",
        "NOT_FOUND",
        "LEAKED" if secret in text else got,
        text[:100] if got == OK else text,
    )
    await session.expect(
        "bob describes by alice's (deleted) job id",
        "NOT_FOUND",
        bob.GetJob(spb.GetJobRequest(job_id=victim.id), timeout=CALL_TIMEOUT_S),
    )
    await session.expect(
        "bob cancels by alice's (deleted) job id",
        "NOT_FOUND",
        bob.CancelJob(spb.CancelJobRequest(job_id=victim.id), timeout=CALL_TIMEOUT_S),
    )
