"""The fault suite's job: visible ticks, a verifiable checkpoint, metrics for its agent; no torch.

Started by a launcher like any replica (it reads the environment contract). Every `TICK_S` it
appends ``<generation> <rank> <step> <time_ns> <pid>`` to ``<POLLUX_CHECKPOINT_DIR>/ticks`` in
one `write` on an O_APPEND descriptor, so the suite sees whether two generations ever ran at
once. Rank 0 checkpoints its step every `CHECKPOINT_EVERY` steps and on SIGTERM to
``state.json`` (temporary name, then rename; the payload carries its sha256), only while
``.pollux-generation`` names no newer generation, as `pollux.train` does; a checkpoint whose
digest does not match makes it write ``CORRUPT`` and exit 3. Every 2 s it reports step
observations to its agent (following the agent list each answer carries), so the scheduler
rescales the job, and records each report taken as ``<time_ns> <agent>`` in ``reports``.

    python chaos_job.py STEPS
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
from pathlib import Path

import grpc

from pollux.train.agent_link import agent_channel
from pollux.v1 import agent_service_pb2 as apb
from pollux.v1 import agent_service_pb2_grpc as apb_grpc
from pollux.v1 import types_pb2 as pb

TICK_S = 0.2
CHECKPOINT_EVERY = 10
REPORT_S = 2.0
CORRUPT_EXIT = 3


class Job:
    """One replica's state."""

    def __init__(self, total: int) -> None:
        env = os.environ
        self.total = total
        self.directory = Path(env["POLLUX_CHECKPOINT_DIR"])
        self.generation = int(env["POLLUX_ALLOCATION_GEN"])
        self.rank = int(env["RANK"])
        self.world = int(env["WORLD_SIZE"])
        self.nodes = int(env.get("POLLUX_NUM_NODES", "1"))
        self.job_id = env["POLLUX_JOB_ID"]
        self.agents = [a for a in env.get("POLLUX_AGENT_ADDR", "").split(",") if a]
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
        self.ticks = os.open(self.directory / "ticks", flags)
        self.reports = os.open(self.directory / "reports", flags)
        self.step = self.restore()
        self.seq = 0
        self.reported_at = time.monotonic()

    def restore(self) -> int:
        """The step of the last checkpoint (0: none); a bad digest is a corrupted one."""
        path = self.directory / "state.json"
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            return 0
        except (OSError, ValueError) as error:
            self.corrupt(f"unreadable: {error}")
        payload = json.dumps(raw.get("state"), sort_keys=True)
        if hashlib.sha256(payload.encode()).hexdigest() != raw.get("sha256"):
            self.corrupt("digest mismatch")
        return int(raw["state"]["step"])

    def corrupt(self, why: str) -> None:
        """Leave the evidence for the fault suite and exit."""
        (self.directory / "CORRUPT").write_text(f"{self.job_id} gen {self.generation}: {why}\n")
        sys.exit(CORRUPT_EXIT)

    def checkpoint(self) -> None:
        """Rank 0 saves its step (write, then rename), unless a newer generation owns the dir."""
        if self.rank != 0:
            return
        try:
            fence = int((self.directory / ".pollux-generation").read_text())
        except (OSError, ValueError):
            fence = -1
        if fence > self.generation:  # a newer generation owns the directory
            return
        state = {"step": self.step, "generation": self.generation}
        payload = json.dumps(state, sort_keys=True)
        record = {"state": state, "sha256": hashlib.sha256(payload.encode()).hexdigest()}
        tmp = self.directory / f"state.json.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(record))
        os.replace(tmp, self.directory / "state.json")
        # A line of output per checkpoint: the fault suite sees the replica logs grow.
        print(f"generation {self.generation} checkpointed step {self.step}", flush=True)

    def tick(self) -> None:
        """One step: a tick line, a checkpoint every CHECKPOINT_EVERY, a report every REPORT_S."""
        self.step += 1
        line = f"{self.generation} {self.rank} {self.step} {time.time_ns()} {os.getpid()}\n"
        os.write(self.ticks, line.encode())
        if self.step % CHECKPOINT_EVERY == 0:
            self.checkpoint()
        if time.monotonic() - self.reported_at >= REPORT_S:
            self.reported_at = time.monotonic()
            self.report()

    def report(self) -> None:
        """One metrics report to the first agent that answers (best effort, as in training)."""
        self.seq += 1
        step_time = 0.05 + 0.01 * self.world  # a throughput curve that favours scaling out
        observation = pb.StepObservation(
            num_nodes=self.nodes,
            num_replicas=self.world,
            local_batch_size=64,
            accum_steps=1,
            accum_step_time_s=step_time,
            optim_step_time_s=step_time,
            count=10,
        )
        request = apb.ReportMetricsRequest(
            job_id=self.job_id,
            generation=self.generation,
            rank=self.rank,
            seq=self.seq,
            observations=[observation],
            gradient=pb.GradientStats(sqr=1.0, var=4.0),
        )
        for address in list(self.agents):
            with agent_channel(address) as channel:
                try:
                    reply = apb_grpc.AgentServiceStub(channel).ReportMetrics(request, timeout=1.0)
                except grpc.RpcError:
                    continue
            if reply.agents:
                self.agents = list(reply.agents)
            os.write(self.reports, f"{time.time_ns()} {address}\n".encode())
            return


def main(argv: list[str]) -> int:
    job = Job(int(argv[1]) if len(argv) > 1 else 300)

    def on_term(signum: int, frame: object) -> None:
        job.checkpoint()
        os._exit(143)

    signal.signal(signal.SIGTERM, on_term)
    while job.step < job.total:
        job.tick()
        time.sleep(TICK_S)
    job.checkpoint()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
