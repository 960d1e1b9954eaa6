"""End to end: real elastic training (`examples/elastic_classifier.py`) through a local cluster.

etcd, a scheduler (faithful Pollux), an agent and two launchers (2 CPU "GPU slots" each) run
as processes; the job's accelerator time is emulated (slept), so four replicas on two cores
behave like a GPU job. The scheduler grows it from 1 replica to 4; a competing job arrives
and is cancelled twice, so it shrinks and regrows. From the job's audit logs the test checks
that every restart resumed from the last checkpoint, every sample was trained exactly once per
epoch, the noise scale rose and the final batch exceeds the initial one, no epoch of one
generation trained with a smaller batch than an earlier one of at most half its noise scale
(ties pass: the agent's choice is a step function, tested exactly in
tests/unit/test_agent_batch_choice.py), and the final loss and accuracy match the script run
alone within a stated tolerance. Every wait is cut to one deadline (the timeout marker less a
reserve for stopping the cluster), so a slow run fails naming the stage it was in.
"""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pollux.client import JobSpec
from pollux.service.local_cluster import LocalCluster
from tests.job_python import job_python
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "elastic_classifier.py"
COUNTER = Path(__file__).parent / "jobs" / "counter_job.py"

EPOCHS = 24
SAMPLES = 16384
INIT_BATCH = 64
TRAIN_ARGS = ("--samples", str(SAMPLES), "--lr", "0.01", "--batch-size", str(INIT_BATCH))

ACCURACY_TOLERANCE = 0.03
"""Absolute test-accuracy difference allowed between the elastic and the solo run. The data
are noisy (the best accuracy is about 0.70), the runs see different batch sizes and replica
counts, and 1024 test samples carry about ±0.014 sampling noise."""
LOSS_TOLERANCE = 0.05
"""Relative test-loss difference allowed (the loss is about 0.88)."""
NOISE_RISE = 2.0
"""Factor by which one epoch's measured noise scale must exceed an earlier epoch's (same
allocation) before its batch may not be smaller: epoch-to-epoch samples differ by about 20 %."""

TIMEOUT_S = 540
"""The test's pytest timeout: it takes about 250 s on an idle two-core machine and 370 s on one
shared with other test runs."""
TEARDOWN_S = 45.0
"""Kept out of every wait for stopping the cluster (the launchers stop replicas gracefully)."""


@dataclass(frozen=True)
class Deadline:
    """One deadline shared by all of a test's waits (monotonic clock, seconds)."""

    at: float

    def left(self, cap: float = math.inf) -> float:
        """Seconds to wait for the next thing: at most `cap`, never past the deadline."""
        return max(0.0, min(cap, self.at - time.monotonic()))


@pytest.fixture
def deadline(request: pytest.FixtureRequest) -> Deadline:
    """The test's timeout marker, counted from before the cluster starts, less teardown."""
    marker = request.node.get_closest_marker("timeout")
    assert marker is not None, "a test that waits needs a timeout marker to fit its waits in"
    return Deadline(time.monotonic() + float(marker.args[0]) - TEARDOWN_S)


@pytest.fixture
def cluster(tmp_path: Path, deadline: Deadline) -> Iterator[LocalCluster]:
    # Depends on `deadline` so that the deadline is taken before the cluster's start-up, which
    # counts against the test's timeout too.
    with LocalCluster(
        tmp_path / "cluster",
        nodes=2,
        gpus_per_node=2,
        schedulers=1,
        agents=1,
        interval_s=1.0,
        lease_ttl_s=2,
        restart_delay_s=3.0,
        # Faithful Pollux: it grows a job 1 → 2 → 4 and back whenever GPUs free up, which is
        # what this test watches. The default, pollux-jct, prices each regrowth against the
        # job's measured pause and remaining time and may rightly decline it.
        policy="pollux",
    ) as c:
        yield c


