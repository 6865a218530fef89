/**
 * Storage v2 (migration 0004): v1's tasks table split into task_inputs and
 * task_states behind a `tasks` view. Every task survives 0003 → 0004 → 0003 →
 * 0004 field for field and in its pending order; servers and clients work on
 * the migrated rows; writes through the view reach both tables.
 */
import assert from 'node:assert/strict';
import { after, afterEach, before, describe } from 'node:test';
import pg from 'pg';
import { Client, Server, SkipRetry, Task, migrate, migrateDown, type ServerConfig, type TaskContext } from '../src/index.js';
import { Db } from '../src/broker/db.js';
import { requeue } from '../src/broker/leases.js';
import { claim } from './broker-helpers.js';
import { DATABASE_URL, deferred, test, waitFor } from './helpers.js';

const BASE = `t_storage_v2${process.env.TEST_SCHEMA_SUFFIX ?? ''}`;
const V1 = '0003_active_index';
const V2 = '0004_storage_v2';
/** Workflows (0005), replace (0006), flow control (0007), SQL enqueue (0008), the trust boundary (0009) and the worker's writes (0010) come after v2: up and down go through them too. */
const V3 = '0005_workflows';
const V4 = '0006_replace';
const V5 = '0007_flow_control';
const V6 = '0008_sql_enqueue';
const V7 = '0009_trust_boundary';
const V8 = '0010_worker_writes';
const V9 = '0011_clock_seam';
const V10 = '0012_transitions';

let admin: pg.Pool;
before(() => {
  admin = new pg.Pool({ connectionString: DATABASE_URL, max: 4 });
});
after(async () => {
  for (const s of ['_v1', '_api', '_view']) await admin.query(`DROP SCHEMA IF EXISTS "${BASE}${s}" CASCADE`).catch(() => {});
  await admin.end();
});

/** Servers and clients a test started: closed after each test, even one that failed half-way. */
const closers: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  await Promise.all(closers.splice(0).map((c) => c().catch(() => {})));
});

const q = async <R extends pg.QueryResultRow = any>(schema: string, text: string, values?: unknown[]): Promise<R[]> =>
  (await admin.query<R>(text.replaceAll('{{schema}}', `"${schema}"`), values)).rows;

async function freshSchema(schema: string, to?: string): Promise<void> {
  await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  await migrate({ connectionString: DATABASE_URL, schema, logger: false, ...(to ? { to } : {}) });
}

/**
 * Migrates `schema` down one step at a time to v1, each step naming the
 * migration that is then the latest, and checks that v1 has every task of
 * `before` with the same seqs and pending order, and unique seqs.
 */
async function downToV1Keeps(schema: string, before: Record<string, any>[], order: string[]): Promise<void> {
  for (const v of [V10, V9, V8, V7, V6, V5, V4, V3, V2]) assert.equal(await migrateDown({ connectionString: DATABASE_URL, schema, logger: false }), v);
  const down = await v1Rows(schema);
  assert.deepEqual(withoutSeq(down), withoutSeq(before));
  assert.deepEqual(seqsOfNonPending(down), seqsOfNonPending(before));
  assert.deepEqual(await pendingOrder(schema), order);
  const [{ dup }] = await q(schema, 'SELECT count(*)::int AS dup FROM (SELECT seq FROM {{schema}}.tasks GROUP BY seq HAVING count(*) > 1) d');
  assert.equal(dup, 0, 'seq is unique in v1');
}

async function applied(schema: string): Promise<string> {
  const [row] = await q(schema, 'SELECT max(name) AS name FROM {{schema}}.migrations');
  return row.name;
}

/** Every task with v1's columns (pending_seq, v2's only column, left out), by (queue, id). */
async function v1Rows(schema: string): Promise<Record<string, any>[]> {
  const rows = await q(schema, 'SELECT * FROM {{schema}}.tasks ORDER BY queue, id');
  return rows.map(({ pending_seq: _, waiting_for: __, priority: ___, concurrency_key: ____, ...rest }) => rest);
}

