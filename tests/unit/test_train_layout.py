"""The training library and the client stay apart: no torch in the client, no gRPC at import."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_architecture import imported_modules

ROOT = Path(__file__).resolve().parents[2]


def offending(folder: Path, forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    found = {}
    for path in sorted(folder.rglob("*.py")):
        bad = sorted(
            n
            for n in imported_modules(path)
            if any(n == f or n.startswith(f + ".") for f in forbidden)
        )
        if bad:
            found[str(path.relative_to(ROOT))] = bad
    return found


def test_the_client_imports_neither_torch_nor_the_training_library():
    assert offending(ROOT / "client" / "pollux", ("torch", "pollux.train")) == {}


def test_the_training_library_imports_nothing_from_the_client():
    assert offending(ROOT / "pollux" / "train", ("pollux.client",)) == {}


def test_importing_the_training_library_loads_no_grpc():
    pytest.importorskip("torch")
    code = (
        "import sys, pollux.train, pollux.train.trainer; "
        "loaded = sorted(m for m in sys.modules if m == 'grpc' or m.startswith(('grpc.', "
        "'pollux.train.agent_link', 'pollux.v1'))); print(loaded); assert not loaded"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
