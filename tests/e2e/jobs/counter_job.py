"""A small real job for end-to-end tests: counts steps, checkpoints on SIGTERM, resumes.

Each step sleeps STEP_S seconds. Rank 0 owns the checkpoint (the step reached), written to a
temporary file and renamed. On SIGTERM it saves and exits 143 (a planned stop); at TOTAL steps
it exits 0. Rank 0 reports synthetic step times (faster with more replicas) and gradient
statistics to its agent over gRPC, so the agent fits a model and the scheduler scales the job.
Every rank appends "<generation> <rank> <world> <start-step>" to starts.log in the
checkpoint directory, so a test can see each restart and what it resumed from.

Rank 0's reports carry a made-up "loss" (100 / (100 + step)) as a value the job logged.
With COUNTER_WORK=1, rank 0 also declares its work as `pollux.train` does (WorkStatus:
progress and remaining, in M0-steps): each step makes the progress AdaScale's gain credits a
batch of 32 x replicas with the reported gradient statistics; the progress is checkpointed with
the step, so the job's timeline shows its actual progress beside the model's prediction.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

TOTAL = int(os.environ.get("COUNTER_TOTAL", "40"))
STEP_S = float(os.environ.get("COUNTER_STEP_S", "0.1"))
WORK = os.environ.get("COUNTER_WORK") == "1"
SQR, VAR = 1.0, 50.0
"""The gradient statistics every report carries (noise scale VAR / SQR)."""


def gain(world: int) -> float:
    """M0-steps of progress of one step of 32 x `world` samples (M0 = 32): AdaScale's r(S)."""
    return (VAR + SQR) / (VAR / world + SQR)


def report(
    seq: int, world: int, nodes: int, work: tuple[float, float] | None = None, loss: float = 1.0
) -> None:
    """Send one ReportMetrics to the job's agent; failures are ignored (training goes on)."""
    import grpc

    from pollux.train.agent_link import agent_channel
    from pollux.v1 import agent_service_pb2 as apb
    from pollux.v1 import agent_service_pb2_grpc as apb_grpc
    from pollux.v1 import types_pb2 as pb

    address = os.environ.get("POLLUX_AGENT_ADDR", "").split(",")[0]
    if not address:
        return
    # A job that scales well: compute 0.2 s per 32 samples, sync grows slowly with replicas.
    optim = 0.2 + 0.01 * (world - 1)
    request = apb.ReportMetricsRequest(
        job_id=os.environ["POLLUX_JOB_ID"],
        generation=int(os.environ["POLLUX_ALLOCATION_GEN"]),
        rank=0,
        seq=seq,
        observations=[
            pb.StepObservation(
                num_nodes=nodes,
                num_replicas=world,
                local_batch_size=32,
                accum_steps=1,
                accum_step_time_s=0.19,
                optim_step_time_s=optim,
                count=10,
            )
        ],
        gradient=pb.GradientStats(sqr=SQR, var=VAR),
    )
    if work is not None:
        request.work.progress, request.work.remaining = work
    request.user_metrics["loss"] = loss  # what trainer.log(loss=...) sends
    try:
        with agent_channel(address) as channel:  # TLS and the job credential when secure
            apb_grpc.AgentServiceStub(channel).ReportMetrics(request, timeout=2)
    except grpc.RpcError as error:
        print(f"report failed: {error.code().name}", flush=True)


def main() -> int:
    ckpt_dir = Path(os.environ["POLLUX_CHECKPOINT_DIR"])
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    generation = os.environ["POLLUX_ALLOCATION_GEN"]
    ckpt = ckpt_dir / "step"
    step = int(ckpt.read_text()) if ckpt.exists() else 0
    progress_file = ckpt_dir / "progress"
    progress = float(progress_file.read_text()) if WORK and progress_file.exists() else 0.0

    def save() -> None:
        if WORK:
            tmp = progress_file.with_suffix(".tmp")
            tmp.write_text(repr(progress))
            os.replace(tmp, progress_file)
        tmp = ckpt.with_suffix(".tmp")
        tmp.write_text(str(step))
        os.replace(tmp, ckpt)

    with (ckpt_dir / "starts.log").open("a") as log:
        log.write(f"{generation} {rank} {world} {step}\n")
    stop = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    while step < TOTAL:
        if stop:
            if rank == 0:
                save()
            print(f"rank {rank}: checkpointed at step {step}", flush=True)
            return 143
        time.sleep(STEP_S)
        step += 1
        progress += gain(world)
        if step % 10 == 0:
            print(f"rank {rank}/{world} gen {generation}: step {step}", flush=True)
            if rank == 0:
                nodes = int(os.environ.get("POLLUX_NUM_NODES", "1"))
                work = (progress, (TOTAL - step) * gain(world)) if WORK else None
                report(step // 10, world, nodes, work, loss=100.0 / (100.0 + step))
    if rank == 0:
        save()
    print(f"rank {rank}: done at step {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
