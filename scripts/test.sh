#!/usr/bin/env bash
# The whole test suite: unit tests, and integration tests on a private PostgreSQL that
# the fixtures start (installs what it needs first).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
exec uv run --frozen pytest "$@"
