"""The core stays pure: goodput, policy, sim, terminal, checks and the job-spec rules import no
network or etcd code (R1)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PURE = [
    "pollux/goodput",
    "pollux/policy",
    "pollux/sim",
    "pollux/terminal",
    "pollux/checks",
    "pollux/jobspec/__init__.py",  # the rules; jobspec/wire.py moves them to the API message
]
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
    paths = [ROOT / entry for entry in PURE]
    return sorted(p for path in paths for p in (path.rglob("*.py") if path.is_dir() else [path]))


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
def test_only_the_etcd_layer_talks_to_etcd(path):
    uses_etcd = any(n == "aetcd" or n.startswith("aetcd.") for n in imported_modules(path))
    assert not uses_etcd or path.parent == SERVICES / "common" / "pollux" / "service" / "etcd"


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


# Each distribution of the `pollux` namespace: (folder, the one import package it holds).
DISTRIBUTIONS = {
    ".": None,  # the core: pollux.checks, .goodput, .jobspec, .policy, .sim, .terminal, .train, .v1
    "services/common": "pollux.service",
    "services/scheduler": "pollux.scheduler",
    "services/agent": "pollux.agent",
    "services/launcher": "pollux.launcher",
    "client": "pollux.client",
}


def test_no_symlink_in_the_source_tree():
    links = [
        str(p.relative_to(ROOT))
        for top in ("pollux", "services", "client", "tests", "benchmarks", "scripts")
        for p in (ROOT / top).rglob("*")
        if p.is_symlink()
    ]
    assert not links, f"symlinks give one module two paths: {links}"


def test_pollux_is_a_namespace_package_with_no_init():
    for folder in DISTRIBUTIONS:
        assert not (ROOT / folder / "pollux" / "__init__.py").exists(), folder


@pytest.mark.parametrize("folder", [f for f, pkg in DISTRIBUTIONS.items() if pkg])
def test_each_distribution_holds_exactly_its_package(folder):
    base = ROOT / folder
    assert (base / "pyproject.toml").is_file()
    holds = sorted(p.name for p in (base / "pollux").iterdir() if p.is_dir() and p.name[0] != "_")
    assert [f"pollux.{name}" for name in holds] == [DISTRIBUTIONS[folder]]


@pytest.mark.parametrize("package", [pkg for pkg in DISTRIBUTIONS.values() if pkg])
def test_every_import_name_resolves_to_its_one_folder(package):
    import importlib

    module = importlib.import_module(package)
    folder = next(f for f, pkg in DISTRIBUTIONS.items() if pkg == package)
    expected = ROOT / folder / "pollux" / package.split(".")[1] / "__init__.py"
    assert Path(module.__file__ or "") == expected


KEY_CALLS = {"prefix", "name_of", "_key"}


@pytest.mark.parametrize(
    "path",
    sorted(p for p in SERVICES.rglob("*.py") if p.name != "keys.py"),
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_key_kinds_are_spelled_only_in_the_keys_module(path):
    spelled = [
        f"line {node.lineno}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in KEY_CALLS
        and any(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in node.args)
    ]
    assert not spelled, f"{path.relative_to(ROOT)} spells a key kind ({spelled}): use keys.Kind"


def test_replica_phase_is_typed_on_the_wire():
    from pollux.v1 import types_pb2 as pb

    field = pb.ReplicaStatus.DESCRIPTOR.fields_by_name["phase"]
    assert field.enum_type is not None
    assert field.enum_type.name == "ReplicaPhase"
    assert 5 not in {f.number for f in pb.ReplicaStatus.DESCRIPTOR.fields}  # the old string


def test_files_found_relative_to_the_source_tree_exist():
    # Paths computed from a module's location break silently when a folder moves.
    from pollux.service.local_cluster import DEMO_JOB
    from pollux.sim.traces import default_data_root

    assert DEMO_JOB.is_file(), DEMO_JOB
    assert (default_data_root() / "MD5SUMS").is_file()