/** The rows without seq (a pending task's seq is its position in v1, renumbered on the way down). */
const withoutSeq = (rows: Record<string, any>[]) => rows.map(({ seq: _, ...rest }) => rest);
const seqsOfNonPending = (rows: Record<string, any>[]) => rows.filter((r) => r.state !== 'pending').map((r) => [r.id, r.seq]);

/** Each queue's pending tasks in claim order, as the schema version orders them. */
async function pendingOrder(schema: string): Promise<string[]> {
  const v2 = (await applied(schema)) >= V2;
  const rows = await q(
    schema,
    `SELECT queue || '/' || id AS k FROM {{schema}}.tasks WHERE state = 'pending' ORDER BY queue, ${v2 ? 'pending_seq' : 'run_at, seq'}`,
  );
  return rows.map((r) => r.k);
}

/** Rows of each table of v2, and whether every task has both. */
async function v2Tables(schema: string): Promise<{ inputs: number; states: number; view: number; orphans: number }> {
  const [r] = await q(
    schema,
    `SELECT (SELECT count(*)::int FROM {{schema}}.task_inputs) AS inputs, (SELECT count(*)::int FROM {{schema}}.task_states) AS states,
            (SELECT count(*)::int FROM {{schema}}.tasks) AS view,
            (SELECT count(*)::int FROM {{schema}}.task_inputs i FULL JOIN {{schema}}.task_states s USING (seq)
              WHERE i.seq IS NULL OR s.seq IS NULL OR i.queue <> s.queue) AS orphans`,
  );
  return r;
}

async function stats(schema: string): Promise<Record<string, Record<string, number>>> {
  const rows = await q(
    schema,
    `SELECT queue, pending::int, active::int, scheduled::int, retry::int, archived::int, completed::int, aggregating::int, size::int
     FROM {{schema}}.queue_stats ORDER BY queue`,
  );
  return Object.fromEntries(rows.map(({ queue, ...counts }) => [queue, counts]));
}

async function server(schema: string, handler: (t: Task, c: TaskContext) => unknown, config: ServerConfig = {}): Promise<Server> {
  const s = new Server({
    connectionString: DATABASE_URL,
    schema,
    logger: false,
    concurrency: 1,
    taskCheckInterval: 50,
    delayedTaskCheckInterval: 50,
    shutdownTimeout: 500,
    ...config,
  });
  closers.push(() => s.shutdown());
  await s.start(handler as never);
  return s;
}

function client(schema: string): Client {
  const c = new Client({ connectionString: DATABASE_URL, schema, logger: false });
  closers.push(() => c.close());
  return c;
}

/** Notifications on a channel, from a LISTEN held until the test ends. */
async function listen(channel: string): Promise<string[]> {
  const c = new pg.Client({ connectionString: DATABASE_URL });
  await c.connect();
  const seen: string[] = [];
  c.on('notification', (n) => {
    if (n.channel === channel) seen.push(n.payload ?? '');
  });
  await c.query(`LISTEN "${channel}"`);
  closers.push(() => c.end());
  return seen;
}

