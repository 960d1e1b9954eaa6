#!/usr/bin/env bash
# Runs benchmarks/gpu_check.py on a lent GPU machine, from the repository root, with the
# bundle scripts/gpu_check_bundle.sh made (.gpu/, carried along): installs its wheels into
# /tmp/site (grpcio and protobuf too where the machine's are too old for pollux.v1), puts its
# etcd first on PATH, runs Pollux from the checkout (PYTHONPATH) and writes the check's log
# and JSON summary under $OUT. Exits with the check's status.
#
#   OUT=/tmp/out scripts/gpu_check_device.sh [gpu_check.py options]
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUNDLE=${BUNDLE:-$ROOT/.gpu}
OUT=${OUT:-/tmp/gpu_check_out}
SITE=${SITE:-/tmp/site}
mkdir -p "$OUT"

# The first Python with torch: $PYTHON, python3, or the lent machine's torch environment.
PY=
for candidate in ${PYTHON:-} python3 /opt/torch/.venv/bin/python3; do
  if command -v "$candidate" >/dev/null && "$candidate" -c 'import torch' 2>/dev/null; then
    PY=$(command -v "$candidate")
    break
  fi
done
if [ -z "$PY" ]; then
  echo "error: no Python with torch (set PYTHON=/path/to/python3)" | tee "$OUT/gpu_check.log" >&2
  exit 1
fi

# pollux is one namespace package over six folders (scripts/lib/bootstrap.sh DISTRIBUTIONS).
SOURCES=$ROOT:$ROOT/services/common:$ROOT/services/scheduler:$ROOT/services/agent
SOURCES=$SOURCES:$ROOT/services/launcher:$ROOT/client

install_wheels() {
  local wheels=("$BUNDLE"/whl/*.whl)
  # The generated pollux.v1 code checks the grpcio and protobuf it runs with at import.
  if ! PYTHONPATH=$SOURCES "$PY" -c 'import pollux.v1.scheduler_service_pb2_grpc' 2>/dev/null; then
    echo "==> this grpcio/protobuf cannot import pollux.v1: installing the bundle's" >&2
    wheels+=("$BUNDLE"/whl-fallback/*.whl)
  fi
  rm -rf "$SITE"
  if "$PY" -m pip --version >/dev/null 2>&1; then
    "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile \
      --no-cache-dir --target "$SITE" "${wheels[@]}"
  else  # an environment without pip: a wheel is a zip of the site-packages tree
    echo "==> no pip: unpacking the wheels" >&2
    "$PY" - "$SITE" "${wheels[@]}" <<'EOF'
import shutil
import sys
import zipfile
from pathlib import Path

site = Path(sys.argv[1])
for wheel in sys.argv[2:]:
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
for data in site.glob("*.data"):
    for kind in ("purelib", "platlib"):
        if (data / kind).is_dir():
            shutil.copytree(data / kind, site, dirs_exist_ok=True)
    shutil.rmtree(data)
EOF
  fi
}

main() {
  echo "==> $(hostname) $(date -u +%FT%TZ); $("$PY" --version 2>&1) at $(command -v "$PY")"
  nvidia-smi -L 2>&1 || echo "(no nvidia-smi)"
  install_wheels
  chmod +x "$BUNDLE/bin/etcd"
  export PATH=$BUNDLE/bin:$PATH
  export PYTHONPATH=$SITE:$SOURCES${PYTHONPATH:+:$PYTHONPATH}
  export PYTHONUNBUFFERED=1
  "$PY" - <<'EOF'
import importlib.metadata as md

for name in ("torch", "numpy", "scipy", "grpcio", "protobuf", "structlog", "aetcd", "cryptography"):
    try:
        print(f"    {name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"    {name} missing")
EOF
  echo "==> etcd: $(etcd --version | head -1)"
  cd "$ROOT"
  "$PY" benchmarks/gpu_check.py --out "$OUT/gpu_check.json" --logs "$OUT/logs" "$@"
}

main "$@" 2>&1 | tee "$OUT/gpu_check.log"
