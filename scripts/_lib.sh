# Shared by scripts/run, scripts/test, scripts/check and scripts/bench: find Python >= 3.12 and keep .venv current.
# shellcheck shell=bash

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RECEIPT_PROXY_VENV:-$ROOT/.venv}"

python_ok() {  # python_ok CMD: CMD runs and is Python >= 3.12
  "$@" -c 'import sys, venv; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1
}

find_python() {
  local c v
  if [ -n "${PYTHON:-}" ]; then
    python_ok "$PYTHON" && { echo "$PYTHON"; return; }
    echo "error: \$PYTHON=$PYTHON is not a working Python >= 3.12 (with the venv module)" >&2
    return 1
  fi
  for c in python3.14 python3.13 python3.12 python3 python; do
    if command -v "$c" >/dev/null 2>&1 && python_ok "$c"; then echo "$(command -v "$c")"; return; fi
  done
  if command -v pyenv >/dev/null 2>&1; then  # pyenv installs that no shim selects
    for v in $(pyenv versions --bare 2>/dev/null | sort -rV); do
      c="$(pyenv root)/versions/$v/bin/python3"
      if [ -x "$c" ] && python_ok "$c"; then echo "$c"; return; fi
    done
  fi
  for c in /usr/local/bin/python3.1[2-9] /usr/bin/python3.1[2-9] /opt/homebrew/bin/python3.1[2-9]; do
    if [ -x "$c" ] && python_ok "$c"; then echo "$c"; return; fi
  done
  {
    echo "error: receipt-proxy needs Python 3.12 or newer, with the venv module, and none was found."
    echo "  looked at: \$PYTHON, python3.14 … python3, pyenv versions, /usr/local/bin, /usr/bin"
    echo "  install one (e.g. 'apt-get install python3.12 python3.12-venv', 'brew install python@3.12',"
    echo "  or 'pyenv install 3.12'), or point PYTHON at it: PYTHON=/path/to/python3.12 $0"
  } >&2
  return 1
}

# stamp_covers STAMP HASH EXTRAS: STAMP records an install, for this pyproject.toml HASH, whose extras include
# every one in the comma-separated EXTRAS (an install of .[test,check] satisfies "test" and "", .[test] satisfies "").
stamp_covers() {
  local stamp="$1" hash="$2" extras="$3" h spec have e ok
  [ -f "$stamp" ] || return 1
  while read -r h spec; do
    [ "$h" = "$hash" ] || continue
    have="${spec#.}"; have="${have#[}"; have="${have%]}"
    ok=1
    for e in ${extras//,/ }; do
      case ",$have," in *",$e,"*) ;; *) ok=0; break ;; esac
    done
    [ "$ok" = 1 ] && return 0
  done < "$stamp"
  return 1
}

# ensure_venv [EXTRAS]: create .venv if needed and (re)install the project when pyproject.toml changed.
# EXTRAS is a comma-separated list of optional-dependency groups, e.g. "test" or "test,check".
ensure_venv() {
  local extras="${1:-}" spec="." stamp hash py
  extras="${extras// /}"
  [ -n "$extras" ] && spec=".[$extras]"
  if [ ! -x "$VENV/bin/python" ] || ! python_ok "$VENV/bin/python"; then
    py="$(find_python)" || exit 1
    echo "creating $VENV with $py ($("$py" -V 2>&1))" >&2
    rm -rf "$VENV"
    "$py" -m venv "$VENV" || { echo "error: '$py -m venv' failed; install the venv module (e.g. python3.12-venv)" >&2; exit 1; }
  fi
  stamp="$VENV/.receipt-proxy-installed"
  hash="$(sha256sum < "$ROOT/pyproject.toml" | cut -c1-16)"
  if ! stamp_covers "$stamp" "$hash" "$extras"; then
    echo "installing receipt-proxy$([ -n "$extras" ] && echo " with [$extras]") into $VENV ..." >&2
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e "$ROOT$([ -n "$extras" ] && echo "[$extras]")" >&2 \
      || { echo "error: pip install failed (see above)" >&2; exit 1; }
    echo "$hash $spec" >> "$stamp"
  fi
}
