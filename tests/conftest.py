"""Fixtures and tiers shared by every test.

Tiers follow the folders and are applied as markers, so `pytest -m unit` runs the fast maths
and policy tests, `-m integration` the real-etcd / real-gRPC ones, `-m e2e` the real processes.
One real etcd serves the whole session (it starts in well under a second); each test gets a
fresh key root, deleted afterwards, so tests never see each other's state.
"""

from __future__ import annotations

import hashlib
import logging
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import structlog

from pollux.service.store import Delete, Store
from tests import job_python
from tests.etcd_server import EtcdServer

TIERS = ("unit", "integration", "e2e")


def pytest_configure(config: pytest.Config) -> None:
    """As root, keep this checkout's temporary directories apart from other pytest sessions'.

    A root launcher's replicas run under their job's own uid and must traverse a test's
    tmp_path (`_replicas_reach_tmp_path`). pytest resets its shared /tmp/pytest-of-root to
    0700 whenever a session starts, which would cut off the replicas of a session running
    beside it (two checkouts tested at once); a temporary root of this checkout's own is
    touched by this checkout's sessions only.
    """
    del config
    if os.geteuid() != 0 or "PYTEST_DEBUG_TEMPROOT" in os.environ:
        return
    digest = hashlib.sha256(str(Path(__file__).resolve().parent).encode()).hexdigest()[:10]
    root = Path("/tmp") / f"pollux-tests-{digest}"
    root.mkdir(mode=0o711, exist_ok=True)
    info = root.lstat()
    if info.st_uid == 0 and not root.is_symlink():
        root.chmod(0o711)
        os.environ["PYTEST_DEBUG_TEMPROOT"] = str(root)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove the job environment `tests.job_python` made for the session's jobs, if any."""
    del session, exitstatus
    job_python.remove()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test with the tier of the folder it lives in."""
    tests = Path(__file__).parent
    for item in items:
        tier = item.path.relative_to(tests).parts[0]
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))


@pytest.fixture(autouse=True)
def _logging_restored() -> Iterator[None]:
    """Undo a test's logging set-up (a service entry point's `configure`) when it ends.

    `configure` points structlog and the root logger at the sys.stderr of the moment, which
    under capsys is a capture stream closed when the test ends: every later test that logs
    would fail with "I/O operation on closed file", depending on the order tests run in.
    """
    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        structlog.configure(**saved)
        structlog.contextvars.clear_contextvars()
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
        root.setLevel(level)


@pytest.fixture(autouse=True)
def _replicas_reach_tmp_path(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Let replicas, which run under their job's own uid, traverse to the test's tmp_path.

    pytest makes its temporary directories 0700; a root launcher's replicas are other users,
    and a test's job files and checkpoint root live there. Traversal only (0711): nothing of
    a test's is listed or readable through it that was not made readable itself.
    """
    if os.geteuid() != 0:
        return
    # Every directory between pytest's temporary root and tmp_path: with xdist workers that is
    # pytest-of-<user>/pytest-<n>/popen-gw<k>/<test>, not only the base and its parent.
    root = tmp_path_factory.getbasetemp()
    while root.parent.name.startswith(("pytest-", "popen-gw")):
        root = root.parent
    for directory in [root, *(p for p in tmp_path.parents if root in p.parents), tmp_path]:
        directory.chmod(directory.stat().st_mode & 0o7777 | 0o011)


CLIENT_ENV = ("POLLUX_CONTEXT", "POLLUX_SERVER", "POLLUX_CA", "POLLUX_TOKEN")


@pytest.fixture(autouse=True)
def _no_personal_cli_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the developer's own `pollux-cli` settings out of every test.

    `pollux-up` writes a context (its CA and token, made current) to ~/.config/pollux: a CLI
    call in a test would then speak TLS to the test's plaintext server and fail, depending on
    what was run on the machine before. Tests that want a config set POLLUX_CONFIG themselves.
    """
    monkeypatch.setenv("POLLUX_CONFIG", str(tmp_path / "no-pollux-config.toml"))
    for name in CLIENT_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def etcd() -> Iterator[EtcdServer]:
    """A real etcd on free loopback ports, for the whole session."""
    server = EtcdServer.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def root() -> str:
    """A key root of this test's own."""
    return f"/pollux-test/{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def store(etcd: EtcdServer, root: str) -> AsyncIterator[Store]:
    """A store under the test's root; everything under it is deleted afterwards."""
    store = await Store.connect(etcd.endpoint, root)
    try:
        yield store
    finally:
        await store.txn([Delete(root.encode() + b"/", prefix=True)])
        await store.close()
