"""No door speaks plaintext, and each takes only the certificates it should.

Plaintext to every scheduler, agent and launcher port (the TLS handshake fails: UNAVAILABLE)
and to etcd through a plaintext `Store`; a launcher dialled over TLS without a client
certificate (refused) and with a *user* certificate of the cluster CA (PERMISSION_DENIED:
launchers serve services only); etcd with no client certificate and with one of a different
CA (refused). Controls: a service certificate reads etcd and is answered by a launcher.
"""

from __future__ import annotations

import aetcd.rpc
import grpc

from pollux.service import pki
from pollux.service.keys import Kind
from pollux.service.store import Store, StoreError, StoreUnavailable
from pollux.service.tls import TlsFiles
from pollux.v1 import agent_service_pb2 as agpb
from pollux.v1 import agent_service_pb2_grpc as agpb_grpc
from pollux.v1 import launcher_service_pb2 as lpb
from pollux.v1 import launcher_service_pb2_grpc as lpb_grpc
from pollux.v1 import scheduler_service_pb2 as spb
from pollux.v1 import scheduler_service_pb2_grpc as spb_grpc

from .session import CALL_TIMEOUT_S, OK, Session, code_of


async def plaintext(session: Session) -> None:
    """No port speaks plaintext: the TLS handshake fails (UNAVAILABLE)."""
    for address in session.target.schedulers:
        stub = spb_grpc.SchedulerServiceStub(session.channel(address, tls=False))
        call = stub.ListJobs(spb.ListJobsRequest(), timeout=CALL_TIMEOUT_S)
        await session.expect(f"plaintext ListJobs to scheduler {address}", "UNAVAILABLE", call)
    for address in session.target.agents:
        agent = agpb_grpc.AgentServiceStub(session.channel(address, tls=False))
        call = agent.GetModel(agpb.GetModelRequest(job_id="j-x"), timeout=CALL_TIMEOUT_S)
        await session.expect(f"plaintext GetModel to agent {address}", "UNAVAILABLE", call)
    for address in session.target.launchers:
        launcher = lpb_grpc.LauncherServiceStub(session.channel(address, tls=False))
        call = launcher.ListReplicas(lpb.ListReplicasRequest(), timeout=CALL_TIMEOUT_S)
        await session.expect(f"plaintext ListReplicas to launcher {address}", "UNAVAILABLE", call)
    got, message = await _etcd_store_read(session, None)
    session.record(
        f"plaintext Store read of etcd {session.target.etcd}", "UNAVAILABLE", got, message
    )


async def launcher_certificates(session: Session) -> None:
    """Launchers take services only: no certificate, a user's, or the operator's (control)."""
    for address in session.target.launchers:
        request = lpb.ListReplicasRequest()
        bare = lpb_grpc.LauncherServiceStub(session.channel(address))
        await session.expect(
            f"TLS without client certificate to launcher {address}",
            "UNAVAILABLE",
            bare.ListReplicas(request, timeout=CALL_TIMEOUT_S),
        )
        user = lpb_grpc.LauncherServiceStub(session.channel(address, cert=session.user_cert))
        await session.expect(
            f"ListReplicas with a user certificate of the cluster CA to launcher {address}",
            "PERMISSION_DENIED",
            user.ListReplicas(request, timeout=CALL_TIMEOUT_S),
        )
        logs = user.StreamLogs(lpb.StreamLogsRequest(job_id="j-x"), timeout=CALL_TIMEOUT_S)
        await session.expect_stream(
            f"StreamLogs with a user certificate to launcher {address}",
            "PERMISSION_DENIED",
            logs,
        )
        service = lpb_grpc.LauncherServiceStub(session.channel(address, cert=session.service))
        await session.expect(
            f"(control) ListReplicas with a service certificate to launcher {address}",
            OK,
            service.ListReplicas(request, timeout=CALL_TIMEOUT_S),
        )


async def _etcd_store_read(session: Session, tls: TlsFiles | None) -> tuple[str, str]:
    """Status of one read through a `Store` (UNAVAILABLE when etcd will not talk)."""
    try:
        store = await Store.connect(
            session.target.etcd, session.target.etcd_root, timeout_s=5.0, tls=tls
        )
    except StoreUnavailable as error:
        return "UNAVAILABLE", str(error)
    try:
        await store.count(store.keys.prefix(Kind.JOBS))
    except StoreUnavailable as error:
        return "UNAVAILABLE", str(error)
    except StoreError as error:
        return "REFUSED", str(error)
    finally:
        await store.close()
    return OK, "read the cluster state"


async def _etcd_raw_read(session: Session, cert: pki.Issued | None) -> tuple[str, str]:
    """Status of an etcd Range over TLS trusting the cluster CA, with `cert` or none."""
    first = session.target.etcd.split(",")[0]
    key_pem = cert.key.read_bytes() if cert is not None else None
    cert_pem = cert.cert.read_bytes() if cert is not None else None
    credentials = grpc.ssl_channel_credentials(session.ca_pem, key_pem, cert_pem)
    async with aetcd.rpc.secure_channel(first, credentials) as channel:
        request = aetcd.rpc.RangeRequest(key=session.target.etcd_root.encode(), count_only=True)
        try:
            await aetcd.rpc.KVStub(channel).Range(request, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            return code_of(error)
    return OK, "read the cluster state"


async def etcd_certificates(session: Session) -> None:
    """Only holders of a certificate of the cluster CA reach etcd."""
    got, message = await _etcd_raw_read(session, None)
    session.record(
        f"TLS without client certificate to etcd {session.target.etcd}", "UNAVAILABLE", got, message
    )
    got, message = await _etcd_raw_read(session, session.rogue)
    session.record(
        f"TLS with a certificate of a different CA to etcd {session.target.etcd}",
        "UNAVAILABLE",
        got,
        message,
    )
    rogue = TlsFiles(session.target.pki_dir / "ca.pem", session.rogue.cert, session.rogue.key)
    got, message = await _etcd_store_read(session, rogue)
    session.record(
        "Store with a certificate of a different CA to etcd", "UNAVAILABLE", got, message
    )
    got, message = await _etcd_store_read(session, session.service_tls())
    session.record("(control) Store with a service certificate of the cluster CA", OK, got, message)
