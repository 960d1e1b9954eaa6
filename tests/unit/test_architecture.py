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
    "pollux.service",
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


SERVICES = ROOT / "services"


@pytest.mark.parametrize(
    "path", sorted(SERVICES.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT))
)
def test_only_the_store_talks_to_etcd(path):
    uses_etcd = any(n == "aetcd" or n.startswith("aetcd.") for n in imported_modules(path))
    assert not uses_etcd or path == SERVICES / "common" / "store.py"


@pytest.mark.parametrize(
    "path",
    sorted((ROOT / "pollux" / "train").rglob("*.py")),
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_training_library_has_no_control_plane_imports(path):
    bad = {
        name
        for name in imported_modules(path)
        if any(
            name == f or name.startswith(f + ".")
            for f in ("aetcd", "pollux.scheduler", "pollux.service", "pollux.launcher")
        )
    }
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_every_package_directory_is_an_installed_package():
    from setuptools import find_packages

    found = set(find_packages(str(ROOT), include=["pollux*"]))
    assert {
        "pollux.scheduler",
        "pollux.agent",
        "pollux.launcher",
        "pollux.client",
        "pollux.service",
        "pollux.v1",
    } <= found
