#!/usr/bin/env bash
# The main job: a self-contained demo on a private PostgreSQL (installs what it needs).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
exec uv run --frozen tidemark demo "$@"
