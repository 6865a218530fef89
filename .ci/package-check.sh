#!/usr/bin/env bash
# The package as a user gets it: `npm pack`, the tarball installed into a project made by
# `npm init -y` and the Getting started page followed line by line (ESM, `npx pgasynq migrate`),
# every code block of the README and docs/guide typechecked there (strict, skipLibCheck off; see
# readme-files.mjs for named blocks, fragments and another package's code), and the README's
# hello.ts, Getting started's producer.ts and worker.ts and the testing guide's welcome.test.ts
# run against PostgreSQL; then `require('pgasynq')` from a CommonJS project; then, for each
# Kysely minor the peer range admits (the newest 0.27, 0.28 and the registry's latest), a project
# on that Kysely that enqueues in its own Kysely transaction and runs a handler's ctx.transaction
# typed by its tables (.ci/package/kysely.ts), plus a .cts file under nodenext (.ci/package/check.cts).
#
# PACKAGE_CHECK_ADMIN_URL: a database to connect to for CREATE DATABASE (default: postgres on
# 127.0.0.1:5432). PACKAGE_CHECK_DATABASE: the database it creates and drops (default
# pgasynq_package_check); give each checkout that runs this at the same time its own.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
admin_url=${PACKAGE_CHECK_ADMIN_URL:-postgres://postgres@127.0.0.1:5432/postgres}
database=${PACKAGE_CHECK_DATABASE:-pgasynq_package_check}
export DATABASE_URL=${admin_url%/*}/$database
scratch=$(mktemp -d)
worker=
cleanup() {
  [ -n "$worker" ] && kill "$worker" 2>/dev/null || true
  rm -rf "$scratch"
}
trap cleanup EXIT
quiet() { npm "$@" --no-audit --no-fund --loglevel=error >/dev/null; }
typescript="typescript@$(node -p "require('$repo/node_modules/typescript/package.json').version")"
# The @types/node of the Node this runs on, as Getting started tells TypeScript users to pick.
node_major=$(node -p 'process.versions.node.split(".")[0]')
types_node="@types/node@$node_major"
# Every version of @types/node in the current project's node_modules, nested ones included.
types_node_versions() { find "$PWD/node_modules" -path '*/@types/node/package.json' -exec node -p 'require(process.argv[1]).version' {} \; | sort -u | xargs; }

tarball="$scratch/$(npm pack --silent --pack-destination "$scratch" | tail -n 1)"
echo "package: $(tar -tzf "$tarball" | wc -l) files, $(stat -c %s "$tarball") bytes packed"
# The manifest a user installs: no lifecycle scripts (npm would list the package among those
# with install scripts) and no contributor scripts or devDependencies.
tar -xzOf "$tarball" package/package.json | node -e "
const m = JSON.parse(require('fs').readFileSync(0, 'utf8'));
for (const key of ['scripts', 'devDependencies']) if (key in m) throw new Error('the packed package.json has ' + key + ': ' + JSON.stringify(m[key]));
"
echo "the packed package.json has no scripts and no devDependencies"
tar -tzf "$tarball" | grep -x 'package/CHANGELOG.md' >/dev/null || { echo "the package lacks CHANGELOG.md"; exit 1; }
echo "the package ships CHANGELOG.md"

psql "$admin_url" -q -v ON_ERROR_STOP=1 -c "DROP DATABASE IF EXISTS $database" -c "CREATE DATABASE $database" >/dev/null

mkdir "$scratch/esm" && cd "$scratch/esm"
npm init -y >/dev/null && npm pkg set type=module
quiet install "$tarball"
# A project without @types/node gets none from pgasynq: the TypeScript user picks their Node's.
[ -z "$(types_node_versions)" ] || { echo "installing pgasynq brought @types/node $(types_node_versions)"; npm ls --all @types/node; exit 1; }
echo "installing pgasynq installs no @types/node"
# What Getting started asks of TypeScript users: @types/node for their Node, and @types/pg.
quiet install -D tsx "$typescript" "$types_node" @types/pg
for v in $(types_node_versions); do
  [[ $v == "$node_major".* ]] || { echo "@types/node $v installed besides the one picked:"; npm ls --all @types/node; exit 1; }
done
echo "with $types_node and @types/pg, the only @types/node is the one picked: $(types_node_versions)"
node "$repo/.ci/readme-files.mjs" . "$repo/README.md" "$repo"/docs/guide/*.md
# What the unnamed fragments take as given (client, ctx, db, …).
cp "$repo/.ci/package/fragments.d.ts" .
cat > tsconfig.json <<'JSON'
{ "compilerOptions": { "strict": true, "module": "nodenext", "target": "es2022", "skipLibCheck": false, "noEmit": true }, "include": ["*.ts"] }
JSON
npx tsc -p .
echo "the code blocks of the README and docs/guide, named files and fragments, typecheck against the package"
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
echo "Getting started's producer and worker ran, and the worker shut down gracefully"
# The README's worker in 20 lines, in one process.
./node_modules/.bin/tsx hello.ts | tee hello.out
grep -q 'completed { sent: true }' hello.out || { echo "hello.ts did not complete its task"; exit 1; }
# The guides' programs: the one that ends by itself runs to the end; each worker starts, logs
# that it started, and shuts down gracefully on SIGTERM (exit 0).
./node_modules/.bin/tsx from-bullmq.ts
for program in exactly-once.ts retries.ts production-worker.ts from-asynq.ts from-graphile-worker.ts from-pg-boss.ts; do
  ./node_modules/.bin/tsx "$program" >"$program.out" 2>"$program.err" &
  worker=$!
  for _ in $(seq 1 120); do grep -q '"msg":"server started"' "$program.err" && break; sleep 0.5; done
  grep -q '"msg":"server started"' "$program.err" || { echo "$program never started"; cat "$program.out" "$program.err"; exit 1; }
  kill -TERM "$worker"
  wait "$worker" || { echo "$program exited with $?"; cat "$program.out" "$program.err"; exit 1; }
  worker=
  echo "$program started and shut down gracefully"
done
# The testing guide's test file, on pgasynq/testing: a schema of its own on DATABASE_URL, dropped after.
start=$SECONDS
./node_modules/.bin/tsx --test welcome.test.ts
echo "the testing guide's welcome.test.ts passed on pgasynq/testing in $((SECONDS - start)) s"

mkdir "$scratch/cjs" && cd "$scratch/cjs"
npm init -y >/dev/null
quiet install "$tarball"
node -e "
const { Client, Server, Task, migrate } = require('pgasynq');
if (typeof Client !== 'function' || typeof Server !== 'function' || typeof migrate !== 'function') throw new Error('require(pgasynq) lacks its exports');
console.log('require(\"pgasynq\") works from CommonJS:', new Task('t', { a: 1 }).type);
"

# Kysely is a peer dependency: the project's own Kysely is the one pgasynq uses, so its
# Transaction is the type the project's code names. Each minor in the peer range, in a fresh
# project: kysely.ts typechecks (strict, skipLibCheck off, nodenext) and runs against PostgreSQL.
newest=$(npm view kysely version)
specs=("kysely@~0.27" "kysely@~0.28")
[[ $newest == 0.28.* ]] || specs+=("kysely@$newest")
first=1
for spec in "${specs[@]}"; do
  start=$SECONDS
  dir="$scratch/${spec//[@~]/_}"
  mkdir "$dir" && cd "$dir"
  npm init -y >/dev/null && npm pkg set type=module
  quiet install "$tarball" "$spec" pg
  quiet install -D tsx "$typescript" "$types_node" @types/pg
  version=$(node -p "require('./node_modules/kysely/package.json').version")
  cp "$repo/.ci/package/kysely.ts" .
  # The shipped declarations too: they name Kysely's types, now this project's Kysely's.
  include='"kysely.ts", "node_modules/pgasynq/dist/**/*.d.ts"'
  if [ -n "$first" ]; then
    cp "$repo/.ci/package/check.cts" .
    include="$include, \"check.cts\""
  fi
  cat > tsconfig.json <<JSON
{ "compilerOptions": { "strict": true, "module": "nodenext", "target": "es2022", "skipLibCheck": false, "noEmit": true }, "include": [$include] }
JSON
  npx tsc -p .
  [ -n "$first" ] && echo "a .cts file importing pgasynq typechecks under module nodenext"
  ./node_modules/.bin/tsx kysely.ts "$version"
  echo "kysely $version: checked in $((SECONDS - start)) s"
  first=
done

psql "$admin_url" -q -c "DROP DATABASE IF EXISTS $database" >/dev/null
