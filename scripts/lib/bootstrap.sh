# shellcheck shell=bash
# Sourced by scripts/test and scripts/demo: makes .venv and installs Pollux (editable): the core
# distribution with the extras asked for, and the service and client distributions beside it
# (DISTRIBUTIONS), reinstalling only when a pyproject.toml or the extras change.
# Works on a fresh Debian machine that has nothing but python3 (≥ 3.11).
set -euo pipefail

POLLUX_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VENV="$POLLUX_ROOT/.venv"
PY=${PYTHON:-python3}
# Every distribution of the `pollux` namespace besides the core (docs/architecture.md §2).
DISTRIBUTIONS=(services/common services/scheduler services/agent services/launcher client)

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    echo "error: need root to run: $*" >&2; return 1; fi
}

apt_install() {
  # Installs Debian packages, running apt-get update once per boot of this script.
  if [ -z "${_POLLUX_APT_UPDATED:-}" ]; then
    as_root apt-get update -qq
    _POLLUX_APT_UPDATED=1
  fi
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "$@" >/dev/null
}

installed_covers() {
  # Whether the install recorded in stamp file $1 is of the same pyproject.toml and has every
  # extra that "$2" (hash [extras]) asks for, so that ./scripts/demo after ./scripts/test (or
  # the other way round) does not reinstall.
  local stamp=$1 want=$2 have extra
  [ -f "$stamp" ] || return 1
  have=$(cat "$stamp")
  [ "${have%% *}" = "${want%% *}" ] || return 1
  local wanted=${want#*[} installed=${have#*[}
  wanted=${wanted%]} installed=${installed%]}
  for extra in ${wanted//,/ }; do
    [[ ",$installed," == *",$extra,"* ]] || return 1
  done
}

ensure_venv() {
  local extras=$1
  if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "error: Pollux needs Python ≥ 3.11 as '$PY' (set PYTHON=/path/to/python3.11)" >&2
    return 1
  fi
  if [ ! -x "$VENV/bin/python" ]; then
    if ! "$PY" -m venv "$VENV" 2>/dev/null; then
      # Debian splits venv/ensurepip into python3-venv.
      rm -rf "$VENV"
      apt_install python3-venv
      "$PY" -m venv "$VENV"
    fi
  fi
  local want stamp="$VENV/.pollux-install"
  # The editable install maps each package it found: a package added since (a new directory
  # with an __init__.py) must reinstall, or processes started outside the checkout miss it.
  want="$(cd "$POLLUX_ROOT" && {
    cat pyproject.toml "${DISTRIBUTIONS[@]/%//pyproject.toml}"
    find pollux "${DISTRIBUTIONS[@]}" -name __init__.py -not -path '*/.*' | LC_ALL=C sort
  } | sha256sum | cut -c1-16) [$extras]"
  if ! installed_covers "$stamp" "$want"; then
    local target="$POLLUX_ROOT"
    [ -n "$extras" ] && target="$POLLUX_ROOT[$extras]"
    echo "==> installing pollux${extras:+[$extras]} into .venv" >&2
    if [[ ",$extras," == *",train,"* ]]; then
      # Exactly this version first: pip then takes the CPU build where the machine provides
      # one, and the train extra's range (which 2.13.0 satisfies) installs nothing more.
      "$VENV/bin/python" -m pip install -q --disable-pip-version-check "torch==2.13.0"
    fi
    local editables=(-e "$target")
    for dist in "${DISTRIBUTIONS[@]}"; do editables+=(-e "$POLLUX_ROOT/$dist"); done
    # A checkout made before the services became distributions of their own had one "pollux"
    # holding everything; pip replaces it in place.
    # Compiled at install (pip's default), not at first import: replicas run under job uids
    # that may not write the environment's __pycache__, and would compile torch every start.
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${editables[@]}"
    echo "$want" >"$stamp"
  fi
}

ensure_zsh() {
  # pollux-cli's zsh completion is tested in a real zsh (tests/unit/test_cli_completion.py).
  # Best effort: without zsh those tests are skipped and the rest of the suite still runs.
  command -v zsh >/dev/null && return 0
  echo "==> installing zsh (Debian package) for the shell completion tests" >&2
  apt_install zsh || echo "warning: zsh not installed; its completion tests are skipped" >&2
}

ensure_etcd() {
  # The control plane keeps its state in etcd; tests and the local cluster run a real one.
  if ! command -v etcd >/dev/null; then
    echo "==> installing etcd-server (Debian package)" >&2
    apt_install etcd-server
  fi
  if ! etcd --version >/dev/null 2>&1; then
    echo "error: etcd is not runnable after installing etcd-server; the tests need it" >&2
    return 1
  fi
}

ensure_chromium() {
  # The dashboard's browser test (tests/e2e/test_dashboard_browser.py) renders its pages in
  # Debian's headless Chromium; without it that test skips, saying why. Best effort: a
  # machine that cannot install it still runs every other test.
  if ! command -v chromium >/dev/null; then
    echo "==> installing chromium (Debian package) for the dashboard's browser test" >&2
    apt_install chromium || echo "warning: chromium not installed; the browser test will skip" >&2
  fi
}

BUF_VERSION=1.75.0
# The buf that lints protos/ and checks breaking changes (protos/buf.yaml): npm's
# @bufbuild/buf, as buf's install docs give it, pinned so that every machine lints alike.

ensure_buf() {
  # tests/unit/test_protos.py runs `buf lint` and `buf breaking` with the buf installed here,
  # in .venv/buf (it goes with the venv). Best effort: without it those tests skip, saying
  # why, and scripts/proto_contract.py's pure-Python check still guards the contract.
  local buf="$VENV/buf/node_modules/.bin/buf"
  if [ -x "$buf" ] && [ "$("$buf" --version 2>/dev/null)" = "$BUF_VERSION" ]; then
    return 0
  fi
  if ! command -v npm >/dev/null; then
    echo "==> installing npm (Debian package) for buf" >&2
    if ! apt_install nodejs npm; then
      echo "warning: npm not installed; the buf tests will skip" >&2
      return 0
    fi
  fi
  echo "==> installing buf $BUF_VERSION (npm @bufbuild/buf) into .venv/buf" >&2
  mkdir -p "$VENV/buf"
  if ! npm install --prefix "$VENV/buf" --no-audit --no-fund --loglevel=error \
    "@bufbuild/buf@$BUF_VERSION" >/dev/null; then
    echo "warning: buf not installed; the buf tests will skip" >&2
  fi
}
