"""Fixtures of the pollux-cli unit tests: no user configuration, and no server to reach."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pollux.client.types import Job, JobSpec


@pytest.fixture
def no_user_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the user's own config file and POLLUX_* variables out of a test."""
    for name in ("POLLUX_SERVER", "POLLUX_CONTEXT", "POLLUX_CA", "POLLUX_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("POLLUX_CONFIG", str(tmp_path / "config.toml"))


class NeverSubmit:
    """A client the CLI must not reach: a bad spec is refused before it is sent."""

    def __enter__(self) -> NeverSubmit:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def submit(self, spec: JobSpec, *, request_id: str | None = None) -> Job:
        raise AssertionError("an invalid spec must not be submitted")


@pytest.fixture
def never_submit() -> Callable[[argparse.Namespace], Any]:
    """`cli.main`'s ``connect`` for a command that must fail before submitting."""
    return lambda args: NeverSubmit()
