/**
 * What the test files of the `pgasynq` CLI's Inspector commands share (not a
 * test file itself): the CLI run as a child process exactly as users run it,
 * with at most a few children at once, assertions on its output and exit
 * codes, writers of tasks in a given state, and the rows every file starts
 * with ("reads": a task in every state, a server, a cron entry and its history).
 *
 * Every child costs more than a second of CPU (tsx), so cases run
 * concurrently (first everything that only reads, and the exit codes; then
 * the actions, each on its own queue) while at most a few children run at
 * once: more only makes them fight for the CPU.
 */
import assert from 'node:assert/strict';
import { availableParallelism } from 'node:os';
import { after, before } from 'node:test';
import { Client, Inspector, Task } from '../src/index.js';
import { DATABASE_URL, runCli, testDb, testWithin, type TestDb } from './helpers.js';

/** The CLI runs as a process per command, several per test: more than a minute under a loaded machine. */
export const test = testWithin(180_000);

export interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

const MAX_CHILDREN = availableParallelism() + 1;
let running = 0;
const waiting: (() => void)[] = [];

/** Runs the CLI; DATABASE_URL is unset in the child unless `env` sets it. */
export async function cli(args: string[], env: Record<string, string> = {}): Promise<Run> {
  if (running < MAX_CHILDREN) running++;
  else await new Promise<void>((resolve) => waiting.push(resolve)); // a finishing child hands its slot over
  try {
    return await spawnCli(args, env);
  } finally {
    const next = waiting.shift();
    if (next) next();
    else running--;
  }
}

function spawnCli(args: string[], env: Record<string, string>): Promise<Run> {
  return runCli(args, env);
}

// The file's database, Client and Inspector, made by setupCliAdmin() (each test file is a process of its own).
export let db: TestDb;
export let client: Client;
export let inspector: Inspector;

/** `pgasynq --database-url <test db> --schema <test schema> ...args` */
export const pgasynq = (...args: string[]) => cli(['--database-url', DATABASE_URL, '--schema', db.schema, ...args]);

export function ok(r: Run): string {
  assert.equal(r.code, 0, `exit ${r.code}; stderr: ${r.stderr}`);
  assert.equal(r.stderr, '');
  assert.doesNotMatch(r.stdout, /\x1b\[/, 'no colours when stdout is not a terminal');
  return r.stdout;
}

/** `pgasynq --json ...args`, parsed. */
export async function json<T = unknown>(...args: string[]): Promise<T> {
  return JSON.parse(ok(await pgasynq('--json', ...args))) as T;
}

/** A failure: exit `code`, `error: <message>` on one line of stderr (two for usage: the help hint), nothing on stdout. */
export function fails(r: Run, code: 1 | 2, message: RegExp): void {
  assert.equal(r.code, code, `exit ${r.code}; stdout: ${r.stdout}; stderr: ${r.stderr}`);
  assert.equal(r.stdout, '');
  assert.match(r.stderr, /^error: [^\n]+\n/);
  if (code === 1) assert.match(r.stderr, /^error: [^\n]+\n$/, `one line: ${JSON.stringify(r.stderr)}`);
  assert.match(r.stderr, message);
  assert.doesNotMatch(r.stderr, /\bat .*\.ts:\d+/, 'no stack trace');
}

/** What JSON.stringify makes of a value, as the CLI prints it. */
export const plain = (v: unknown): unknown => JSON.parse(JSON.stringify(v));

/** Enqueues task `id` of type job in `queue`. */
export const put = (queue: string, id: string, extra: Record<string, unknown> = {}, payload: unknown = { id }) =>
  client.enqueue(new Task('job', payload), { queue, taskId: id, ...extra });
/** Rewrites a row's state with the columns that state needs. */
export const force = (queue: string, id: string, set: string) => db.query(`UPDATE {{schema}}.tasks SET ${set} WHERE queue = $1 AND id = $2`, [queue, id]);
export const ACTIVE = (owner: string) =>
  `state = 'active', run_at = NULL, lease_owner = '${owner}', lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 hour', started_at = now()`;
export const RETRY = "state = 'retry', run_at = now() + interval '1 hour', retried = 1, error_msg = 'boom', last_failed_at = now()";
export const ARCHIVED = "state = 'archived', run_at = now(), retried = 3, error_msg = 'dead', last_failed_at = now()";
/** The state of task `id` in `queue`, or 'gone'. */
export const stateOf = async (queue: string, id: string) =>
  (await db.query<{ state: string }>('SELECT state FROM {{schema}}.tasks WHERE queue = $1 AND id = $2', [queue, id]))[0]?.state ?? 'gone';

/** Registers a CLI test file's hooks on schema `name`: its database, Client and Inspector, and the rows of "reads". */
export function setupCliAdmin(name: string): void {
  before(async () => {
    db = await testDb(name);
    client = new Client({ connectionString: db.connectionString, schema: db.schema });
    inspector = new Inspector({ connectionString: db.connectionString, schema: db.schema });

    // "reads": a task in every state, three aggregating in two groups; "reads_low": paused, a binary payload.
    await put('reads', 'p1');
    await put('reads', 'p2');
    await force('reads', 'p1', "run_at = now() - interval '5 s'");
    await put('reads', 'sch', { processIn: 3_600_000 });
    await put('reads', 'ret');
    await force('reads', 'ret', RETRY);
    await put('reads', 'arc');
    await force('reads', 'arc', ARCHIVED);
    await put('reads', 'com', { retention: 3_600_000 });
    await force('reads', 'com', `state = 'completed', completed_at = now(), run_at = now() + interval '1 hour', result = '{"rows":3}'`);
    await put('reads', 'act', { timeout: 3_600_000 });
    await force('reads', 'act', ACTIVE('srv-1'));
    await put('reads', 'agg1', { group: 'g1' });
    await put('reads', 'agg2', { group: 'g1' });
    await put('reads', 'agg3', { group: 'g2' });
    await put('reads_low', 'bin', {}, Buffer.from('binary'));
    await inspector.pauseQueue('reads_low');
    await db.query(
      "INSERT INTO {{schema}}.daily_stats VALUES ('reads', (now() AT TIME ZONE 'UTC')::date, 7, 2), ('reads', (now() AT TIME ZONE 'UTC')::date - 1, 100, 50)",
    );
    await db.query(
      `INSERT INTO {{schema}}.servers (id, host, pid, concurrency, queues, strict_priority, status, expires_at)
     VALUES ('srv-1', 'worker-1', 4242, 10, '{"reads": 2, "reads_low": 1}', false, 'active', now() + interval '1 hour')`,
    );
    await db.query(
      `INSERT INTO {{schema}}.scheduler_entries (id, spec, task_type, payload, options, scheduler_id, next_run_at, prev_run_at, expires_at)
     VALUES ('e1', '@every 30s', 'report', '{"k":1}', '{"queue":"reads"}', 's1', now() + interval '1 hour', now(), now() + interval '1 hour')`,
    );
    await db.query(
      "INSERT INTO {{schema}}.scheduler_events (entry_id, tick_at, task_id, enqueued_at) SELECT 'e1', now() - i * interval '30 s', 'task' || i, now() - i * interval '30 s' FROM generate_series(1, 35) i",
    );
  });

  after(async () => {
    await inspector.close();
    await client.close();
    await db.close();
  });
}
