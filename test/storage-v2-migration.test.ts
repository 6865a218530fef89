/**
 * Storage v2 (migration 0004): v1's tasks table split into task_inputs and
 * task_states behind a `tasks` view. Every task survives 0003 → 0004 → 0003 →
 * 0004 field for field and in its pending order, whether v1 or the public API
 * wrote it; servers work on the migrated rows.
 */
import assert from 'node:assert/strict';
import { describe } from 'node:test';
import { SkipRetry, Task, migrate, migrateDown } from '../src/index.js';
import { Db } from '../src/broker/db.js';
import { requeue } from '../src/broker/leases.js';
import { claim } from './broker-helpers.js';
import { DATABASE_URL, MIGRATIONS, test, waitFor } from './helpers.js';
import { client, closers, freshSchema, q, server, setupStorageV2, stats, v2Tables } from './storage-v2-kit.js';

const BASE = setupStorageV2('t_storage_v2_migration', ['_v1', '_api']);
const V1 = '0003_active_index';
const V2 = '0004_storage_v2';
/** Every migration after v2 (workflows, replace, flow control, …): up and down go through them too. */
const AFTER_V1 = MIGRATIONS.slice(MIGRATIONS.indexOf(V2));

/**
 * Migrates `schema` down one step at a time to v1, each step naming the
 * migration that is then the latest, and checks that v1 has every task of
 * `before` with the same seqs and pending order, and unique seqs.
 */
async function downToV1Keeps(schema: string, before: Record<string, any>[], order: string[]): Promise<void> {
  for (const v of [...AFTER_V1].reverse()) assert.equal(await migrateDown({ connectionString: DATABASE_URL, schema, logger: false }), v);
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

/** The columns of v1's tasks table (0003), which v2's view keeps: every later one is left out of the comparison. */
const V1_COLUMNS = [
  'queue',
  'id',
  'type',
  'payload',
  'payload_bytes',
  'headers',
  'state',
  'max_retry',
  'retried',
  'timeout',
  'deadline',
  'unique_key',
  'group_key',
  'retention',
  'run_at',
  'lease_owner',
  'lease_expires_at',
  'lease_token',
  'started_at',
  'cancel_requested',
  'error_msg',
  'last_failed_at',
  'completed_at',
  'result',
  'result_bytes',
  'enqueued_at',
  'updated_at',
  'seq',
];

/** Every task with v1's columns, by (queue, id). */
async function v1Rows(schema: string): Promise<Record<string, any>[]> {
  const rows = await q(schema, 'SELECT * FROM {{schema}}.tasks ORDER BY queue, id');
  return rows.map((row) => Object.fromEntries(V1_COLUMNS.map((c) => [c, row[c]])));
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
    assert.deepEqual(await migrate({ connectionString: DATABASE_URL, schema, logger: false }), { applied: AFTER_V1 });
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

    assert.deepEqual(await migrate({ connectionString: DATABASE_URL, schema, logger: false }), { applied: AFTER_V1 });
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

    assert.deepEqual(await migrate({ connectionString: DATABASE_URL, schema, logger: false }), { applied: AFTER_V1 });
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
