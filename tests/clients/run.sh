#!/usr/bin/env bash
# Runs the client tests against the test build of the server given as $1 (lilac_test_server: lilac
# plus the test-only `serve --scripted`); installs the locked npm packages first when
# node_modules is missing or older than package-lock.json.
set -euo pipefail
cd "$(dirname "$0")"
export LILAC_BINARY="${1:?usage: run.sh path/to/lilac_test_server}"
if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --no-audit --no-fund --loglevel=error
fi
# One file at a time: the load test measures the server, not the other tests.
if node --help | grep -q -- --test-concurrency; then
  exec node --test --test-concurrency=1 ./*.test.mjs
fi
exec node --test ./*.test.mjs