@pytest.fixture
def solo(tmp_path: Path, cluster: LocalCluster) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """The same script alone: one process, no cluster, batch M0 throughout; and its log.

    Started once the cluster is up, alongside the elastic job; killed if the test ends first.
    """
    log = tmp_path / "solo.log"
    with log.open("wb") as out:  # a file, not a pipe: nothing can block on a full pipe
        process = subprocess.Popen(
            [sys.executable, str(EXAMPLE), "--epochs", str(EPOCHS), *TRAIN_ARGS],
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    yield process, log
    if process.poll() is None:
        process.kill()
        process.wait()


def last_epoch_line(output: str) -> dict[str, float]:
    line = [x for x in output.splitlines() if x.startswith("epoch ")][-1].split()
    return {line[i]: float(line[i + 1]) for i in range(2, len(line) - 1, 2) if line[i + 1] != "-"}


Rows = list[tuple[int, int, int, list[int]]]
"""(replicas, epoch, step, sample indices) per micro-batch of one replica."""


def read_samples(audit: Path) -> dict[int, dict[int, Rows]]:
    """{generation: {rank: rows}} from the replicas' sample logs."""
    logs: dict[int, dict[int, Rows]] = defaultdict(dict)
    for path in audit.glob("samples-*-*.txt"):
        gen, rank = (int(x) for x in path.stem.split("-")[1:])
        rows = []
        for line in path.read_text().splitlines():
            f = line.split()
            rows.append((int(f[2]), int(f[3]), int(f[4]), [int(x) for x in f[5:]]))
        logs[gen][rank] = rows
    return dict(logs)


def kept_batches(
    logs: dict[int, dict[int, Rows]],
) -> tuple[list[tuple[int, int, int, int]], dict[int, list[int]]]:
    """Per generation (generation, first step, last kept step, replicas), and epoch → ids.

    A generation's steps at or beyond the next generation's first step were cut short by the
    restart and trained again by the next one, so they are dropped; everything else counts.
    Generations that logged no step are left out.
    """
    # A generation stopped by the next rescale before its first step logged nothing: it kept
    # nothing, so it neither resumes nor is resumed from.
    gens = sorted(g for g in logs if any(logs[g].values()))
    starts = {g: min(r[2] for rows in logs[g].values() for r in rows) for g in gens}
    spans = []
    seen: dict[int, list[int]] = defaultdict(list)
    for i, g in enumerate(gens):
        end = starts[gens[i + 1]] if i + 1 < len(gens) else None
        last_kept = -1
        worlds = {r[0] for rows in logs[g].values() for r in rows}
        assert len(worlds) == 1, f"generation {g} logged replica counts {worlds}"
        for rows in logs[g].values():
            for _, epoch, step, ids in rows:
                if end is None or step < end:
                    seen[epoch].extend(ids)
                    last_kept = max(last_kept, step)
        spans.append((g, starts[g], last_kept, worlds.pop()))
    return spans, dict(seen)


@pytest.mark.timeout(TIMEOUT_S)
def test_elastic_job_rescales_resumes_and_matches_a_solo_run(
    cluster: LocalCluster,
    deadline: Deadline,
    solo: tuple[subprocess.Popen[bytes], Path],
    tmp_path: Path,
) -> None:
    solo_process, solo_log = solo
    audit = tmp_path / "audit"
    audit.mkdir()
    audit.chmod(0o777)  # written by the replicas, which run under the job's own uid
    spec = JobSpec(
        "elastic",
        (
            job_python(),
            str(EXAMPLE),
            "--epochs",
            str(EPOCHS),
            *TRAIN_ARGS,
            "--emulate-ms",
            "20,0.5",
            "--audit-dir",
            str(audit),
        ),
        INIT_BATCH,
        max_batch_size=2048,
        min_local_batch_size=16,
        max_local_batch_size=256,
        max_replicas=4,
        stop_grace_s=30,
    )
    competitor = JobSpec(
        "competitor",
        (job_python(), str(COUNTER)),
        32,
        env={"COUNTER_TOTAL": "100000", "COUNTER_STEP_S": "0.1", "PYTHONPATH": str(ROOT)},
        max_replicas=1,
        stop_grace_s=5,
    )
    with cluster.client() as client:
        job_id = client.submit(spec).id

        def training_on(want: Callable[[int], bool]) -> bool:
            """Whether the job trains, with a number of replicas `want` accepts."""
            job = client.get_job(job_id)
            assert job.state not in ("FAILED", "CANCELLED"), job.history
            if job.state != "RUNNING" or job.allocation is None:
                return False
            gen = job.allocation.generation
            # Running means launched; wait until the replicas actually train.
            return want(job.allocation.gpus) and (audit / f"samples-{gen}-0.txt").exists()

        # Each stage's own limit, cut to what is left before the deadline.
        wait_until(
            lambda: training_on(lambda k: k == 4), deadline.left(150), "the job to train on 4 GPUs"
        )
        for _ in range(2):
            # A second job arrives: the scheduler makes room for it by shrinking ours.
            other = client.submit(competitor).id
            wait_until(lambda: training_on(lambda k: k < 4), deadline.left(60), "the job to shrink")
            client.cancel(other)
            wait_until(
                lambda: training_on(lambda k: k == 4), deadline.left(60), "the job to grow back"
            )
        wait_until(
            lambda: client.get_job(job_id).state == "SUCCEEDED", deadline.left(), "the job to end"
        )
        job = client.get_job(job_id)
        model = client.explain(job_id).model

    # The job declared its size (trainer.epochs) and measured its rescale pauses, and its
    # reports carried both to the published model. (Whether the very last report, sent while
    # the replica exits, arrived is best effort: the remaining work is not checked for 0.)
    assert model is not None
    assert model.progress is not None
    assert model.progress > 0
    assert model.remaining_work is not None
    assert model.remaining_work >= 0
    assert model.rescale_pause_s is not None
    assert model.rescale_pause_s > 0

    resized = [t.reason for t in job.history if t.state == "RESCALING"]
    assert len(resized) >= 4, [t.reason for t in job.history]

    # Restarts resumed from the checkpoint: each generation starts at the step after the last
    # step the previous one kept, and the world sizes went 1 → … up and down.
    spans, seen = kept_batches(read_samples(audit))
    worlds = [world for *_, world in spans]
    assert worlds[0] == 1
    assert sum(b > a for a, b in itertools.pairwise(worlds)) >= 2, worlds
    assert sum(b < a for a, b in itertools.pairwise(worlds)) >= 2, worlds
    for (_, _, last_kept, _), (_, start, _, _) in itertools.pairwise(spans):
        assert start == last_kept + 1, spans
    assert spans[0][1] == 0

    # No sample lost or repeated: every epoch trained on each sample exactly once.
    assert sorted(seen) == list(range(EPOCHS))
    for epoch, ids in seen.items():
        counts = Counter(ids)
        assert len(ids) == SAMPLES, f"epoch {epoch}: {len(ids)} samples"
        assert set(counts.values()) == {1}, f"epoch {epoch}: {len(counts)} distinct samples"

    # The batch followed the noise scale, in checks that equal batches cannot break (the
    # causal claim itself is a unit property of the agent's choice, see the module docstring).
    epochs = [json.loads(x) for x in (audit / "epochs.jsonl").read_text().splitlines()]
    measured = [e for e in epochs if e["pgns"] is not None]
    first, last = measured[0], measured[-1]
    assert last["pgns"] > first["pgns"], (first, last)
    assert last["batch"] > INIT_BATCH, epochs
    # Within one generation the shape is fixed, so the total batch is the agent's choice for
    # that shape; a much noisier later epoch never trained with a smaller one.
    for early, late in itertools.combinations(measured, 2):
        if early["generation"] == late["generation"] and (
            late["pgns"] >= NOISE_RISE * early["pgns"]
        ):
            assert late["batch"] >= early["batch"], (early, late)
    assert epochs[-1]["epoch"] == EPOCHS - 1
    assert epochs[-1]["progress"] > 0

    # Same quality as training alone (started first, it has long finished by now).
    wait_until(lambda: solo_process.poll() is not None, deadline.left(), "the solo run to end")
    out = solo_log.read_text()
    assert solo_process.returncode == 0, out
    alone = last_epoch_line(out)
    final = epochs[-1]
    assert abs(final["accuracy"] - alone["accuracy"]) <= ACCURACY_TOLERANCE, (final, alone)
    assert abs(final["test_loss"] - alone["test_loss"]) <= LOSS_TOLERANCE * alone["test_loss"], (
        final,
        alone,
    )
