#!/usr/bin/env bash
# Prepares .gpu/ for benchmarks/gpu_check.py on a lent GPU machine that has Python, torch,
# numpy, scipy, grpcio, protobuf and pyyaml but no internet, no etcd and not every runtime
# dependency of Pollux: this machine's etcd binary (bin/), wheels of the missing dependencies
# (whl/), and wheels of grpcio and protobuf (whl-fallback/), which scripts/gpu_check_device.sh
# installs only where the machine's own are too old for the generated pollux.v1 code. Pollux
# itself runs from the checkout (PYTHONPATH). Versions are .venv's, the ones the tests use.
#
#   scripts/gpu_check_bundle.sh            # cp312 manylinux x86_64 wheels into .gpu/
#   PYVER=3.11 BUNDLE=/tmp/gpu311 scripts/gpu_check_bundle.sh   # another Python, elsewhere
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUNDLE=${BUNDLE:-$ROOT/.gpu}
PYVER=${PYVER:-3.12}
PY=${PYTHON:-python3}
VERSIONS_FROM=${VERSIONS_FROM:-$ROOT/.venv/bin/python}

# Runtime dependencies of the six distributions (pyproject.toml, services/*/pyproject.toml,
# client/pyproject.toml) and theirs, less what the machine has (numpy, scipy, grpcio,
# protobuf, pyyaml, torch): services/common's grpcio-* extras, aetcd, prometheus-client,
# structlog, cryptography (with cffi, pycparser); grpcio-status's googleapis-common-protos;
# typing-extensions, which grpcio imports (torch brings an older one).
MISSING=(structlog aetcd grpcio-health-checking grpcio-reflection grpcio-status
  googleapis-common-protos prometheus-client cryptography cffi pycparser typing-extensions)
FALLBACK=(grpcio protobuf)

if [ -x "$VERSIONS_FROM" ]; then
  pins() {
    "$VERSIONS_FROM" - "$@" <<'EOF'
import importlib.metadata as md
import sys

for name in sys.argv[1:]:
    print(f"{name}=={md.version(name)}")
EOF
  }
else
  echo "error: $VERSIONS_FROM not found: run ./scripts/test once to make .venv" >&2
  exit 1
fi

download() {
  local dest=$1
  shift
  "$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version "$PYVER" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d "$dest" "$@"
}

rm -rf "$BUNDLE/bin" "$BUNDLE/whl" "$BUNDLE/whl-fallback"
mkdir -p "$BUNDLE/bin" "$BUNDLE/whl" "$BUNDLE/whl-fallback"

etcd=$(command -v etcd || true)
if [ -z "$etcd" ]; then
  echo "error: no etcd here to copy (apt-get install etcd-server)" >&2
  exit 1
fi
cp "$etcd" "$BUNDLE/bin/etcd"
chmod 755 "$BUNDLE/bin/etcd"

mapfile -t wanted < <(pins "${MISSING[@]}")
mapfile -t fallback < <(pins "${FALLBACK[@]}")
echo "==> wheels for cp${PYVER/./} manylinux x86_64: ${wanted[*]}" >&2
download "$BUNDLE/whl" "${wanted[@]}"
echo "==> fallback wheels: ${fallback[*]}" >&2
download "$BUNDLE/whl-fallback" "${fallback[@]}"

# Keep the bundle out of git without touching .gitignore (another checkout's business).
if [ "$BUNDLE" = "$ROOT/.gpu" ]; then
  exclude=$(cd "$ROOT" && git rev-parse --git-path info/exclude)
  case $exclude in /*) ;; *) exclude=$ROOT/$exclude ;; esac
  mkdir -p "$(dirname "$exclude")"
  grep -qxF '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >>"$exclude"
fi

ls -l "$BUNDLE/bin" "$BUNDLE/whl" "$BUNDLE/whl-fallback" >&2
echo "==> $BUNDLE: $(du -sh "$BUNDLE" | cut -f1)" >&2
