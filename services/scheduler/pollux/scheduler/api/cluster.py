"""ClusterStatus, Explain, EstimateJob: the cluster and a job's place in it, from live state.

Each reads the replica's mirror when it has listed everything (the active state only, so it
does not slow down as finished jobs accumulate), else etcd. Explain and EstimateJob build the
policy's state as its rounds do and run the replica's policy (or forecaster) on it.
"""

from __future__ import annotations

import asyncio

from pollux.scheduler.access import check_person, owner_filter, redacted
from pollux.scheduler.api.base import Context, ServicerBase
from pollux.scheduler.cycle import cluster_state
from pollux.scheduler.estimate import estimate, reference_work
from pollux.scheduler.explain import counterfactual
from pollux.scheduler.leader import current_leader
from pollux.scheduler.lifecycle import ACTIVE, state_name
from pollux.scheduler.validation import normalised, validate_submit
from pollux.service import auth
from pollux.service.errors import FailedPrecondition
from pollux.service.store import Snapshot
from pollux.terminal import quoted
from pollux.v1 import scheduler_service_pb2 as spb
from pollux.v1 import types_pb2 as pb

_GPU_CHANGES = (pb.JOB_STATE_ALLOCATED, pb.JOB_STATE_RESCALING)


class ClusterViews(ServicerBase):
    """The RPCs about the cluster and a job's part in its decisions."""

    async def Explain(self, request: spb.ExplainRequest, context: Context) -> spb.ExplainResponse:
        """The job, its part of the latest decision that included it, its model."""
        job, _ = await self._job(request.job_id, "Explain", context)
        response = spb.ExplainResponse(job=redacted(job))
        decisions = await self.store.latest_decisions(50)
        for decision in decisions:
            mine = next((d for d in decision.jobs if d.job_id == job.id), None)
            if mine is not None:
                response.decision.CopyFrom(mine)
                response.round.CopyFrom(decision)
                response.round.ClearField("jobs")
                break
        _allocation_decision(job, decisions, response)
        if not response.HasField("decision") and job.state == pb.JOB_STATE_PENDING:
            response.decision.job_id = job.id
            response.decision.reason = "pending: waiting for GPUs behind other jobs"
        model = await self.store.get_model(job.id)
        if model is not None:
            response.model.CopyFrom(model.value)
        profile = await self.store.get_profile(job.id)
        if profile is not None and job.allocation.nodes:
            shape = f"{len(set(job.allocation.nodes))}/{len(job.allocation.nodes)}"
            if shape in profile.value.last_configs:
                response.batch.CopyFrom(profile.value.last_configs[shape])
        change = last_change(job)
        if change is not None:
            response.last_change.CopyFrom(change)
        response.objective = self.policy.objective_text
        if job.state in ACTIVE:
            await self._counterfactual(job.id, response)
        return response

    async def EstimateJob(
        self, request: spb.EstimateJobRequest, context: Context
    ) -> spb.EstimateJobResponse:
        """Forecast a job as if submitted now, borrowing an earlier run's model and size."""
        caller = auth.current()
        check_person(caller, "EstimateJob")
        validate_submit(request.spec, "estimate", request.HasField("spec"))
        spec = normalised(request.spec)
        found = await self._newest(
            spec.name, owner_filter(caller), lambda model: reference_work(model) is not None
        )
        if found is None:
            raise FailedPrecondition(
                f"no earlier job named {quoted(spec.name)} of yours has reported a throughput "
                "model and a declared size: run it once (the estimate uses its measured goodput "
                "and size; the training library declares the size with trainer.epochs(N))"
            )
        reference_id, model = found
        snapshot = await self._snapshot()
        now = self.clock()
        forecaster = self.forecaster
        policy = forecaster.policy if forecaster is not None else self.policy
        # The state's jobs explore as the forecasting policy lets them, the new one too.
        state = await asyncio.to_thread(
            cluster_state, snapshot, _active(snapshot), now=now, policy=policy
        )
        if not state.nodes:
            raise FailedPrecondition("the cluster has no nodes yet: nothing could run the job")
        result = await asyncio.to_thread(
            estimate,
            state,
            policy,
            spec,
            model,
            round_s=forecaster.round_s if forecaster is not None else 300.0,
            restart_delay_s=forecaster.restart_delay_s if forecaster is not None else 30.0,
            live_round_s=forecaster.live_round_s if forecaster is not None else None,
        )
        if result is None:
            raise FailedPrecondition(
                f"the forecast did not finish {quoted(spec.name)} within its horizon: the "
                "cluster is too busy to say"
            )
        response = spb.EstimateJobResponse(
            predicted_jct_s=result.completion - now,
            reference_job_id=reference_id,
            work=result.work,
            rounds=result.rounds,
        )
        response.predicted_completion.FromNanoseconds(int(result.completion * 1e9))
        return response

    async def _snapshot(self) -> Snapshot:
        """The active state: the mirror's when it has listed everything, else etcd's."""
        mirror = self.mirror
        if mirror is not None and mirror.ready:
            return mirror.snapshot()
        return await self.store.snapshot()

    async def _counterfactual(self, job_id: str, response: spb.ExplainResponse) -> None:
        """Fill Explain's counterfactuals from the live state (the mirror's, else etcd's)."""
        snapshot = await self._snapshot()
        active = _active(snapshot)
        state = await asyncio.to_thread(
            cluster_state, snapshot, active, now=self.clock(), policy=self.policy
        )
        try:
            found = await asyncio.to_thread(
                counterfactual, state, job_id, self.policy.explain_params
            )
        except KeyError:
            return  # finished between the read of the job and the snapshot
        for a in found.alternatives:
            response.alternatives.add(
                gpus=a.gpus, nodes=a.nodes, speedup=a.speedup, goodput=a.goodput
            )
        owner = owner_filter(auth.current())
        for h in found.holders:
            held = snapshot.jobs.get(h.job_id)
            visible = held is not None and owner in (None, held.value.owner)
            response.holders.add(
                job_id=h.job_id,
                gpus=h.gpus,
                speedup=h.speedup,
                speedup_without_one=h.speedup_without_one,
                name=held.value.spec.name if held is not None and visible else "",
            )
        if found.batch is not None:
            b = found.batch
            response.batch_choice.CopyFrom(
                spb.ExplainBatch(
                    batch_size=b.batch_size,
                    local_batch_size=b.local_batch_size,
                    accum_steps=b.accum_steps,
                    throughput=b.throughput,
                    efficiency=b.efficiency,
                    goodput=b.goodput,
                )
            )
        response.queue_position = found.queue_position
        response.pending_jobs = found.pending_jobs

    async def ClusterStatus(
        self, request: spb.ClusterStatusRequest, context: Context
    ) -> spb.ClusterStatusResponse:
        """Nodes with their jobs, agents, leader, totals."""
        # The replica's mirror when it has one (pollux.service.mirror: the active state, so
        # this does not slow down as finished jobs accumulate), else etcd in full.
        mirror = self.mirror
        if mirror is not None and mirror.ready:
            snapshot = mirror.snapshot()
            states = mirror.state_counts()
        else:
            snapshot = await self.store.snapshot()
            states = {}
            for entry in snapshot.jobs.values():
                states[entry.value.state] = states.get(entry.value.state, 0) + 1
        caller = auth.current()
        by_node: dict[str, list[str]] = {}
        for entry in snapshot.jobs.values():
            job = entry.value
            if job.state in ACTIVE:
                # Another user's job holds the GPU: counted, but not named by its id.
                shown = job.id if auth.may_act_on_job(caller, job.owner) else ""
                for held in job.allocation.nodes:
                    by_node.setdefault(held, []).append(shown)
        counts = {state_name(state): n for state, n in states.items()}
        response = spb.ClusterStatusResponse(
            agents=snapshot.agents,
            answered_by=self.replica_id,
            last_round=self.last_round(),
            warnings=self.warnings(),
            dashboard_url=self.dashboard_url,
        )
        for node_name in sorted(snapshot.nodes):
            node = snapshot.nodes[node_name]
            jobs = by_node.get(node_name, [])
            response.nodes.add(node=node, allocated_gpus=len(jobs), jobs=jobs)
            response.total_gpus += node.gpus
            response.allocated_gpus += len(jobs)
        for name, count in counts.items():
            response.jobs_by_state[name] = count
        leader = await current_leader(self.store)
        if leader is not None:
            response.leader_id = leader.id
            response.leader_address = leader.address
        decisions = await self.store.latest_decisions(1)
        if decisions:
            response.last_round = max(response.last_round, decisions[0].round)
        return response


