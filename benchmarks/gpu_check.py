"""One prepared check of Pollux on this machine's GPUs: a real local cluster, five verdicts.

Starts `LocalCluster` (etcd, a scheduler, an agent, one launcher that detects the GPUs with
nvidia-smi) and prints PASS/FAIL/SKIP with figures for: (1) the GPUs the launcher registered;
(2) each replica's CUDA_VISIBLE_DEVICES and CUDA device; (3) an NCCL all-reduce over a job's
replicas; (4) examples/elastic_classifier.py on CUDA re-allocated from its checkpoint (1 → 2 →
1 GPUs, or with one GPU a restart of its node's launcher) and its rescale pause; (5) the
step-time overhead of `pollux.train` over plain DDP on a 25M-parameter MLP
(benchmarks/train_overhead.py). Without CUDA the same checks run on CPU slots with gloo and a
small model, and what needs a GPU says "SKIP: no CUDA". Writes a JSON summary to --out and
exits 1 if a check failed. On the lent GPU machine run scripts/gpu_check_device.sh.

    python benchmarks/gpu_check.py --out gpu_check.json [--cpu-slots 2] [--logs DIR] [--cpu]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

from pollux.client import Client, ClusterStatus, Job, JobSpec
from pollux.launcher.gpus import CPU_SLOT, GpuDetectionError, detect
from pollux.service.local.job_reach import job_python
from pollux.service.local_cluster import LocalCluster

try:
    from benchmarks import train_overhead as overhead
except ImportError:  # run as a script (python benchmarks/gpu_check.py): this folder is on the path
    import train_overhead as overhead  # type: ignore[import-not-found, no-redef]

ROOT = Path(__file__).resolve().parents[1]
JOB = Path(__file__).resolve().parent / "gpu_check_job.py"
PROBE_TAG, EXAMPLE_TAG, MEMORY_TAG = "GPUCHECK_PROBE", "GPUCHECK_EXAMPLE", "GPUCHECK_MEMORY"
NAMES = {1: "gpu-detection", 2: "device-mapping", 3: "all-reduce", 4: "elastic-job", 5: "overhead"}
T = TypeVar("T")


# ---- results and their formatting (pure) -------------------------------------------------------


@dataclass
class Result:
    """One check's verdict: PASS, FAIL or SKIP, a line of figures, and the figures."""

    number: int
    status: str
    summary: str
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The check's short name."""
        return NAMES.get(self.number, f"check-{self.number}")


def format_result(result: Result) -> str:
    """The verdict line: ``PASS  3 all-reduce: ...``."""
    return f"{result.status:<4}  {result.number} {result.name}: {result.summary}"


def summary(results: Sequence[Result], **extra: Any) -> dict[str, Any]:
    """The JSON summary: ok (no FAIL), counts, and every check with its figures."""
    counts = {s: sum(r.status == s for r in results) for s in ("PASS", "FAIL", "SKIP")}
    checks = [{"name": r.name, **asdict(r)} for r in results]
    return {"ok": counts["FAIL"] == 0, "counts": counts, **extra, "checks": checks}


def parse_records(lines: Iterable[str], tag: str) -> list[dict[str, Any]]:
    """The JSON objects of the lines that start with `tag` (other lines are skipped)."""
    records = []
    for line in lines:
        head, _, rest = line.strip().partition(" ")
        if head != tag:
            continue
        try:
            value = json.loads(rest)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            records.append(value)
    return records


def overhead_pct(ratios: Sequence[float]) -> float:
    """Overhead in percent from per-round step-time ratios (pollux / plain): the median's."""
    return (statistics.median(ratios) - 1.0) * 100.0


