"""Follow a submitted job on a local cluster and print its progress live (`pollux-up --demo`)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

from pollux.client import Client, JobSpec, PolluxError
from pollux.terminal import escape_controls

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


def follow_demo(
    client: Client,
    job_file: Path,
    *,
    poll_s: float = 1.0,
    dashboard: Callable[[str], str | None] | None = None,
) -> int:
    """Submit `job_file`, print every state, allocation and batch change until it ends.

    While the job runs, the newest line of rank 0's log (the training script's own progress
    line, e.g. one per epoch) is shown too, whenever it changes. `dashboard` gives the web
    dashboard's address of a route; the job's page is printed once it is submitted. What the
    job and the scheduler wrote (its log line, reasons) is printed with control characters
    escaped, as `pollux-cli` does.

    Returns:
        0 if the job succeeded, 1 otherwise.
    """
    spec = JobSpec.from_file(job_file)
    job = client.submit(spec)
    print(f"submitted {job.id} ({spec.name}); follow with: pollux-cli describe {job.id}")
    page = dashboard(f"/jobs/{job.id}") if dashboard is not None else None
    if page is not None:
        print(f"its timeline, plotted: {page}", flush=True)
    last = last_progress = ""
    started = time.monotonic()
    while True:
        job = client.get_job(job.id)
        explanation = client.explain(job.id)
        gpus = len(job.allocation.nodes) if job.allocation else 0
        batch = explanation.batch
        batch_text = (
            f"batch {batch.total_batch_size} ({batch.local_batch_size}×{batch.accum_steps})"
            if batch is not None
            else "batch -"
        )
        line = f"{job.state:<10} {gpus} GPU(s)  {batch_text}  restarts {job.restarts}"
        if line != last:
            print(f"[{time.monotonic() - started:6.1f}s] {line}", flush=True)
            last = line
        if job.state == "RUNNING":
            progress = _last_log_line(client, job.id)
            if progress and progress != last_progress:
                line = escape_controls(progress)
                print(f"[{time.monotonic() - started:6.1f}s]   {line}", flush=True)
                last_progress = progress
        if job.state in TERMINAL:
            for t in job.history:
                print(f"  {t.state:<10} {escape_controls(t.reason)}")
            return 0 if job.state == "SUCCEEDED" else 1
        time.sleep(poll_s)


def _last_log_line(client: Client, job_id: str) -> str:
    """Rank 0's newest log line, or "" while it has none or its launcher cannot say."""
    try:
        lines = list(client.logs(job_id, 0, tail_lines=1))
    except PolluxError:
        return ""
    return lines[-1].rstrip() if lines else ""


if __name__ == "__main__":
    with Client(sys.argv[1].split(",")) as main_client:
        sys.exit(follow_demo(main_client, Path(sys.argv[2])))