def _allocation_decision(
    job: pb.Job, decisions: list[pb.Decision], response: spb.ExplainResponse
) -> None:
    """Fill `allocation_decision`: the job's part of the round that chose its allocation.

    The newest record in which the job's allocation changed to the one it holds (records are
    newest first), unless that is `response.decision` itself: Explain then shows what the
    policy predicted of the allocation when it chose it beside what it predicts now.
    """
    held = sorted(job.allocation.nodes)
    if not held:
        return
    for decision in decisions:
        mine = next((d for d in decision.jobs if d.job_id == job.id), None)
        if mine is None or not mine.changed:
            continue
        if sorted(mine.nodes) != held or decision.round == response.round.round:
            return  # chose another allocation since, or is the decision shown already
        response.allocation_decision.CopyFrom(mine)
        response.allocation_round.CopyFrom(decision)
        response.allocation_round.ClearField("jobs")
        return


def last_change(job: pb.Job) -> pb.StateTransition | None:
    """The newest transition that changed the job's GPUs; None while it never held any.

    Allocated, rescaled, or suspended (back to PENDING after the submission).
    """
    history = list(job.history)
    for index in range(len(history) - 1, -1, -1):
        entry = history[index]
        if entry.state in _GPU_CHANGES or (entry.state == pb.JOB_STATE_PENDING and index > 0):
            return entry
    return None


def _active(snapshot: Snapshot) -> list[pb.Job]:
    """The snapshot's active jobs in submission order (the policy's order)."""
    return sorted(
        (e.value for e in snapshot.jobs.values() if e.value.state in ACTIVE),
        key=lambda j: (j.create_time.ToNanoseconds(), j.id),
    )
