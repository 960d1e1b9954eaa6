"""The committed pollux/v1 code is exactly what scripts/gen_protos.py makes from protos/."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "pollux" / "v1"


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--out", str(tmp_path)],
        check=True,
    )
    fresh = {p.name: p.read_bytes() for p in (tmp_path / "pollux" / "v1").iterdir()}
    committed = {p.name: p.read_bytes() for p in GENERATED.iterdir() if p.is_file()}
    assert sorted(fresh) == sorted(committed), "run scripts/gen_protos.py and commit pollux/v1"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"stale generated files {stale}: run scripts/gen_protos.py"


@pytest.mark.parametrize(
    "module",
    sorted(p.stem for p in GENERATED.glob("*_pb2*.py")),
)
def test_every_generated_module_imports(module: str) -> None:
    importlib.import_module(f"pollux.v1.{module}")


def test_every_enum_has_an_unspecified_zero() -> None:
    from pollux.v1 import types_pb2

    for enum in types_pb2.DESCRIPTOR.enum_types_by_name.values():
        assert enum.values[0].number == 0
        assert enum.values[0].name.endswith("_UNSPECIFIED"), enum.name
