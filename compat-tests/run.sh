#!/usr/bin/env bash
# The project's test command (README.md "Run the tests"; .ci/run calls it).
# Installs what the tests need, builds once, runs every suite with bounded time.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "toolchain"
cargo --version
rustc --version

step "format and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings

step "workspace tests (unit, proptest, recovery, SIGKILL crash, retention, binary)"
# Each suite stops itself; the timeout only guards against a hang.
timeout 1200 cargo test --workspace --locked

# Third-party client suites (compat-tests/<ecosystem>/) join here as the
# protocol listeners land; each installs its own clients (venv, npm, apt).
for suite in compat-tests/*/run.sh; do
  [[ -e $suite ]] || continue
  step "compat suite $suite"
  timeout 1800 bash "$suite"
done
