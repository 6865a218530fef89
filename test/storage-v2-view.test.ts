/**
 * Storage v2 (migration 0004): writes through the `tasks` view reach both
 * task_inputs and task_states: INSERT, UPDATE to and from pending (its
 * position in the queue, and the queue woken), DELETE.
 */
import assert from 'node:assert/strict';
import { describe } from 'node:test';
import pg from 'pg';
import { Task } from '../src/index.js';
import { DATABASE_URL, deferred, test, waitFor } from './helpers.js';
import { client, closers, freshSchema, q, server, setupStorageV2, stats, v2Tables } from './storage-v2-kit.js';

const BASE = setupStorageV2('t_storage_v2_view', ['_view']);

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
