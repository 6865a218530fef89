/**
 * migrations/schema.sql, the schema as the migrations leave it, must stay
 * true: this renders a freshly migrated schema as `npm run schema:dump` does
 * and compares it with the committed file. The rendering depends on the
 * server's major version (pg_get_viewdef's layout), so on a server of another
 * version than the one the file records (CI's embedded PostgreSQL 18 run) the
 * comparison is skipped, saying so.
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import pg from 'pg';
import { schemaText, SCHEMA_FILE, VERSION_LINE } from '../scripts/schema-dump.js';
import { loadMigrations } from '../src/broker/migrations.js';
import { DATABASE_URL, test, testDb } from './helpers.js';

const committed = readFileSync(SCHEMA_FILE, 'utf8');

/** Where two texts first differ, with a few lines of each from there. */
function firstDifference(want: string, got: string): string {
  const a = want.split('\n');
  const b = got.split('\n');
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i++;
  const show = (lines: string[]) =>
    lines
      .slice(i, i + 6)
      .map((l) => `    ${l}`)
      .join('\n') || '    (end of text)';
  return `first difference at line ${i + 1}:\n  migrations/schema.sql has:\n${show(a)}\n  the migrations produce:\n${show(b)}`;
}

test('migrations/schema.sql is what the migrations produce', async (t) => {
  const recorded = Number(VERSION_LINE.exec(committed)?.[1]);
  assert.ok(Number.isInteger(recorded), 'migrations/schema.sql has no "Rendered by PostgreSQL N." line: run `npm run schema:dump`');
  const client = new pg.Client({ connectionString: DATABASE_URL });
  await client.connect();
  const major = Math.floor(Number((await client.query<{ v: string }>("SELECT current_setting('server_version_num') AS v")).rows[0]!.v) / 10000);
  await client.end();
  if (major !== recorded) {
    t.skip(
      `migrations/schema.sql was rendered by PostgreSQL ${recorded} and this server is ${major}: not compared here (the run on PostgreSQL ${recorded} compares it)`,
    );
    return;
  }
  const db = await testDb('schema_file');
  t.after(() => db.close());
  const text = await schemaText(db.connectionString, db.schema);
  if (text !== committed) {
    assert.fail(`migrations/schema.sql is out of date: run \`npm run schema:dump\` and commit the result.\n${firstDifference(committed, text)}`);
  }
});

test('migrations/schema.sql is not a migration', async () => {
  const names = (await loadMigrations()).map((m) => m.name);
  assert.ok(names.length > 0);
  assert.ok(!names.includes('schema'), `loadMigrations() took schema.sql: ${names.join(', ')}`);
  assert.match(
    committed,
    new RegExp(`through ${names.at(-1)} \\(${names.length} files\\)`),
    'the file was generated before the newest migration: run `npm run schema:dump`',
  );
});

/** Each function of the file, by name, with its whole text (to the next object). */
const functions = committed
  .split(/^(?=CREATE )/m)
  .map((text) => [/^CREATE OR REPLACE FUNCTION \{\{schema\}\}\.(\w+)\(/.exec(text)?.[1], text] as const)
  .filter((f): f is readonly [string, string] => f[0] !== undefined);

test('every place in the pending order is drawn by task_position(), which takes the transaction id first (the claim cursor)', () => {
  // A nextval of task_seq anywhere else would draw a place that a transaction
  // without an id could commit behind the cursor.
  const drawers = functions.filter(([, text]) => /nextval\(/.test(text)).map(([name]) => name);
  assert.deepEqual(drawers, ['task_position']);
  const body = functions.find(([name]) => name === 'task_position')![1];
  assert.match(body, /CASE WHEN \(?pg_catalog\.pg_current_xact_id\(\) IS NOT NULL\)? THEN pg_catalog\.nextval/, 'the id before the place');
  // Every function that draws a place calls it.
  const users = functions
    .filter(([name, text]) => name !== 'task_position' && /task_position\(\)/.test(text))
    .map(([name]) => name)
    .sort();
  assert.deepEqual(users, [
    'enqueue',
    'enqueue_tasks',
    'forward_due',
    'replace_tasks',
    'requeue_tasks',
    'run_tasks',
    'settle_completed',
    'settle_failed',
    'tasks_write',
  ]);
});

test('a function planned once (a generic plan) never compiles with JIT', () => {
  // A generic plan's estimates (a CTE's guessed 1,000 rows, a disabled join's price) can pass
  // jit_above_cost, and every call then compiled: 1 s a claim, 80 ms an enqueue (0014, 0015).
  const generic = functions.filter(([, text]) => /SET plan_cache_mode TO 'force_generic_plan'/.test(text)).map(([name]) => name);
  assert.ok(generic.includes('claim_tasks') && generic.includes('enqueue_tasks'), `found: ${generic.join(', ')}`);
  const compiling = functions.filter(([name, text]) => generic.includes(name) && !/SET jit TO 'off'/.test(text)).map(([name]) => name);
  assert.deepEqual(compiling, []);
});