def probe_problems(records: Sequence[dict[str, Any]], *, cuda: bool) -> list[str]:
    """What is wrong with a probe job's records: ranks, devices, backend, the sums."""
    if not records:
        return ["no replica printed a probe record"]
    problems = []
    world = records[0].get("world", 0)
    ranks = sorted(r.get("rank", -1) for r in records)
    if ranks != list(range(world)):
        problems.append(f"ranks {ranks} reported, want 0..{world - 1}")
    for r in records:
        tag = f"rank {r.get('rank')}"
        visible = r.get("cuda_visible_devices")
        if cuda:
            if not visible or not str(r.get("device", "")).startswith("cuda"):
                problems.append(
                    f"{tag}: CUDA_VISIBLE_DEVICES={visible!r}, device {r.get('device')}"
                )
            if not r.get("device_name"):
                problems.append(f"{tag}: no CUDA device name")
        elif visible != "" or r.get("device") != "cpu":
            problems.append(f"{tag}: CUDA_VISIBLE_DEVICES={visible!r}, device {r.get('device')}")
        want = "nccl" if cuda else "gloo"
        if r.get("backend") != want:
            problems.append(f"{tag}: backend {r.get('backend')}, want {want}")
        if r.get("group_world") != world:
            problems.append(f"{tag}: group of {r.get('group_world')}, want {world}")
        if not r.get("allreduce_ok"):
            problems.append(f"{tag}: wrong all-reduce sum")
    if cuda:
        visible = [r.get("cuda_visible_devices") for r in records]
        if len(set(visible)) != len(visible):
            problems.append(f"replicas share GPUs: CUDA_VISIBLE_DEVICES {visible}")
    return problems


def worlds_in_order(worlds: Sequence[int], pattern: Sequence[int]) -> bool:
    """Whether `pattern` occurs in `worlds` as a subsequence (1, 2, 1 in 1, 2, 2, 1)."""
    it = iter(worlds)
    return all(any(w == want for w in it) for want in pattern)


def resume_problems(spans: Sequence[tuple[int, int, int]]) -> list[str]:
    """Whether each generation resumed where the one before stopped.

    Args:
        spans: (generation, first step, last step) of each generation that trained, in order.
            A step the stop cut short is trained again, so the next generation starts at most
            one step after the last one logged, and never from step 0.
    """
    problems = []
    for (gen_a, _, last_a), (gen_b, first_b, _) in itertools.pairwise(spans):
        if first_b == 0 or first_b > last_a + 1:
            problems.append(
                f"generation {gen_b} started at step {first_b} after generation {gen_a} "
                f"trained to step {last_a}"
            )
    return problems


def complete_lines(text: str) -> list[str]:
    """The lines of a file another process appends to, less a last one not yet ended."""
    return [line for line in text.split("\n")[:-1] if line.strip()]


def sample_span(text: str) -> tuple[int, int, int, int] | None:
    """(generation, replicas, first step, last step) of one replica's sample log.

    The sample job's ``--audit-dir`` lines are ``GEN RANK REPLICAS EPOCH STEP IDS...``
    (examples/elastic_classifier.py); None while it has no complete line.
    """
    rows = [row.split() for row in complete_lines(text)]
    rows = [row for row in rows if len(row) >= 5 and all(f.isdigit() for f in row[:5])]
    if not rows:
        return None
    steps = [int(row[4]) for row in rows]
    return int(rows[0][0]), int(rows[0][2]), min(steps), max(steps)


def epoch_records(text: str) -> list[dict[str, Any]]:
    """The JSON objects of the sample job's epochs.jsonl (complete lines only)."""
    return [json.loads(line) for line in complete_lines(text)]


# ---- printing and waiting ----------------------------------------------------------------------

STARTED = time.monotonic()


def say(message: str) -> None:
    """One progress line, stamped with the seconds since start, flushed."""
    print(f"[{time.monotonic() - STARTED:6.1f}s] {message}", flush=True)


@dataclass(frozen=True)
class Deadline:
    """The whole run's deadline (monotonic seconds): every wait is cut to it."""

    at: float

    def left(self, cap: float = math.inf) -> float:
        """Seconds to wait for the next thing: at most `cap`, never past the deadline."""
        return max(0.0, min(cap, self.at - time.monotonic()))


class CheckFailed(Exception):
    """A check cannot go on; the message says what did not happen."""