describe('v1 tasks in every state through 0004 and back', () => {
  const schema = `${BASE}_v1`;
  let before: Record<string, any>[];
  let order: string[];
  let locks: unknown[];

  test('a v1 schema with tasks in every state', async () => {
    await freshSchema(schema, V1);
    assert.equal(await applied(schema), V1);
    // What v1's code wrote, statement by statement (its enqueue, claim, requeue,
    // failure, completion and archive), with v1's defaults where it left them.
    await q(schema, `INSERT INTO {{schema}}.queues (name) VALUES ('default'), ('other')`);
    // One enqueue of three: one now(), FIFO by seq.
    await q(
      schema,
      `INSERT INTO {{schema}}.tasks (queue, id, type, payload, headers, state, max_retry, timeout, deadline, retention, run_at)
       VALUES ('default', 'p1', 'order', '{"n": 1}', '{}', 'pending', 25, '0', NULL, '0', now()),
              ('default', 'p2', 'order', '{"n": 2}', '{"trace": "abc", "x-tenant": "t1"}', 'pending', 3, '0', NULL, '0', now()),
              ('default', 'p3', 'order', '{"n": 3}', '{}', 'pending', 25, '5 seconds', now() + interval '1 day', '0', now())`,
    );
    await q(schema, `INSERT INTO {{schema}}.tasks (queue, id, type, payload, state, run_at) VALUES ('other', 'o1', 'order', '{"o": 1}', 'pending', now())`);
    // A binary payload with a unique lock, in its own statement (a later now()).
    await q(
      schema,
      `WITH l AS (INSERT INTO {{schema}}.unique_locks (queue, key, task_id, expires_at) VALUES ('default', 'uk-bin', 'pbin', now() + interval '1 hour'))
       INSERT INTO {{schema}}.tasks (queue, id, type, payload, payload_bytes, state, unique_key, run_at)
       VALUES ('default', 'pbin', 'bytes', NULL, '\\x00ff10deadbeef', 'pending', 'uk-bin', now())`,
    );
    await q(schema, `INSERT INTO {{schema}}.tasks (queue, id, type, payload, state, run_at) VALUES ('other', 'o2', 'order', '{"o": 2}', 'pending', now())`);
    // Claimed, then given back at shutdown: v1's requeue puts it before the queue's first pending task.
    await q(
      schema,
      `INSERT INTO {{schema}}.tasks (queue, id, type, payload, state, retried, run_at, lease_owner, lease_token, lease_expires_at, started_at)
       VALUES ('default', 'p0', 'order', '{"n": 0}', 'active', 2, NULL, 'old', gen_random_uuid(), now() + interval '30 seconds', now())`,
    );
    await q(
      schema,
      `UPDATE {{schema}}.tasks t
       SET state = 'pending',
           run_at = coalesce((SELECT min(p.run_at) FROM {{schema}}.tasks p WHERE p.queue = t.queue AND p.state = 'pending'), now()) - interval '1 microsecond',
           lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL, updated_at = now()
       WHERE queue = 'default' AND id = 'p0'`,
    );
    await q(
      schema,
      `INSERT INTO {{schema}}.tasks (queue, id, type, payload, headers, state, max_retry, retried, timeout, deadline, unique_key, group_key,
                                     retention, run_at, lease_owner, lease_expires_at, lease_token, started_at, cancel_requested,
                                     error_msg, last_failed_at, completed_at, result, result_bytes)
       VALUES
         -- active, with its lease (and a cancellation requested)
         ('default', 'a1', 'work', '{"a": 1}', '{"h": "1"}', 'active', 25, 1, '1 minute', NULL, NULL, NULL, '0', NULL,
          'srv-1', now() + interval '30 seconds', gen_random_uuid(), now() - interval '2 seconds', true, 'earlier failure', now() - interval '1 minute', NULL, NULL, NULL),
         -- scheduled, unique, with a group for when it is due
         ('default', 's1', 'later', '{"s": 1}', '{}', 'scheduled', 25, 0, '0', NULL, 'uk-s1', 'grp', '0', now() + interval '1 day',
          NULL, NULL, NULL, NULL, false, NULL, NULL, NULL, NULL, NULL),
         -- retry
         ('default', 'r1', 'flaky', '{"r": 1}', '{}', 'retry', 5, 3, '0', now() + interval '2 days', NULL, NULL, '0', now() + interval '1 hour',
          NULL, NULL, NULL, now() - interval '10 seconds', false, 'boom: connection reset', now() - interval '5 seconds', NULL, NULL, NULL),
         -- archived
         ('default', 'x1', 'flaky', '{"x": 1}', '{}', 'archived', 2, 2, '0', NULL, NULL, NULL, '0', now() - interval '1 minute',
          NULL, NULL, NULL, now() - interval '2 minutes', false, 'gave up', now() - interval '1 minute', NULL, NULL, NULL),
         -- completed, kept for its retention, with a JSON result
         ('default', 'c1', 'work', '{"c": 1}', '{}', 'completed', 25, 0, '0', NULL, NULL, NULL, '1 day', now() + interval '1 day',
          NULL, NULL, NULL, now() - interval '1 second', false, NULL, NULL, now(), '{"ok": true, "n": [1, 2]}', NULL),
         -- completed with a binary result
         ('other', 'c2', 'work', NULL, '{}', 'completed', 25, 1, '0', NULL, NULL, NULL, '2 hours', now() + interval '2 hours',
          NULL, NULL, NULL, now() - interval '1 second', false, 'first attempt failed', now() - interval '3 seconds', now(), NULL, '\\xcafe'),
         -- aggregating, two of one group
         ('default', 'g1', 'agg', '{"g": 1}', '{}', 'aggregating', 25, 0, '0', NULL, NULL, 'grp', '0', NULL,
          NULL, NULL, NULL, NULL, false, NULL, NULL, NULL, NULL, NULL),
         ('default', 'g2', 'agg', '{"g": 2}', '{}', 'aggregating', 25, 0, '0', NULL, NULL, 'grp', '0', NULL,
          NULL, NULL, NULL, NULL, false, NULL, NULL, NULL, NULL, NULL)`,
    );
    await q(schema, `INSERT INTO {{schema}}.unique_locks (queue, key, task_id, expires_at) VALUES ('default', 'uk-s1', 's1', now() + interval '2 days')`);

    before = await v1Rows(schema);
    order = await pendingOrder(schema);
    locks = await q(schema, 'SELECT * FROM {{schema}}.unique_locks ORDER BY queue, key');
    assert.equal(before.length, 15);
    assert.deepEqual(order, ['default/p0', 'default/p1', 'default/p2', 'default/p3', 'default/pbin', 'other/o1', 'other/o2']);
    assert.deepEqual(new Set(before.map((r) => r.state)), new Set(['pending', 'active', 'scheduled', 'retry', 'archived', 'completed', 'aggregating']));
  });

  test('0004 keeps every task, field for field, and the pending order', async () => {
    assert.deepEqual(await migrate({ connectionString: DATABASE_URL, schema, logger: false }), { applied: [V2, V3, V4, V5, V6, V7, V8, V9, V10] });
    const rows = await q(schema, 'SELECT * FROM {{schema}}.tasks ORDER BY queue, id');
    assert.deepEqual(await v1Rows(schema), before);
    assert.deepEqual(await pendingOrder(schema), order);
    // Only pending tasks have a position, every one above every seq migrated (new ones come after).
    const maxSeq = Math.max(...rows.map((r) => Number(r.seq)));
    for (const r of rows) {
      if (r.state === 'pending') assert.ok(Number(r.pending_seq) > maxSeq, `${r.id}: pending_seq ${r.pending_seq} above every seq`);
      else assert.equal(r.pending_seq, null, `${r.id}: no position unless pending`);
    }
    assert.deepEqual(await v2Tables(schema), { inputs: 15, states: 15, view: 15, orphans: 0 });
    assert.deepEqual(await q(schema, 'SELECT * FROM {{schema}}.unique_locks ORDER BY queue, key'), locks);
    // The tasks table is gone: tasks is the view.
    const [{ kind }] = await q(schema, `SELECT relkind AS kind FROM pg_class WHERE oid = to_regclass('{{schema}}.tasks')`);
    assert.equal(kind, 'v');
  });

  test('queue_stats and active_tasks answer on v2', async () => {
    assert.deepEqual(await stats(schema), {
      default: { pending: 5, active: 1, scheduled: 1, retry: 1, archived: 1, completed: 1, aggregating: 2, size: 12 },
      other: { pending: 2, active: 0, scheduled: 0, retry: 0, archived: 0, completed: 1, aggregating: 0, size: 3 },
    });
    const [{ groups, latency_ms }] = await q(schema, `SELECT groups::int, latency_ms FROM {{schema}}.queue_stats WHERE queue = 'default'`);
    assert.equal(groups, 1);
    assert.ok(latency_ms >= 0 && latency_ms < 60_000, `latency ${latency_ms} ms`);
    const active = await q(schema, 'SELECT * FROM {{schema}}.active_tasks');
    assert.equal(active.length, 1);
    assert.equal(active[0].id, 'a1');
    assert.equal(active[0].lease_owner, 'srv-1');
    assert.equal(active[0].orphaned, false);
    assert.equal(active[0].cancel_requested, true);
    assert.equal(active[0].retried, 1);
    assert.equal(active[0].max_retry, 25);
  });

  test('back to v1 keeps every task, and up again', async () => {
    await downToV1Keeps(schema, before, order);
    assert.equal(await applied(schema), V1);
    const [{ kind }] = await q(schema, `SELECT relkind AS kind FROM pg_class WHERE oid = to_regclass('{{schema}}.tasks')`);
    assert.equal(kind, 'r');
    assert.deepEqual(await stats(schema), {
      default: { pending: 5, active: 1, scheduled: 1, retry: 1, archived: 1, completed: 1, aggregating: 2, size: 12 },
      other: { pending: 2, active: 0, scheduled: 0, retry: 0, archived: 0, completed: 1, aggregating: 0, size: 3 },
    });
    assert.equal((await q(schema, 'SELECT * FROM {{schema}}.active_tasks')).length, 1);
    assert.deepEqual(await q(schema, 'SELECT * FROM {{schema}}.unique_locks ORDER BY queue, key'), locks);

    assert.deepEqual(await migrate({ connectionString: DATABASE_URL, schema, logger: false }), { applied: [V2, V3, V4, V5, V6, V7, V8, V9, V10] });
    assert.deepEqual(withoutSeq(await v1Rows(schema)), withoutSeq(before));
    assert.deepEqual(await pendingOrder(schema), order);
    assert.deepEqual(await v2Tables(schema), { inputs: 15, states: 15, view: 15, orphans: 0 });
  });

  test('a server processes the migrated pending tasks in order, new ones after them', async () => {
    const c = client(schema);
    await c.enqueue(new Task('order', { n: 'new1' }), { taskId: 'n1' });
    await c.enqueue(new Task('order', { n: 'new2' }), { taskId: 'n2', queue: 'other' });
    const positions = await q(schema, `SELECT id, pending_seq FROM {{schema}}.tasks WHERE state = 'pending'`);
    const migrated = positions.filter((r) => !['n1', 'n2'].includes(r.id)).map((r) => Number(r.pending_seq));
    for (const id of ['n1', 'n2']) {
      const mine = Number(positions.find((r) => r.id === id)!.pending_seq);
      assert.ok(
        migrated.every((p) => p < mine),
        `${id} (${mine}) after every migrated position`,
      );
    }
    const ran: string[] = [];
    const payloads = new Map<string, unknown>();
    await server(
      schema,
      (task, ctx) => {
        ran.push(`${ctx.queue}/${ctx.taskId}`);
        payloads.set(ctx.taskId, task.payload);
      },
      { queues: { default: 1, other: 1 } },
    );
    await waitFor(() => ran.length >= 9, 20_000, 'the 9 pending tasks');
    assert.deepEqual(
      ran.filter((k) => k.startsWith('default/')),
      ['default/p0', 'default/p1', 'default/p2', 'default/p3', 'default/pbin', 'default/n1'],
    );
    assert.deepEqual(
      ran.filter((k) => k.startsWith('other/')),
      ['other/o1', 'other/o2', 'other/n2'],
    );
    assert.deepEqual(Buffer.from(payloads.get('pbin') as Uint8Array), Buffer.from('00ff10deadbeef', 'hex'));
    assert.deepEqual(payloads.get('p2'), { n: 2 });
    // Completed with retention 0: deleted from both tables, and pbin's unique lock released.
    await waitFor(async () => (await q(schema, `SELECT 1 FROM {{schema}}.tasks WHERE state IN ('pending', 'active') AND id <> 'a1'`)).length === 0);
    assert.deepEqual(await v2Tables(schema), { inputs: 8, states: 8, view: 8, orphans: 0 });
    assert.deepEqual(
      (await q(schema, 'SELECT key FROM {{schema}}.unique_locks ORDER BY key')).map((r) => r.key),
      ['uk-s1'],
    );
  });
});

