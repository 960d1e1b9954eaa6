"""Who may call the scheduler: the check's users, and tokens that must no longer work.

The admin makes two users (a control). The scheduler refuses no token, a well-formed unknown
one, a known id with a wrong secret, a job credential, a revoked token and an expired one
(UNAUTHENTICATED); a stream open while its token is revoked ends, UNAUTHENTICATED.
"""

from __future__ import annotations

import asyncio
import secrets
import time

import grpc

from pollux.service import auth
from pollux.v1 import admin_service_pb2 as apb
from pollux.v1 import scheduler_service_pb2 as spb

from .session import CALL_TIMEOUT_S, OK, REFUSAL_WAIT_S, Session, code_of, unary_status


async def people(session: Session) -> dict[str, str]:
    """Two users made by the admin (their tokens, by name); the admin works (control)."""
    admin = session.admin(session.target.admin_token)
    users = {}
    for who in ("alice", "bob"):
        user = f"check-{who}-{session.suffix}"
        reply = await session.expect(
            f"(control) admin CreateToken for {user}",
            OK,
            admin.CreateToken(apb.CreateTokenRequest(user=user), timeout=CALL_TIMEOUT_S),
        )
        if reply is None:
            raise RuntimeError("the admin token cannot create users: nothing more to try")
        session.cleanup_tokens.append(reply.token.id)
        users[who] = reply.secret
    return users


async def bad_tokens(session: Session, users: dict[str, str]) -> None:
    """Tokens missing, malformed, unknown, revoked or expired are UNAUTHENTICATED."""
    admin = session.admin(session.target.admin_token)
    request = spb.ListJobsRequest()
    await session.expect(
        "ListJobs with no token",
        "UNAUTHENTICATED",
        session.jobs(None).ListJobs(request, timeout=CALL_TIMEOUT_S),
    )
    unknown = f"{auth.TOKEN_PREFIX}{secrets.token_hex(6)}_{secrets.token_urlsafe(32)}"
    await session.expect(
        "ListJobs with a well-formed unknown token",
        "UNAUTHENTICATED",
        session.jobs(unknown).ListJobs(request, timeout=CALL_TIMEOUT_S),
    )
    parsed = auth.parse_token(users["alice"])
    assert parsed is not None
    guessed = f"{auth.TOKEN_PREFIX}{parsed[0]}_{secrets.token_urlsafe(32)}"
    await session.expect(
        "ListJobs with alice's token id and a wrong secret",
        "UNAUTHENTICATED",
        session.jobs(guessed).ListJobs(request, timeout=CALL_TIMEOUT_S),
    )
    await session.expect(
        "ListJobs with a job credential instead of a token",
        "UNAUTHENTICATED",
        session.jobs(f"{auth.JOB_CREDENTIAL_PREFIX}j-x.{'0' * 64}").ListJobs(
            request, timeout=CALL_TIMEOUT_S
        ),
    )
    short = await admin.CreateToken(
        apb.CreateTokenRequest(user=f"check-carol-{session.suffix}", ttl_s=1),
        timeout=CALL_TIMEOUT_S,
    )
    doomed = await admin.CreateToken(
        apb.CreateTokenRequest(user=f"check-dave-{session.suffix}"), timeout=CALL_TIMEOUT_S
    )
    session.cleanup_tokens += [short.token.id, doomed.token.id]
    await session.expect(
        "(control) ListJobs with a fresh user token",
        OK,
        session.jobs(doomed.secret).ListJobs(request, timeout=CALL_TIMEOUT_S),
    )
    await admin.RevokeToken(
        apb.RevokeTokenRequest(token_id=doomed.token.id), timeout=CALL_TIMEOUT_S
    )
    await _refused_soon(session, "ListJobs with a revoked token", doomed.secret)
    await _refused_soon(session, "ListJobs with an expired token (ttl 1 s)", short.secret)


async def _refused_soon(session: Session, name: str, token: str) -> None:
    """Poll until the token is refused (caches and expiry take a moment), or give up."""
    stub = session.jobs(token)
    deadline = time.monotonic() + REFUSAL_WAIT_S
    while True:
        got, message, _ = await unary_status(
            stub.ListJobs(spb.ListJobsRequest(), timeout=CALL_TIMEOUT_S)
        )
        if got != OK or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    session.record(name, "UNAUTHENTICATED", got, message)


async def revoked_token_streams(session: Session) -> None:
    """A token revoked while its stream is open ends that stream."""
    admin = session.admin(session.target.admin_token)
    made = await admin.CreateToken(
        apb.CreateTokenRequest(user=f"check-erin-{session.suffix}"), timeout=CALL_TIMEOUT_S
    )
    session.cleanup_tokens.append(made.token.id)
    job = await session.submit(made.secret, "check-erin")
    call = session.jobs(made.secret).WatchJobs(
        spb.WatchJobsRequest(job_id=job.id), timeout=REFUSAL_WAIT_S * 4
    )
    await call.read()
    await admin.RevokeToken(apb.RevokeTokenRequest(token_id=made.token.id), timeout=CALL_TIMEOUT_S)
    got, message = "OPEN", f"still streaming {REFUSAL_WAIT_S:.0f} s after the revocation"
    try:
        async with asyncio.timeout(REFUSAL_WAIT_S):
            while await call.read() is not grpc.aio.EOF:
                pass
        got, message = OK, "the stream ended without a status"
    except grpc.aio.AioRpcError as error:
        got, message = code_of(error)
    except TimeoutError:
        call.cancel()
    session.record("a stream open while its token is revoked", "UNAUTHENTICATED", got, message)
