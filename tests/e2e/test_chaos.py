"""The fault suite's short form (benchmarks/chaos.py --short): each fault once, on real processes.

Three etcd members, two schedulers, two agents and two launchers run real jobs; each fault of
the suite is injected once and the suite checks that no job is lost, stuck, run twice at
once, corrupted or failed, no slot leaks and no bad spec is accepted. The full run (200 random
cycles) is the benchmark; this is its smoke form.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.chaos import FAULTS, MUST_BE_ZERO

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(400)


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
        output, _ = process.communicate(timeout=360)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)  # the suite stops its cluster on SIGTERM
            try:
                process.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()
    figures = json.loads(figures_path.read_text())
    assert figures["cycles"] == len(FAULTS), output
    counts = {key: figures[key] for key in MUST_BE_ZERO}
    assert counts == dict.fromkeys(counts, 0), output
    assert set(figures["by_fault"]) == set(FAULTS), output
    assert process.returncode == 0, output
