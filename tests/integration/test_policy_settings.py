"""Every supported policy setting, live: a scheduler configured with it places a job.

The settings are those docs/configuration.md ("Scheduling policy") documents: each policy,
each restart rule of pollux-jct, each tenant-share method (with a tenant), both kinds of event
round and profile seeding. Ablations are benchmarks' alone (benchmarks/beyond_pollux.py).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from pollux.policy.registry import JCT_RESTARTS, POLICY_NAMES, TENANT_SHARES
from pollux.policy.tenant_shares import Ledger
from pollux.service.store import Store
from pollux.v1 import scheduler_service_pb2 as spb
from pollux.v1 import types_pb2 as pb
from tests.etcd_server import EtcdServer
from tests.integration.test_scheduler import Replica, add_node, config, spec
from tests.waiting import eventually

SETTINGS: list[tuple[str, dict[str, Any], bool]] = [
    *((f"policy={name}", {"policy": name}, False) for name in POLICY_NAMES),
    *((f"jct_restart={rule}", {"jct_restart": rule}, False) for rule in JCT_RESTARTS),
    *(
        (f"{name} tenant_shares={shares}", {"policy": name, "tenant_shares": shares}, True)
        for name in ("pollux-jct", "pollux")
        for shares in TENANT_SHARES
    ),
    ("event_rounds=full", {"event_rounds": "full"}, False),
    ("seed_profiles=true", {"seed_profiles": True}, False),
]
"""(id, scheduling settings, with a tenant) of every supported setting."""


@pytest.mark.parametrize(
    ("settings", "tenant"),
    [pytest.param(s, t, id=name) for name, s, t in SETTINGS],
)
async def test_a_scheduler_with_the_setting_runs_rounds_that_place_a_job(
    etcd: EtcdServer, root: str, store: Store, settings: dict[str, Any], tenant: bool
) -> None:
    if tenant:
        await store.put(store.keys.tenant("team"), pb.Tenant(name="team", guarantee_gpus=1))
    cfg = config(etcd, root, "s-setting")
    cfg = replace(cfg, scheduling=replace(cfg.scheduling, **settings))
    assert cfg.scheduling.problems() == []
    r = await Replica(store, cfg).start()
    try:
        policy = r.scheduler.policy
        await add_node(store, "n1", 4)
        # Tiresias runs a job at its own size: ask for one GPU.
        request = spb.SubmitJobRequest(spec=spec(replicas=1), request_id="setting")
        job_id = (await r.stub.SubmitJob(request)).job.id

        async def placed() -> bool:
            got = (await r.stub.GetJob(spb.GetJobRequest(job_id=job_id))).job
            return len(got.allocation.nodes) >= 1

        await eventually(placed, timeout=10.0)

        async def recorded() -> list[Any]:
            # The round's decision record is written after the job it placed: wait for it.
            return list(await store.latest_decisions(100))

        decisions = await eventually(recorded, timeout=10.0)
        assert decisions
        assert {d.policy for d in decisions} == {policy.name}
        assert policy.name == cfg.scheduling.policy
        explain = await r.stub.Explain(spb.ExplainRequest(job_id=job_id))
        assert explain.objective == policy.objective_text
        if tenant and settings["tenant_shares"] in ("isolation", "deficits"):
            assert isinstance(r.scheduler._memory, Ledger), "the shares owed are carried"
        elif tenant:
            assert r.scheduler._memory is None, "the method keeps no memory"
    finally:
        await r.stop()
