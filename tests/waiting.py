"""The one polling helper of every test tier: wait for a state, never for a duration.

`wait_until` is for tests that watch real processes from outside (synchronous code);
`eventually` is its asyncio twin and takes a sync or async check. Both fail naming what they
waited for, so a slow run says what did not happen rather than being killed by pytest-timeout.
A "did not happen" check also waits for a state that proves the system looked (a reconcile
pass, a round number, a barrier flag) and then asserts, instead of sleeping.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T], timeout: float, what: str, *, interval: float = 0.2
) -> T:
    """Poll `predicate` until it returns something truthy, and return that.

    Raises:
        AssertionError: After `timeout` seconds, naming `what`.
    """
    deadline = time.monotonic() + timeout
    while not (result := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)
    return result


async def eventually(
    check: Callable[[], Any | Awaitable[Any]],
    timeout: float = 10.0,
    what: str = "the condition",
    *,
    interval: float = 0.05,
) -> Any:
    """Await `check` (sync or async) until it returns something truthy, and return that.

    Raises:
        AssertionError: After `timeout` seconds, naming `what`.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        await asyncio.sleep(interval)