describe('tasks written by the public API on v2, down to v1 and up again', () => {
  const schema = `${BASE}_api`;

  test('every state, a requeued task and binary payloads survive 0004 → 0003 → 0004', async () => {
    await freshSchema(schema);
    const c = client(schema);
    // Finished states, through a server: completed with a result, retry, archived.
    await c.enqueue(new Task('keep', { k: 1 }), { queue: 'work', taskId: 'done', retention: 86_400_000 });
    await c.enqueue(new Task('keep-bytes', new Uint8Array([1, 2, 3])), { queue: 'work', taskId: 'done-bytes', retention: 3_600_000 });
    await c.enqueue(new Task('flaky', { f: 1 }), { queue: 'work', taskId: 'fails', maxRetry: 3 });
    await c.enqueue(new Task('doomed', { d: 1 }), { queue: 'work', taskId: 'skip' });
    const s = await server(
      schema,
      async (task, ctx) => {
        if (task.type === 'keep') await ctx.writeResult({ answer: 42 });
        if (task.type === 'keep-bytes') await ctx.writeResult(new Uint8Array([9, 8, 7]));
        if (task.type === 'flaky') throw new Error('flaky failure');
        if (task.type === 'doomed') throw new SkipRetry('no point');
      },
      { queues: { work: 1 }, retryDelay: () => 3_600_000 },
    );
    await waitFor(
      async () => {
        const rows = await q(schema, `SELECT id, state FROM {{schema}}.tasks WHERE queue = 'work' ORDER BY id`);
        return rows.map((r) => `${r.id}:${r.state}`).join(' ') === 'done:completed done-bytes:completed fails:retry skip:archived';
      },
      20_000,
      'finished states',
    );
    await s.shutdown();

    // Pending, scheduled, aggregating, and every option.
    await c.enqueueMany([
      new Task('t', { i: 1 }, { taskId: 'q1' }),
      new Task('t', { i: 2 }, { taskId: 'q2', headers: { trace: 'xyz' } }),
      new Task('t', new Uint8Array([0, 255, 16]), { taskId: 'q3' }),
      new Task('t', { i: 4 }, { taskId: 'q4', unique: 60_000 }),
      new Task('t', { i: 5 }, { taskId: 'q5', timeout: 5_000, deadline: new Date(Date.now() + 86_400_000), maxRetry: 7 }),
    ]);
    await c.enqueue(new Task('t', { i: 6 }), { taskId: 'sch', processIn: 3_600_000, unique: 7_200_000 });
    await c.enqueue(new Task('t', { i: 7 }), { taskId: 'agg1', group: 'g' });
    await c.enqueue(new Task('t', { i: 8 }), { taskId: 'agg2', group: 'g' });
    // Two claimed, the first given back (requeued to the front), the second left active.
    const broker = new Db({ connectionString: DATABASE_URL, schema });
    closers.push(() => broker.close());
    const claimed = await claim(broker, ['default'], 2, 'srv-x', 600_000);
    assert.deepEqual(
      claimed.map((r) => r.id),
      ['q1', 'q2'],
    );
    const [first] = claimed;
    assert.equal((await requeue(broker, [{ queue: 'default', id: first!.id, seq: first!.seq, token: first!.lease_token }])).length, 1);

    const before = await v1Rows(schema);
    const order = await pendingOrder(schema);
    const locks = await q(schema, 'SELECT * FROM {{schema}}.unique_locks ORDER BY queue, key');
    assert.deepEqual(order, ['default/q1', 'default/q3', 'default/q4', 'default/q5']);
    assert.deepEqual(new Set(before.map((r) => r.state)), new Set(['pending', 'active', 'scheduled', 'retry', 'archived', 'completed', 'aggregating']));
    assert.equal(locks.length, 2);

    await downToV1Keeps(schema, before, order);
    assert.deepEqual(await q(schema, 'SELECT * FROM {{schema}}.unique_locks ORDER BY queue, key'), locks);

    assert.deepEqual(await migrate({ connectionString: DATABASE_URL, schema, logger: false }), { applied: [V2, V3, V4, V5, V6, V7, V8, V9, V10] });
    assert.deepEqual(withoutSeq(await v1Rows(schema)), withoutSeq(before));
    assert.deepEqual(await pendingOrder(schema), order);
    assert.deepEqual(await v2Tables(schema), { inputs: before.length, states: before.length, view: before.length, orphans: 0 });

    // And they run, in order, on the schema that went down and up.
    const ran: string[] = [];
    await server(schema, (_t, ctx) => void ran.push(ctx.taskId));
    await waitFor(() => ran.length >= 4, 20_000, 'the pending tasks');
    assert.deepEqual(ran, ['q1', 'q3', 'q4', 'q5']);
  });
});