def wait_for(predicate: Callable[[], T | None], timeout: float, what: str) -> T:
    """Poll `predicate` every 0.2 s until it returns something truthy, and return that."""
    end = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > end:
            raise CheckFailed(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)
    return value


# ---- the machine -------------------------------------------------------------------------------


def nccl_version() -> str:
    """The NCCL version torch was built with, as "2.27.3"."""
    version = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
    return ".".join(map(str, version))


def environment(force_cpu: bool) -> dict[str, Any]:
    """Python, torch, CUDA and what nvidia-smi says, printed and returned."""
    cuda = torch.cuda.is_available() and not force_cpu
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "cuda": cuda,
        "device_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "etcd": shutil.which("etcd"),
        "nvidia_smi": shutil.which("nvidia-smi"),
    }
    if torch.cuda.is_available():
        info["devices"] = [torch.cuda.get_device_name(i) for i in range(info["device_count"])]
        info["nccl"] = nccl_version()
    if info["nvidia_smi"]:
        query = "--query-gpu=index,name,driver_version,memory.total"
        out = subprocess.run(
            [info["nvidia_smi"], query, "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        info["nvidia_smi_gpus"] = out.stdout.strip().splitlines() or [out.stderr.strip()]
    for key, value in info.items():
        say(f"  {key}: {value}")
    return info


# ---- checks 1-4: on a local cluster ------------------------------------------------------------


def replica_lines(cluster: LocalCluster, job_id: str) -> dict[tuple[int, int], list[str]]:
    """{(generation, rank): lines} of a job's replica logs, read from the launcher's log root."""
    out: dict[tuple[int, int], list[str]] = {}
    for path in sorted((cluster.workdir / "replica-logs" / job_id).glob("*-*.log")):
        gen, _, rank = path.stem.partition("-")
        if gen.isdigit() and rank.isdigit():
            out[int(gen), int(rank)] = path.read_text(errors="replace").splitlines()
    return out


def wait_terminal(client: Client, job_id: str, timeout: float) -> Job:
    """The job once it has finished (succeeded, failed or been cancelled)."""

    def done() -> Job | None:
        job = client.get_job(job_id)
        return job if job.is_terminal else None

    return wait_for(done, timeout, f"job {job_id} to finish")


def while_alive(
    client: Client, job_id: str, predicate: Callable[[], T | None]
) -> Callable[[], T | None]:
    """`predicate`, which raises `CheckFailed` once the job has ended without satisfying it."""

    def check() -> T | None:
        value = predicate()
        if not value:
            job = client.get_job(job_id)
            if job.is_terminal:
                raise CheckFailed(f"job {job_id} ended {why(job)} first")
        return value

    return check


def why(job: Job) -> str:
    """The job's state and the reason of its last transition."""
    reason = job.history[-1].reason if job.history else ""
    return f"{job.state} ({reason})" if reason else job.state


def check_detection(client: Client, cuda: bool, deadline: Deadline) -> tuple[Result, int]:
    """Check 1: what the launcher registered; returns the verdict and the node's slot count."""

    def registered() -> ClusterStatus | None:
        status = client.cluster_status()
        return status if status.nodes else None

    status = wait_for(registered, deadline.left(30), "node-0 to register")
    node = status.nodes[0]
    figures = {"registered_gpus": node.gpus, "gpu_type": node.gpu_type, "node": node.name}
    say(f"node {node.name} registered {node.gpus} slot(s) of type {node.gpu_type!r}")
    if not cuda:
        ok = node.gpu_type == CPU_SLOT
        line = f"SKIP: no CUDA; the launcher serves {node.gpus} CPU slot(s) ({node.gpu_type})"
        return Result(1, "SKIP" if ok else "FAIL", line, figures), node.gpus
    try:
        found = detect(None)
    except GpuDetectionError as error:
        return Result(1, "FAIL", f"nvidia-smi here: {error}", figures), node.gpus
    figures |= {"nvidia_smi_slots": list(found.slots), "nvidia_smi_type": found.gpu_type}
    figures["torch_device_count"] = torch.cuda.device_count()
    ok = node.gpu_type == found.gpu_type and node.gpus == found.count and node.gpu_type != CPU_SLOT
    line = (
        f"launcher registered {node.gpus} x {node.gpu_type} (nvidia-smi: {found.count} x "
        f"{found.gpu_type}, slots {list(found.slots)}; torch sees {torch.cuda.device_count()})"
    )
    return Result(1, "PASS" if ok else "FAIL", line, figures), node.gpus


def check_probe(
    cluster: LocalCluster, client: Client, slots: int, cuda: bool, deadline: Deadline
) -> list[Result]:
    """Checks 2 and 3: the probe job on every slot the scheduler gives it."""
    spec = JobSpec(
        "gpu-check-probe",
        (job_python(cluster.workdir), str(JOB), "probe"),
        64,  # a fixed batch that K replicas can split: the policy may give it every slot
        max_replicas=slots,
        max_failures=1,
        stop_grace_s=10,
    )
    job = client.submit(spec)
    say(f"probe job {job.id} submitted (max_replicas {slots})")
    job = wait_terminal(client, job.id, deadline.left(180))
    logs = replica_lines(cluster, job.id)
    last_gen = max((gen for gen, _ in logs), default=-1)
    records = parse_records(
        (line for (gen, _), lines in logs.items() if gen == last_gen for line in lines), PROBE_TAG
    )
    records.sort(key=lambda r: int(r.get("rank", 0)))
    for r in records:
        say(
            f"  rank {r.get('rank')}/{r.get('world')}: CUDA_VISIBLE_DEVICES="
            f"{r.get('cuda_visible_devices')!r} device {r.get('device')} "
            f"{r.get('device_name') or ''} backend {r.get('backend')} all-reduce "
            f"{'ok' if r.get('allreduce_ok') else 'WRONG'} {r.get('allreduce_mib')} MiB in "
            f"{r.get('allreduce_ms')} ms ({r.get('allreduce_algbw_gbps')} GB/s)"
        )
    problems = probe_problems(records, cuda=cuda)
    if job.state != "SUCCEEDED":
        problems.insert(0, f"the probe job ended {why(job)}")
        for (gen, rank), lines in sorted(logs.items()):
            say(f"  replica log {gen}-{rank}, last lines:")
            for line in lines[-15:]:
                print(f"    {line}", flush=True)
    mapping = [
        {k: r.get(k) for k in ("rank", "cuda_visible_devices", "device", "device_name")}
        for r in records
    ]
    status = "FAIL" if problems else "PASS"
    world = len(records)
    map_line = "; ".join(
        f"rank {m['rank']}: CUDA_VISIBLE_DEVICES={m['cuda_visible_devices']!r} -> "
        f"{m['device']} {m['device_name'] or ''}".rstrip()
        for m in mapping
    )
    if not cuda:
        map_line = f"CPU slots (no CUDA): {map_line}"
    backend = records[0].get("backend") if records else None
    reduce_figures = {
        "world": world,
        "slots": slots,
        "backend": backend,
        "nccl": records[0].get("nccl") if records else None,
        "allreduce_mib": records[0].get("allreduce_mib") if records else None,
        "allreduce_ms": [r.get("allreduce_ms") for r in records],
        "allreduce_algbw_gbps": [r.get("allreduce_algbw_gbps") for r in records],
    }
    reduce_line = (
        f"{backend} all-reduce over {world} replica(s) of {slots} slot(s): sums right; "
        f"{reduce_figures['allreduce_mib']} MiB in {reduce_figures['allreduce_ms']} ms"
    )
    if not cuda:
        reduce_line = f"SKIP: no CUDA for NCCL; {reduce_line}"
    if problems:
        reduce_line = map_line = "; ".join(problems)
    return [
        Result(2, status, map_line, {"job": job.id, "state": job.state, "replicas": mapping}),
        Result(3, status, reduce_line, reduce_figures),
    ]


def switch_policy(cluster: LocalCluster, policy: str, deadline: Deadline) -> None:
    """Start the (one) scheduler again with another policy, and wait until it leads."""
    cluster.kill("scheduler-0", signal.SIGTERM)
    cluster.policy = policy
    cluster.start_scheduler("scheduler-0")

    def leads() -> bool:
        with cluster.client() as client:
            return client.cluster_status().leader_id == "scheduler-0"

    wait_for(leads, deadline.left(30), "the restarted scheduler to lead")
    say(f"scheduler restarted with policy {policy!r}")


@dataclass
class Audit:
    """The sample job's --audit-dir logs (examples/elastic_classifier.py): what each trained."""

    directory: Path

    def spans(self) -> dict[int, tuple[int, int, int]]:
        """{generation: (replicas, first step, last step)} of rank 0's sample logs."""
        out = {}
        for path in self.directory.glob("samples-*-0.txt"):
            span = sample_span(path.read_text())
            if span is not None:
                out[span[0]] = span[1:]
        return dict(sorted(out.items()))

    def epochs(self) -> list[dict[str, Any]]:
        """Rank 0's epoch records, oldest first."""
        path = self.directory / "epochs.jsonl"
        return epoch_records(path.read_text()) if path.exists() else []

    def training(self, want: Callable[[int, int], bool]) -> int | None:
        """The newest generation whose (generation, replicas) `want` accepts, once it trains."""
        spans = self.spans()
        gens = [g for g, (world, _, _) in spans.items() if want(g, world)]
        return gens[-1] if gens else None


def check_elastic(
    cluster: LocalCluster, client: Client, slots: int, cuda: bool, deadline: Deadline
) -> Result:
    """Check 4: the sample job on CUDA, re-allocated from its checkpoint at least once."""
    audit = Audit(cluster.workdir / "audit-elastic")
    audit.directory.mkdir()
    grow = slots >= 2
    # Emulated accelerator time paces the job the same on any machine, and makes more
    # replicas pay off, so that faithful Pollux grows it (docs/training.md, --emulate-ms).
    epochs, samples, emulate = ("6", "8192", "20,0.5") if grow else ("6", "8192", "10,0.05")
    command = (
        *(
            job_python(cluster.workdir),
            str(JOB),
            "example",
            "--epochs",
            epochs,
            "--samples",
            samples,
        ),
        *("--lr", "0.01", "--batch-size", "64", "--emulate-ms", emulate),
        *("--audit-dir", str(audit.directory)),
    )
    spec = JobSpec(
        "gpu-check-elastic",
        command,
        64,
        max_batch_size=1024,
        min_local_batch_size=16,
        max_local_batch_size=256,
        max_replicas=2 if grow else 1,
        stop_grace_s=30,
    )
    job_id = client.submit(spec).id
    plan = "1 -> 2 -> 1 replicas" if grow else "a restart of its node's launcher"
    say(f"elastic job {job_id} submitted; re-allocation by {plan}")
    competitor = None
    if grow:
        two = wait_for(
            while_alive(client, job_id, lambda: audit.training(lambda g, world: world == 2)),
            deadline.left(150),
            "the job to train on 2 replicas",
        )
        say(f"generation {two} trains on 2 replicas; a competing job arrives")
        competitor = client.submit(
            JobSpec(
                "gpu-check-idle", (job_python(cluster.workdir), str(JOB), "idle"), 1, max_replicas=1
            )
        ).id
        one = wait_for(
            while_alive(
                client, job_id, lambda: audit.training(lambda g, world: g > two and world == 1)
            ),
            deadline.left(90),
            "the job to shrink to 1 replica",
        )
        say(f"generation {one} trains on 1 replica")
    else:
        first = wait_for(
            while_alive(client, job_id, lambda: audit.epochs()[:1]),
            deadline.left(120),
            "the first epoch",
        )[0]
        gen0 = int(first["generation"])
        say(f"generation {gen0} finished epoch 0; stopping launcher node-0 (SIGTERM) ...")
        cluster.kill("node-0", signal.SIGTERM)
        cluster.start_launcher("node-0")
        say("launcher node-0 started again")
        wait_for(
            while_alive(client, job_id, lambda: audit.training(lambda g, world: g > gen0)),
            deadline.left(120),
            "the job to train again after the launcher's restart",
        )
    job = wait_terminal(client, job_id, deadline.left(180))
    if competitor is not None:
        client.cancel(competitor, "gpu check done")
    return elastic_verdict(cluster, client, job, audit, cuda=cuda, grow=grow)


def elastic_verdict(
    cluster: LocalCluster, client: Client, job: Job, audit: Audit, *, cuda: bool, grow: bool
) -> Result:
    """Check 4's verdict from the job's end state, audit logs, replica logs and model."""
    spans = audit.spans()
    epochs = audit.epochs()
    worlds = [world for world, _, _ in spans.values()]
    problems = [] if job.state == "SUCCEEDED" else [f"the job ended {why(job)}"]
    pattern = [1, 2, 1] if grow else [1, 1]
    if not worlds_in_order(worlds, pattern):
        problems.append(f"replicas per generation {worlds}, want {pattern} in order")
    problems += resume_problems([(g, first, last) for g, (_, first, last) in spans.items()])
    first_gen = min(spans, default=0)
    pauses: dict[int, float | None] = {}
    for record in epochs:
        gen = int(record["generation"])
        if gen != first_gen and gen not in pauses:
            pauses[gen] = record.get("rescale_pause_s")
    if not pauses or not all(p is not None and p > 0 for p in pauses.values()):
        problems.append(f"rescale pauses per restarted generation {pauses}")
    try:
        model = client.explain(job.id).model
        reported = None if model is None else model.rescale_pause_s
    except Exception as error:  # a figure, not a verdict
        reported = None
        say(f"explain: {error}")
    logs = replica_lines(cluster, job.id)
    devices = {
        f"{gen}-{rank}": r.get("device")
        for (gen, rank), lines in logs.items()
        for r in parse_records(lines, EXAMPLE_TAG)
    }
    memory = {
        f"{gen}-{rank}": r.get("bytes")
        for (gen, rank), lines in logs.items()
        for r in parse_records(lines, MEMORY_TAG)
    }
    want_device = "cuda" if cuda else "cpu"
    wrong = {k: d for k, d in devices.items() if not str(d).startswith(want_device)}
    if not devices or wrong:
        problems.append(f"replicas' devices {devices}, want {want_device}")
    if cuda and not any(b and b > 0 for b in memory.values()):
        problems.append(f"no replica reported CUDA memory used ({memory})")
    accuracy = epochs[-1].get("accuracy") if epochs else None
    if accuracy is None or accuracy < 0.3:
        problems.append(f"final accuracy {accuracy}")
    figures = {
        "job": job.id,
        "state": job.state,
        "restarts": job.restarts,
        "generations": {g: {"replicas": w, "steps": [a, b]} for g, (w, a, b) in spans.items()},
        "rescale_pause_s": pauses,
        "model_rescale_pause_s": reported,
        "devices": devices,
        "peak_cuda_memory_bytes": memory,
        "epochs": len(epochs),
        "final_accuracy": accuracy,
        "final_batch": epochs[-1].get("batch") if epochs else None,
    }
    for record in epochs:
        say(
            "  epoch {epoch} gen {generation} replicas {replicas} batch {batch} steps {steps} "
            "accuracy {accuracy:.3f} rescale_pause_s {rescale_pause_s}".format(**record)
        )
    if problems:
        for (gen, rank), lines in sorted(logs.items()):
            say(f"  replica log {gen}-{rank}, last lines:")
            for line in lines[-15:]:
                print(f"    {line}", flush=True)
        return Result(4, "FAIL", "; ".join(problems), figures)
    pause_text = ", ".join(f"gen {g}: {p:.2f} s" for g, p in pauses.items() if p is not None)
    line = (
        f"{'CUDA' if cuda else 'CPU slots (no CUDA)'}: replicas per generation {worlds}, "
        f"{job.restarts} restart(s), resumed from its checkpoint each time; rescale pause "
        f"{pause_text} (agent's model: {reported if reported is None else f'{reported:.2f} s'})"
        f"; {job.state}, final accuracy {accuracy:.3f}"
    )
    return Result(4, "PASS", line, figures)


def cluster_checks(args: argparse.Namespace, cuda: bool, deadline: Deadline) -> list[Result]:
    """Checks 1-4 on one local cluster, stopped at the end; a stage that fails fails the rest."""
    workdir = Path(tempfile.mkdtemp(prefix="pollux-gpu-check-"))
    cluster = LocalCluster(
        workdir / "cluster",
        nodes=1,
        gpus_per_node=args.cpu_slots,
        real_gpus=cuda,
        schedulers=1,
        agents=1,
        interval_s=1.0,
        lease_ttl_s=2,
        restart_delay_s=3.0,
        dashboard=False,
        replica_isolation=False,
    )
    results: list[Result] = []
    stage = "starting the cluster"
    try:
        say(f"starting a local cluster in {cluster.workdir} ...")
        cluster.start()
        say(f"cluster up: etcd {cluster.etcd_endpoint}, {len(cluster.procs)} service processes")
        with cluster.client() as client:
            stage = "check 1"
            detection, slots = check_detection(client, cuda, deadline)
            results.append(report(detection))
            stage = "the probe job"
            results += [report(r) for r in check_probe(cluster, client, slots, cuda, deadline)]
        stage = "the elastic job"
        if slots >= 2:  # faithful Pollux starts a job on one GPU and grows it
            switch_policy(cluster, "pollux", deadline)
        with cluster.client() as client:
            results.append(report(check_elastic(cluster, client, slots, cuda, deadline)))
    except Exception as error:
        say(f"{stage} failed: {error!r}")
        traceback.print_exc(file=sys.stdout)
        done = {r.number for r in results}
        results += [
            report(Result(n, "FAIL", f"{stage}: {error}")) for n in (1, 2, 3, 4) if n not in done
        ]
    finally:
        say("stopping the cluster ...")
        try:
            cluster.stop()
        except Exception as error:
            say(f"stopping the cluster: {error!r}")
        if args.logs is not None:
            try:
                keep_logs(cluster.workdir, args.logs)
            except OSError as error:
                say(f"copying the logs: {error!r}")
        shutil.rmtree(workdir, ignore_errors=True)
    return results


def keep_logs(workdir: Path, target: Path) -> None:
    """Copy the service and replica logs (and the audit logs) under `target`."""
    for name in ("logs", "replica-logs", "audit-elastic"):
        source = workdir / name
        if source.is_dir():
            shutil.copytree(source, target / name, dirs_exist_ok=True)
    say(f"logs copied to {target}")


# ---- check 5: the training library's overhead --------------------------------------------------


@dataclass(frozen=True)
class OverheadSetup:
    """Model and timing of the overhead comparison (benchmarks/train_overhead.py's options)."""

    features: int
    hidden: int
    batch: int
    steps: int
    rounds: int
    warmup: int

    @property
    def params(self) -> int:
        """Parameters of train_overhead's MLP features-hidden-hidden-10."""
        f, h, c = self.features, self.hidden, 10
        return f * h + h + h * h + h + h * c + c


GPU_SETUP = OverheadSetup(2048, 4096, 512, steps=20, rounds=12, warmup=10)
"""About 25M parameters; a step of a few milliseconds on a datacentre GPU."""
CPU_SETUP = OverheadSetup(256, 1024, 64, steps=10, rounds=6, warmup=5)
"""1.3M parameters, a CPU stand-in: its figures are printed, not judged (shared cores are
noisier than the overhead, docs/results.md)."""
OVERHEAD_LIMIT_PCT = 10.0
"""The most step-time overhead over plain DDP that passes on a GPU."""


def check_overhead(cuda: bool, deadline: Deadline, limit: float) -> Result:
    """Check 5: ms/step of the same model and batch, plain DDP loop vs `pollux.train`."""
    setup = GPU_SETUP if cuda else CPU_SETUP
    options = argparse.Namespace(
        steps=setup.steps,
        rounds=setup.rounds,
        warmup=setup.warmup,
        hidden=setup.hidden,
        features=setup.features,
        classes=10,
        batch=setup.batch,
        samples=8192,
        noise_floor=False,
        stats_interval=8,
    )
    replicas = [1, 2] if cuda and torch.cuda.device_count() >= 2 else [1]
    cases = []
    for k in replicas:
        if deadline.left() < 30:
            raise CheckFailed("no time left for the overhead comparison")
        say(f"overhead: {k} replica(s), MLP {setup.features}-{setup.hidden}-{setup.hidden}-10 ...")
        out = overhead.run_case(overhead.Case(k, setup.batch, 1), options)
        plain = statistics.median(out["plain"]) * 1e3
        pollux = statistics.median(out["pollux"]) * 1e3
        pct = overhead_pct(out["ratios"])
        cases.append(
            {"replicas": k, "device": out["device"], "plain_ms": round(plain, 3)}
            | {"pollux_ms": round(pollux, 3), "overhead_pct": round(pct, 2)}
        )
        say(
            f"  {k} replica(s) on {out['device']}: plain {plain:.3f} ms/step, "
            f"pollux {pollux:.3f} ms/step, overhead {pct:.2f} %"
        )
    worst = max(c["overhead_pct"] for c in cases)
    figures = {"params": setup.params, "batch": setup.batch, "limit_pct": limit, "cases": cases}
    text = ", ".join(
        f"K={c['replicas']} {c['device']}: plain {c['plain_ms']:.2f} ms, pollux "
        f"{c['pollux_ms']:.2f} ms ({c['overhead_pct']:+.1f} %)"
        for c in cases
    )
    model = f"{setup.params / 1e6:.1f}M-param MLP, batch {setup.batch}"
    if not cuda:
        line = f"SKIP: no CUDA for the 25M-param model; CPU stand-in {model}: {text} (not judged)"
        return Result(5, "SKIP", line, figures)
    line = f"{model}: {text}; limit {limit:.0f} %"
    return Result(5, "PASS" if worst <= limit else "FAIL", line, figures)


# ---- main --------------------------------------------------------------------------------------


def report(result: Result) -> Result:
    """Print a verdict line as soon as it is known."""
    print(format_result(result), flush=True)
    return result


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the JSON summary's path")
    parser.add_argument("--cpu-slots", type=int, default=2, help="CPU slots without CUDA")
    parser.add_argument("--cpu", action="store_true", help="CPU slots even where CUDA works")
    parser.add_argument("--logs", type=Path, help="copy the cluster's logs here")
    parser.add_argument("--budget-s", type=float, default=300.0, help="whole-run deadline, s")
    parser.add_argument(
        "--max-overhead-pct",
        type=float,
        default=OVERHEAD_LIMIT_PCT,
        help="check 5's limit on a GPU (default %(default)s)",
    )
    parser.add_argument("--skip-overhead", action="store_true", help="leave check 5 out")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    deadline = Deadline(time.monotonic() + args.budget_s)
    say("gpu check: environment")
    info = environment(args.cpu)
    cuda = bool(info["cuda"])
    if not cuda:
        say("no CUDA: CPU slots and gloo; GPU-only parts say SKIP: no CUDA")
    results = cluster_checks(args, cuda, deadline)
    if args.skip_overhead:
        results.append(report(Result(5, "SKIP", "left out (--skip-overhead)")))
    else:
        try:
            results.append(report(check_overhead(cuda, deadline, args.max_overhead_pct)))
        except Exception as error:
            traceback.print_exc(file=sys.stdout)
            results.append(report(Result(5, "FAIL", f"{error!r}")))
    elapsed = time.monotonic() - STARTED
    result = summary(results, cuda=cuda, elapsed_s=round(elapsed, 1), environment=info)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"\n==== gpu check: {'PASS' if result['ok'] else 'FAIL'} in {elapsed:.0f} s ====")
    for r in results:
        print(format_result(r))
    print(f"summary: {args.out}", flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
