#!/usr/bin/env bash
# The Python of the compat suites must at least name only what exists: a
# missing import fails a whole module at collection, which a run that skips
# that module would not notice. pyflakes, undefined names and syntax only.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
venv="$root/target/compat-venv"
[[ -x $venv/bin/python ]] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check pyflakes==3.4.0
out=$("$venv/bin/python" -m pyflakes "$here" 2>&1 || true)
bad=$(grep -E "undefined name|invalid syntax|SyntaxError|unexpected indent" <<<"$out" || true)
if [[ -n $bad ]]; then
  echo "$bad"
  exit 1
fi
echo "compat-tests: no undefined names"
