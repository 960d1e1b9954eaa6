"""The core stays pure: pollux.goodput, .policy and .sim import no network or etcd code (R1)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PURE = ["pollux/goodput", "pollux/policy", "pollux/sim"]
FORBIDDEN = (
    "grpc",
    "aetcd",
    "etcd3",
    "pollux.v1",
    "pollux.scheduler",
    "pollux.agent",
    "pollux.launcher",
    "pollux.client",
    "google.protobuf",
    "torch",
    "structlog",
)


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def pure_files() -> list[Path]:
    return sorted(p for pkg in PURE if (ROOT / pkg).is_dir() for p in (ROOT / pkg).rglob("*.py"))


@pytest.mark.parametrize("path", pure_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_core_module_imports_no_io_layer(path):
    bad = {
        name
        for name in imported_modules(path)
        if any(name == f or name.startswith(f + ".") for f in FORBIDDEN)
    }
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_the_rule_sees_the_core_packages():
    assert len(pure_files()) >= 5
