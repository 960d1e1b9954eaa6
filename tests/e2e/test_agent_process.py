"""``python -m pollux.agent.main`` as a real process against a real etcd.

Checks what only a process shows: the flags and environment are read, the gRPC health service
reports SERVING, the agent registers itself in etcd, and SIGTERM deregisters it and exits 0; a
bad configuration exits 2 naming every problem before anything starts.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pollux.service.store import Store
from pollux.v1 import types_pb2 as pb
from tests.waiting import eventually

pytestmark = pytest.mark.timeout(60)


def start_agent(*args: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "pollux.agent.main", *args],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


async def registered(store: Store, process: subprocess.Popen[bytes]) -> pb.Member:
    async def member() -> pb.Member | None:
        assert process.poll() is None, process.communicate()[1].decode()
        agents, _ = await store.list_agents()
        return agents[0].value if agents else None

    found: pb.Member = await eventually(member, 20, "the agent to register")
    return found


async def test_the_agent_serves_registers_and_stops_cleanly_on_sigterm(etcd, store):
    process = start_agent(
        "--etcd",
        etcd.endpoint,
        "--listen",
        "127.0.0.1:0",
        "--id",
        "e2e-agent",
        env={"POLLUX_AGENT_ETCD__ROOT": store.keys.root, "POLLUX_AGENT_LEASE_TTL_S": "5"},
    )
    try:
        member = await registered(store, process)
        assert member.id == "e2e-agent"
        async with grpc.aio.insecure_channel(member.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in ("", "pollux.v1.AgentService"):
                reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
                assert reply.status == health_pb2.HealthCheckResponse.SERVING

        process.send_signal(signal.SIGTERM)
        stdout, stderr = await asyncio.to_thread(process.communicate, timeout=20)
        assert process.returncode == 0, stderr.decode()
        assert stdout == b""  # logs go to stderr, nothing else is printed
        assert b"agent_deregistered" in stderr
        agents, _ = await store.list_agents()
        assert agents == []  # the lease was revoked, not left to expire
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


async def test_a_bad_configuration_exits_2_naming_every_problem():
    process = start_agent(
        "--etcd",
        "not-an-endpoint",
        env={"POLLUX_AGENT_HYSTERESIS": "2", "POLLUX_AGENT_LEASE_TTL_S": "soon"},
    )
    try:
        _, stderr = await asyncio.to_thread(process.communicate, timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 2
    text = stderr.decode()
    assert "invalid_configuration" in text
    assert "etcd.endpoint" in text
    assert "lease_ttl_s" in text
