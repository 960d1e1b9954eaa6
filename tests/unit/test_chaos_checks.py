"""The fault suite (benchmarks/chaos.py): its overlap detector on hand-written tick files, its
progress reader and counts, its faults and its schedule."""

from __future__ import annotations

import random
from pathlib import Path

from benchmarks.chaos import ALL_FAULTS, DISK_FAULTS, FAULTS, MUST_BE_ZERO, schedule
from benchmarks.chaos_suite.checks import last_ns
from benchmarks.chaos_suite.inject import DISK_SIZES
from benchmarks.chaos_suite.tally import Tally, overlapping_generations


def ticks(*rows: tuple[int, int]) -> bytes:
    """Tick lines for (generation, time in ms) rows, in the job's format."""
    return b"".join(f"{g} 0 {i} {ms * 1_000_000} 100\n".encode() for i, (g, ms) in enumerate(rows))


def test_generations_one_after_another_do_not_overlap() -> None:
    assert overlapping_generations(ticks((1, 0), (1, 200), (2, 900), (2, 1100), (4, 1500))) == []


def test_an_old_generation_ticking_after_the_new_one_started_is_an_overlap() -> None:
    # Generation 1 kept running (its launcher stopped) while generation 2 started.
    found = overlapping_generations(ticks((1, 0), (2, 300), (1, 400), (1, 600), (2, 700)))
    assert found == [(1, 2, 0.3)]


def test_a_line_cut_short_by_a_kill_is_ignored() -> None:
    assert overlapping_generations(ticks((1, 0), (2, 500)) + b"1 0 7 99") == []


def test_progress_is_the_newest_whole_line_of_a_jobs_file(tmp_path: Path) -> None:
    assert last_ns(tmp_path, "ticks") == 0  # no file yet
    (tmp_path / "ticks").write_bytes(ticks((1, 5), (1, 9)) + b"1 0 2 77")  # the last cut short
    assert last_ns(tmp_path, "ticks") == 9_000_000
    (tmp_path / "reports").write_bytes(b"100 3\n250 4\n")
    assert last_ns(tmp_path, "reports") == 250


def test_only_the_counts_that_must_be_zero_are_problems() -> None:
    tally = Tally(cycles=5, disk_failed=2)
    assert tally.problems() == 0  # jobs a full checkpoint disk failed, saying so, are expected
    tally.leaked, tally.unhealed = 1, 1
    assert tally.problems() == 2


def test_the_disk_faults_are_part_of_the_suite_and_must_heal() -> None:
    assert set(DISK_FAULTS) == {"log_disk_full", "checkpoint_disk_full", "etcd_disk_full"}
    assert list(ALL_FAULTS) == [*FAULTS, *DISK_FAULTS]
    assert "unhealed_disk_faults" in MUST_BE_ZERO
    assert set(DISK_SIZES) == set(DISK_FAULTS)


def test_a_long_run_draws_every_fault_at_least_once() -> None:

    for seed in range(20):
        kinds = schedule(ALL_FAULTS, 50, random.Random(seed))
        assert len(kinds) == 50
        assert set(kinds) == set(ALL_FAULTS)
    assert len(set(schedule(ALL_FAULTS, 3, random.Random(1)))) == 3
