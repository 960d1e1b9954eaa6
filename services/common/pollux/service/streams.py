"""Bounds on open server streams, per principal and per process.

A stream holds memory and a task for as long as its caller keeps it open, so one caller could
hold hundreds and slow the process for everyone. `StreamGate` counts the streams each
principal holds and all of them together; the RPC observer (pollux.service.rpc) admits each
stream through it once the caller is authenticated and releases it when the stream ends, and
a stream past a cap is refused with RESOURCE_EXHAUSTED naming the cap and its setting. The
unauthenticated local caller of a service without TLS counts only against the total.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator

import prometheus_client

from pollux.service import auth
from pollux.service.errors import ResourceExhausted

OPEN = prometheus_client.Gauge("pollux_open_streams", "Server streams open in this process.")
REFUSED = prometheus_client.Counter(
    "pollux_streams_refused", "Streams refused for a cap, by cap.", ["cap"]
)


class StreamGate:
    """Admits streams up to `per_principal` per caller and `total` in all (0: no cap).

    Args:
        per_principal: Streams one authenticated principal may hold at once.
        total: Streams of everyone together.
        principal_setting: The setting that sets `per_principal`, for refusals' messages.
        total_setting: The setting that sets `total`.
    """

    def __init__(
        self,
        per_principal: int,
        total: int,
        *,
        principal_setting: str = "streams_per_principal",
        total_setting: str = "streams_per_replica",
    ) -> None:
        self.per_principal = per_principal
        self.total = total
        self._principal_setting = principal_setting
        self._total_setting = total_setting
        self._held: Counter[str] = Counter()
        self._open = 0

    def held(self, principal: auth.Principal) -> int:
        """Streams `principal` holds now."""
        return self._held[principal.name]

    @property
    def open(self) -> int:
        """Streams open now."""
        return self._open

    @contextlib.contextmanager
    def admit(self, principal: auth.Principal, method: str) -> Iterator[None]:
        """Hold a stream slot for `principal` while the block runs.

        Raises:
            ResourceExhausted: The principal, or the process, holds its cap of streams.
        """
        counted = principal is not auth.LOCAL
        name = principal.name
        if counted and self.per_principal and self._held[name] >= self.per_principal:
            REFUSED.labels("per_principal").inc()
            raise ResourceExhausted(
                f"{method}: {name} already holds {self._held[name]} open streams on this "
                f"replica, the most one caller may ({self._principal_setting} = "
                f"{self.per_principal}): close some (e.g. other `pollux-cli logs -f`, "
                "`submit --follow` or watches) and try again"
            )
        if self.total and self._open >= self.total:
            REFUSED.labels("total").inc()
            raise ResourceExhausted(
                f"{method}: this replica holds {self._open} open streams, the most it serves "
                f"({self._total_setting} = {self.total}): try again later or another replica"
            )
        self._open += 1
        OPEN.inc()
        if counted:
            self._held[name] += 1
        try:
            yield
        finally:
            self._open -= 1
            OPEN.dec()
            if counted:
                self._held[name] -= 1
                if self._held[name] <= 0:
                    del self._held[name]
