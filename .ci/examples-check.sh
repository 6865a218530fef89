#!/usr/bin/env bash
# The examples in examples/, checked as a user would take them. First typechecked twice with the
# root tsconfig.json's options: with its paths, 'pgasynq' resolving to src/ (what `npm run
# typecheck` and ESLint see), and without them, 'pgasynq' resolving through the package's
# self-reference to dist/ (the built declarations a user's copy compiles against; `npm ci` builds
# them). Then every example that ends by itself is run (http-app.ts with --smoke: it places its
# orders, waits for their confirmations and exits; without it, it serves until Ctrl-C), each
# with a timeout, as its header says to run it: `npx tsx examples/NAME.ts` from the repository
# root. Fails if a typecheck fails or an example exits non-zero or times out.
#
# They run on PostgreSQL, in a database this script creates and drops, so a test run beside it
# on the same server is not disturbed (the examples keep their tasks in schema "examples").
# EXAMPLES_CHECK_ADMIN_URL: a database to connect to for CREATE DATABASE (default: DATABASE_URL's
# server, else postgres on 127.0.0.1:5432). EXAMPLES_CHECK_TIMEOUT: seconds per example (60).
set -euo pipefail
cd "$(dirname "$0")/.."
admin_url=${EXAMPLES_CHECK_ADMIN_URL:-${DATABASE_URL:+${DATABASE_URL%/*}/postgres}}
admin_url=${admin_url:-postgres://postgres@127.0.0.1:5432/postgres}
database="pgasynq_examples_$$_$RANDOM"
limit=${EXAMPLES_CHECK_TIMEOUT:-60}
export DATABASE_URL=${admin_url%/*}/$database
# PGASYNQ_EMBEDDED=1 would put connect.ts on the embedded database instead.
unset PGASYNQ_EMBEDDED
scratch=$(mktemp -d)
out=$scratch/out
created=
cleanup() {
  rm -rf "$scratch"
  [ -z "$created" ] || psql "$admin_url" -q -c "DROP DATABASE IF EXISTS $database WITH (FORCE)" >/dev/null || true
}
trap cleanup EXIT

# A tsconfig outside the repository that extends the root one and includes only examples/ (the
# root one includes bench/, whose peers' adapters need bench's own install). typeRoots is given
# because the default is looked up from the tsconfig's own directory.
[ -f dist/index.d.ts ] || { echo "dist/ is missing: npm run build (npm ci runs it)"; exit 1; }
for against in src dist; do
  paths=
  [ "$against" = dist ] && paths=', "paths": {}'
  cat >"$scratch/tsconfig.json" <<JSON
{ "extends": "$PWD/tsconfig.json", "compilerOptions": { "noEmit": true, "typeRoots": ["$PWD/node_modules/@types"]$paths }, "include": ["$PWD/examples"] }
JSON
  ./node_modules/.bin/tsc -p "$scratch/tsconfig.json" || { echo "examples/ does not typecheck against $against/ ('pgasynq' resolved there)"; exit 1; }
  echo "examples/ typechecks against $against/"
done

created=1
psql "$admin_url" -q -v ON_ERROR_STOP=1 -c "CREATE DATABASE $database" >/dev/null

failed=()
for example in 'worker.ts' 'cron.ts' 'fan-in.ts' 'http-app.ts --smoke'; do
  start=$SECONDS
  # shellcheck disable=SC2086 # the example's arguments are meant to split
  if timeout --kill-after=10 "$limit" ./node_modules/.bin/tsx examples/$example >"$out" 2>&1; then
    echo "ok   examples/$example ($((SECONDS - start)) s): $(tail -n 1 "$out")"
  else
    code=$?
    [ "$code" -eq 124 ] && why="timed out after $limit s" || why="exit $code"
    echo "FAIL examples/$example ($why); its output:"
    sed 's/^/  | /' "$out"
    failed+=("$example")
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "examples that failed: ${failed[*]}"
  exit 1
fi
echo "every example ran to its end against PostgreSQL"
