"""When the schedulers compact and defragment etcd (pollux.service.maintenance)."""

from __future__ import annotations

from collections import deque

from pollux.service.maintenance import MaintenanceSettings, compaction_target, needs_defragment
from pollux.service.store import MemberStatus

MIB = 1024 * 1024


def member(size_mib: int, in_use_mib: int) -> MemberStatus:
    return MemberStatus(1, 100, size_mib * MIB, in_use_mib * MIB, ())


def test_a_member_is_defragmented_only_with_many_free_pages_making_up_much_of_its_file() -> None:
    settings = MaintenanceSettings(defrag_min_bytes=64 * MIB, defrag_ratio=0.5)
    assert needs_defragment(member(1000, 400), settings)
    assert not needs_defragment(member(1000, 600), settings), "free share below the ratio"
    assert not needs_defragment(member(100, 40), settings), "too few free bytes to bother"


def test_compaction_keeps_the_retention_window_of_history() -> None:
    samples: deque[tuple[float, int]] = deque([(0.0, 10), (60.0, 50), (120.0, 90), (200.0, 130)])
    assert compaction_target(samples, 100.0, 300.0) is None
    assert compaction_target(samples, 380.0, 300.0) == 50, "the newest one at least 300 s old"
    assert list(samples) == [(120.0, 90), (200.0, 130)]
