"""The fault suite's short form (benchmarks/chaos.py --short): each fault once, on real processes.

Three etcd members, two schedulers, two agents and two launchers run real jobs; each fault of
the suite is injected once and the suite checks that no job is lost, stuck, run twice at
once, corrupted or failed, no slot leaks and no bad spec is accepted. As root the disk faults
run too (full replica-log, checkpoint and etcd filesystems on small tmpfs mounts), each
healing once space is freed; otherwise the suite says it skipped them. The full run (200
random cycles) is the benchmark; this is its smoke form.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import disk_full
from benchmarks.chaos import ALL_FAULTS, DISK_FAULTS, FAULTS, MUST_BE_ZERO

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(720)


def test_every_fault_once_leaves_nothing_lost_stuck_doubled_corrupted_or_leaked(
    tmp_path: Path,
) -> None:
    figures_path = tmp_path / "figures.json"
    process = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "benchmarks" / "chaos.py"),
            "--short",
            *("--workdir", str(tmp_path / "cluster"), "--json", str(figures_path)),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = process.communicate(timeout=660)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)  # the suite stops its cluster on SIGTERM
            try:
                process.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()
    figures = json.loads(figures_path.read_text())
    skipped = disk_full.unavailable()
    faults = FAULTS if skipped else ALL_FAULTS
    assert figures["disk_faults_skipped"] == skipped, output
    if skipped:
        assert f"disk faults ({', '.join(DISK_FAULTS)}) skipped: {skipped}" in output
    assert figures["cycles"] == len(faults), output
    counts = {key: figures[key] for key in MUST_BE_ZERO}
    assert counts == dict.fromkeys(counts, 0), output
    assert set(figures["by_fault"]) == set(faults), output
    assert process.returncode == 0, output
