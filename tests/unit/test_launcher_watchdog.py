"""The watchdog's loop (pollux.launcher.watchdog.serve) over a real pipe, with a fake clock."""

from __future__ import annotations

import os

from pollux.launcher.fence import fence_margin, fence_token
from pollux.launcher.watchdog import serve


class Kills:
    """Records sweeps instead of killing anything."""

    def __init__(self) -> None:
        self.tokens: list[str] = []

    def __call__(self, token: str) -> list[int]:
        self.tokens.append(token)
        return []


def test_a_deadline_already_sent_protects_replicas_of_a_slow_starting_watchdog() -> None:
    # The launcher sends its deadline before it starts any replica; a watchdog that comes up
    # late must read it before its first judgement, or it kills replicas the lease covers.
    read, write = os.pipe()
    os.write(write, b"lease 100.0\n")
    os.close(write)
    kills = Kills()
    serve(read, "n@x", clock=lambda: 50.0, kill=kills)
    os.close(read)
    assert kills.tokens == ["n@x"], "only the sweep at end of input (the launcher is gone)"


def test_a_passed_deadline_kills_the_replicas_and_keeps_sweeping() -> None:
    read, write = os.pipe()
    os.write(write, b"lease 100.0\nnonsense\nlease 90.0\n")  # a deadline never moves back
    times = iter([99.5] + [101.0] * 100)  # not yet due at the first look, then past due
    kills = Kills()

    def kill(token: str) -> list[int]:
        kills(token)
        if len(kills.tokens) == 2:  # a second sweep while the deadline stays past: done
            os.close(write)
        return []

    serve(read, "n@x", clock=lambda: next(times), kill=kill)
    os.close(read)
    assert kills.tokens == ["n@x"] * 3  # deadline passed, the rescan, end of input


def test_fence_tokens_separate_nodes_and_clusters() -> None:
    token = fence_token("127.0.0.1:2379", "/pollux/v1", "gpu-01")
    assert token.startswith("gpu-01@")
    assert token != fence_token("127.0.0.1:2379", "/pollux/v1", "gpu-02")
    assert token != fence_token("127.0.0.1:2379", "/other", "gpu-01")
    assert token != fence_token("10.0.0.1:2379", "/pollux/v1", "gpu-01")


def test_the_fence_falls_before_the_lease_can_expire() -> None:
    for ttl in (2, 3, 10, 60):
        assert 0 < fence_margin(ttl) < ttl / 3  # well inside one refresh period
