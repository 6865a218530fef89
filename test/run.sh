#!/usr/bin/env bash
# Runs every test file against the PostgreSQL in DATABASE_URL
# (default postgres://postgres@127.0.0.1:5432/test), each file in its own schema.
set -euo pipefail
cd "$(dirname "$0")/.."
files=(test/*.test.ts)
exec node --import tsx --test --test-concurrency=4 --test-timeout=120000 "${files[@]}"
