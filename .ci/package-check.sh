#!/usr/bin/env bash
# The package as a user gets it: `npm pack`, the tarball installed into a project made by
# `npm init -y` and the README's Quick start followed line by line (ESM, `npx pgasynq migrate`),
# the README's tasks.ts, producer.ts and worker.ts typechecked there (strict, skipLibCheck off)
# and run against PostgreSQL; then `require('pgasynq')` from a CommonJS project.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
admin_url=${PACKAGE_CHECK_ADMIN_URL:-postgres://postgres@127.0.0.1:5432/postgres}
database=pgasynq_package_check
export DATABASE_URL=${admin_url%/*}/$database
scratch=$(mktemp -d)
worker=
cleanup() {
  [ -n "$worker" ] && kill "$worker" 2>/dev/null || true
  rm -rf "$scratch"
}
trap cleanup EXIT
quiet() { npm "$@" --no-audit --no-fund --loglevel=error >/dev/null; }

tarball="$scratch/$(npm pack --silent --pack-destination "$scratch" | tail -n 1)"
echo "package: $(tar -tzf "$tarball" | wc -l) files, $(stat -c %s "$tarball") bytes packed"

psql "$admin_url" -q -v ON_ERROR_STOP=1 -c "DROP DATABASE IF EXISTS $database" -c "CREATE DATABASE $database" >/dev/null

mkdir "$scratch/esm" && cd "$scratch/esm"
npm init -y >/dev/null && npm pkg set type=module
quiet install "$tarball"
quiet install -D tsx "typescript@$(node -p "require('$repo/node_modules/typescript/package.json').version")"
node "$repo/.ci/readme-files.mjs" "$repo/README.md" .
cat > tsconfig.json <<'JSON'
{ "compilerOptions": { "strict": true, "module": "nodenext", "target": "es2022", "skipLibCheck": false, "noEmit": true }, "include": ["*.ts"] }
JSON
npx tsc -p .
echo "README's code typechecks against the package"
# Every declaration file shipped, not just those the README reaches: none may refer to a
# declaration that stripInternal removed.
cat > tsconfig.dts.json <<'JSON'
{ "compilerOptions": { "strict": true, "module": "nodenext", "target": "es2022", "skipLibCheck": false, "noEmit": true }, "include": ["node_modules/pgasynq/dist/**/*.d.ts"] }
JSON
npx tsc -p tsconfig.dts.json
echo "every shipped .d.ts typechecks"
npx pgasynq migrate

# tsx itself, not through npx: npx dies of the SIGTERM instead of waiting for the graceful exit.
./node_modules/.bin/tsx worker.ts >worker.out 2>worker.err &
worker=$!
npx tsx producer.ts
for _ in $(seq 1 120); do grep -q 'sent a welcome email to ada@example.com' worker.out && break; sleep 0.5; done
kill -TERM "$worker"
wait "$worker" || { echo "worker exited with $?"; cat worker.out worker.err; exit 1; }
worker=
grep -q 'sent a welcome email to ada@example.com' worker.out || { echo 'the worker never ran the task'; cat worker.out worker.err; exit 1; }
grep -q '"level":30' worker.err || { echo 'the worker logged nothing at info'; cat worker.err; exit 1; }
npx pgasynq stats
echo "README's producer and worker ran, and the worker shut down gracefully"

mkdir "$scratch/cjs" && cd "$scratch/cjs"
npm init -y >/dev/null
quiet install "$tarball"
node -e "
const { Client, Server, Task, migrate } = require('pgasynq');
if (typeof Client !== 'function' || typeof Server !== 'function' || typeof migrate !== 'function') throw new Error('require(pgasynq) lacks its exports');
console.log('require(\"pgasynq\") works from CommonJS:', new Task('t', { a: 1 }).type);
"
psql "$admin_url" -q -c "DROP DATABASE IF EXISTS $database" >/dev/null