describe('writes through the tasks view', () => {
  const schema = `${BASE}_view`;

  test('INSERT of a pending task: both rows, at the back, claimed by a server', async () => {
    await freshSchema(schema);
    const c = client(schema);
    await c.enqueueMany([new Task('t', { i: 1 }, { taskId: 'e1' }), new Task('t', { i: 2 }, { taskId: 'e2' })]);
    const notes = await listen(`${schema}_tasks`);
    const [row] = await q(
      schema,
      `INSERT INTO {{schema}}.tasks (queue, id, type, payload, state, run_at) VALUES ('default', 'sql-1', 't', '{"i": 3}', 'pending', now())
       RETURNING *`,
    );
    // RETURNING shows what was stored, defaults and keys included.
    assert.ok(row.seq !== null);
    assert.equal(row.pending_seq, row.seq, 'a new pending row is placed by its own seq, as an enqueue is');
    assert.deepEqual(row.headers, {});
    assert.equal(row.max_retry, 25);
    assert.equal(row.retried, 0);
    assert.ok(row.enqueued_at instanceof Date);
    const [inputs] = await q(schema, `SELECT count(*)::int AS n FROM {{schema}}.task_inputs WHERE seq = $1`, [row.seq]);
    const [states] = await q(schema, `SELECT state, pending_seq FROM {{schema}}.task_states WHERE seq = $1`, [row.seq]);
    assert.equal(inputs.n, 1);
    assert.equal(states.state, 'pending');
    const [{ max }] = await q(schema, `SELECT max(pending_seq) AS max FROM {{schema}}.tasks WHERE id IN ('e1', 'e2')`);
    assert.ok(BigInt(row.pending_seq) > BigInt(max), 'after the pending tasks already there');
    await waitFor(() => notes.includes('default'), 5000, 'a notification on the tasks channel');
    const [viewRow] = await q(schema, `SELECT * FROM {{schema}}.tasks WHERE id = 'sql-1'`);
    assert.deepEqual(viewRow, row);

    const ran: string[] = [];
    await server(schema, (_t, ctx) => void ran.push(ctx.taskId));
    await waitFor(() => ran.length >= 3, 20_000, 'three tasks');
    assert.deepEqual(ran, ['e1', 'e2', 'sql-1']);
    await waitFor(async () => (await v2Tables(schema)).states === 0, 5000, 'completed tasks deleted');
    assert.deepEqual(await v2Tables(schema), { inputs: 0, states: 0, view: 0, orphans: 0 });
  });

  test('UPDATE of a scheduled task to pending: a position at the back, and the queue woken', async () => {
    await freshSchema(schema);
    const c = client(schema);
    await c.enqueue(new Task('t', { i: 0 }), { taskId: 'later', processIn: 3_600_000 });
    // A server that would poll only once a minute: only a wake-up makes it claim soon.
    const ran: string[] = [];
    const gate = deferred();
    await server(
      schema,
      async (_t, ctx) => {
        ran.push(ctx.taskId);
        if (ctx.taskId === 'busy') await gate.promise;
      },
      { taskCheckInterval: 60_000, delayedTaskCheckInterval: 60_000, concurrency: 1, prefetch: 0 },
    );
    // Its one slot busy, two tasks behind it: the later one must come after them.
    await c.enqueue(new Task('t', {}), { taskId: 'busy' });
    await waitFor(() => ran.includes('busy'), 10_000, 'busy started');
    await c.enqueueMany([new Task('t', { i: 1 }, { taskId: 'w1' }), new Task('t', { i: 2 }, { taskId: 'w2' })]);
    const notes = await listen(`${schema}_tasks`);
    const [updated] = await q(schema, `UPDATE {{schema}}.tasks SET state = 'pending' WHERE id = 'later' RETURNING *`);
    assert.equal(updated.state, 'pending');
    const rows = await q(schema, `SELECT id, pending_seq, run_at, (run_at <= now()) AS due FROM {{schema}}.tasks WHERE state = 'pending' ORDER BY pending_seq`);
    assert.deepEqual(
      rows.map((r) => r.id),
      ['w1', 'w2', 'later'],
    );
    assert.equal(String(updated.pending_seq), String(rows[2].pending_seq));
    // It became pending now: v1's meaning of a pending run_at (the queue's latency counts from it).
    assert.equal(rows[2].due, true, 'run_at is when it became pending, not its old due time');
    await waitFor(() => notes.includes('default'), 5000, 'a notification on the tasks channel');
    gate.resolve();
    await waitFor(() => ran.length >= 4, 10_000, 'the woken server ran them (it polls once a minute)');
    assert.deepEqual(ran, ['busy', 'w1', 'w2', 'later']);
    // Idle now, polling once a minute: the UPDATE alone must make it claim.
    await c.enqueue(new Task('t', { i: 3 }), { taskId: 'later2', processIn: 3_600_000 });
    await new Promise((r) => setTimeout(r, 300));
    await q(schema, `UPDATE {{schema}}.tasks SET state = 'pending' WHERE id = 'later2'`);
    await waitFor(() => ran.includes('later2'), 5_000, 'the idle server woken by the UPDATE');
  });

  test('UPDATE of a pending task keeps its position; UPDATE away from pending drops it', async () => {
    await freshSchema(schema);
    const c = client(schema);
    await c.enqueueMany([new Task('t', { i: 1 }, { taskId: 'k1' }), new Task('t', { i: 2 }, { taskId: 'k2' })]);
    const [k1] = await q(schema, `SELECT pending_seq FROM {{schema}}.tasks WHERE id = 'k1'`);
    await q(schema, `UPDATE {{schema}}.tasks SET payload = '{"i": 10}', headers = '{"a": "b"}', max_retry = 1 WHERE id = 'k1'`);
    const [after] = await q(schema, `SELECT * FROM {{schema}}.tasks WHERE id = 'k1'`);
    assert.equal(String(after.pending_seq), String(k1.pending_seq));
    assert.deepEqual([after.payload, after.headers, after.max_retry], [{ i: 10 }, { a: 'b' }, 1]);
    await q(schema, `UPDATE {{schema}}.tasks SET state = 'archived', run_at = now() WHERE id = 'k2'`);
    const [k2] = await q(schema, `SELECT state, pending_seq FROM {{schema}}.task_states s JOIN {{schema}}.task_inputs i USING (seq) WHERE i.id = 'k2'`);
    assert.deepEqual(k2, { state: 'archived', pending_seq: null });
  });

  test('DELETE removes both rows', async () => {
    await freshSchema(schema);
    const c = client(schema);
    await c.enqueue(new Task('t', { i: 1 }), { taskId: 'd1' });
    await c.enqueue(new Task('t', { i: 2 }), { taskId: 'd2', processIn: 3_600_000 });
    const [{ seq }] = await q(schema, `SELECT seq FROM {{schema}}.tasks WHERE id = 'd1'`);
    const deleted = await q(schema, `DELETE FROM {{schema}}.tasks WHERE id = 'd1' RETURNING id`);
    assert.deepEqual(
      deleted.map((r) => r.id),
      ['d1'],
    );
    assert.equal((await q(schema, 'SELECT 1 FROM {{schema}}.task_inputs WHERE seq = $1', [seq])).length, 0);
    assert.equal((await q(schema, 'SELECT 1 FROM {{schema}}.task_states WHERE seq = $1', [seq])).length, 0);
    assert.deepEqual(await v2Tables(schema), { inputs: 1, states: 1, view: 1, orphans: 0 });
    assert.deepEqual(await stats(schema), { default: { pending: 0, active: 0, scheduled: 1, retry: 0, archived: 0, completed: 0, aggregating: 0, size: 1 } });
  });
});
