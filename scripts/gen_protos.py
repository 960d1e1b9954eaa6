"""Generate the committed Python code of `protos/pollux/v1/*.proto` into `pollux/v1/`.

The one way stubs are made: `grpc_tools.protoc` from the grpcio-tools pinned in
the dev extra, run from the repository root. The proto package `pollux.v1` equals the import
path, so the output needs no rewriting. `tests/unit/test_protos.py` regenerates into a
temporary directory and byte-compares, so a proto edit without regeneration fails the suite.

    python scripts/gen_protos.py [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"


def proto_files() -> list[Path]:
    """The .proto files, relative to `protos/`, in a stable order."""
    return sorted(p.relative_to(PROTO_ROOT) for p in (PROTO_ROOT / "pollux" / "v1").glob("*.proto"))


def generate(out: Path) -> None:
    """Write `pollux/v1/*_pb2.py`, `*_pb2.pyi` and `*_pb2_grpc.py` under `out`."""
    (out / "pollux" / "v1").mkdir(parents=True, exist_ok=True)
    include = resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *(str(p) for p in proto_files()),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    init = out / "pollux" / "v1" / "__init__.py"
    init.write_text('"""Generated protobuf and gRPC code of the pollux.v1 API (do not edit)."""\n')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT, help="directory holding pollux/")
    generate(parser.parse_args().out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
