/**
 * Client.enqueue of a task already there: a taskId that exists in the queue
 * (TaskIdConflictError, whatever its state) and unique tasks, their locks and
 * how long those hold (DuplicateTaskError). Nothing is overwritten.
 */
import { describe } from 'node:test';
import assert from 'node:assert/strict';
import { DuplicateTaskError, Task, TaskIdConflictError } from '../src/index.js';
import { caught, test } from './helpers.js';
import { near, setupClient } from './client-kit.js';

const { db, client, row, mustRow, counts, lockRows, countIn } = setupClient('t_client_duplicates');

// ---------------------------------------------------------------------------
describe('taskId conflicts', () => {
  test('the same id in the same queue → TaskIdConflictError; nothing overwritten', async () => {
    const first = await client.enqueue(new Task('conflict:first', { v: 1 }), { taskId: 'dup-1', queue: 'conflict_q' });
    assert.equal(first.id, 'dup-1');
    const before = await counts();
    const err = await caught(() => client.enqueue(new Task('conflict:second', { v: 2 }), { taskId: 'dup-1', queue: 'conflict_q' }));
    assert.ok(err instanceof TaskIdConflictError, `got ${String(err)}`);
    assert.equal(err.queue, 'conflict_q');
    assert.equal(err.taskId, 'dup-1');
    assert.deepEqual(await counts(), before);
    const r = await row('conflict_q', 'dup-1');
    assert.equal(r?.type, 'conflict:first');
    assert.deepEqual(r?.payload, { v: 1 });
  });

  for (const state of ['archived', 'completed'] as const) {
    test(`the existing task is ${state}: still a TaskIdConflictError`, async () => {
      const id = `dup-${state}`;
      await client.enqueue(new Task('conflict:state'), { taskId: id, queue: 'conflict_q' });
      await db.query(`UPDATE {{schema}}.tasks SET state = $3 WHERE queue = $1 AND id = $2`, ['conflict_q', id, state]);
      const before = await counts();
      const err = await caught(() => client.enqueue(new Task('conflict:state'), { taskId: id, queue: 'conflict_q' }));
      assert.ok(err instanceof TaskIdConflictError, `got ${String(err)}`);
      assert.deepEqual(await counts(), before);
      assert.equal((await row('conflict_q', id))?.state, state);
    });
  }

  test('the same id in another queue is fine', async () => {
    await client.enqueue(new Task('conflict:q1'), { taskId: 'shared-id', queue: 'conflict_q1' });
    const info = await client.enqueue(new Task('conflict:q2'), { taskId: 'shared-id', queue: 'conflict_q2' });
    assert.equal(info.id, 'shared-id');
    assert.equal(info.queue, 'conflict_q2');
    const rows = await db.query('SELECT queue, type FROM {{schema}}.tasks WHERE id = $1 ORDER BY queue', ['shared-id']);
    assert.deepEqual(rows, [
      { queue: 'conflict_q1', type: 'conflict:q1' },
      { queue: 'conflict_q2', type: 'conflict:q2' },
    ]);
  });
});

// ---------------------------------------------------------------------------
describe('unique', () => {
  const Q = 'uq';

  test('a second enqueue of the same type+payload → DuplicateTaskError, and writes nothing', async () => {
    const before = Date.now();
    const first = await client.enqueue(new Task('uniq:report', { day: '2024-01-01' }), { unique: 60_000, queue: Q });
    const r = await mustRow(first);
    assert.ok(r.unique_key, 'the task row carries its unique key');
    const locks = await lockRows();
    const mine = locks.find((l) => l.queue === Q && l.key === r.unique_key);
    assert.ok(mine, 'a lock row exists');
    assert.equal(mine.task_id, first.id);
    near(mine.expires_at, before + 60_000, 5_000, 'lock expires_at');

    const countsBefore = await counts();
    for (const opts of [
      { unique: 60_000, queue: Q },
      { unique: 5_000, queue: Q, headers: { other: 'headers' } },
    ]) {
      const err = await caught(() => client.enqueue(new Task('uniq:report', { day: '2024-01-01' }), opts));
      assert.ok(err instanceof DuplicateTaskError, `got ${String(err)}`);
      assert.equal(err.queue, Q);
      assert.deepEqual(await counts(), countsBefore, 'no task row, no lock row');
      assert.deepEqual(await lockRows(), locks, 'the lock row is unchanged');
    }
    assert.equal(await countIn(Q), 1);
  });

  test('a different payload, or another queue, is accepted', async () => {
    const a = await client.enqueue(new Task('uniq:report', { day: '2024-01-02' }), { unique: 60_000, queue: Q });
    const b = await client.enqueue(new Task('uniq:report', { day: '2024-01-01' }), { unique: 60_000, queue: 'uq_other' });
    const c = await client.enqueue(new Task('uniq:other-type', { day: '2024-01-01' }), { unique: 60_000, queue: Q });
    for (const info of [a, b, c]) assert.equal((await mustRow(info)).state, 'pending');
    // And without `unique` the same task may be enqueued any number of times.
    await client.enqueue(new Task('uniq:report', { day: '2024-01-01' }), { queue: Q });
    await client.enqueue(new Task('uniq:report', { day: '2024-01-01' }), { queue: Q });
  });

  test('once the lock has expired the same task is accepted again', async () => {
    const task = () => new Task('uniq:expiring', [1, 2, 3]);
    const first = await client.enqueue(task(), { unique: 60_000, queue: Q });
    await assert.rejects(client.enqueue(task(), { unique: 60_000, queue: Q }), DuplicateTaskError);
    const key = (await mustRow(first)).unique_key;
    const updated = await db.query(`UPDATE {{schema}}.unique_locks SET expires_at = now() - interval '1s' WHERE queue = $1 AND key = $2 RETURNING 1`, [Q, key]);
    assert.equal(updated.length, 1);
    const before = Date.now();
    const second = await client.enqueue(task(), { unique: 60_000, queue: Q });
    assert.notEqual(second.id, first.id);
    const lock = (await lockRows()).find((l) => l.queue === Q && l.key === key);
    assert.equal(lock?.task_id, second.id, 'the lock now belongs to the new task');
    near(lock?.expires_at, before + 60_000, 5_000, 'renewed lock');
  });

  test('the lock of a scheduled task lasts from processAt', async () => {
    const at = new Date(Date.now() + 3_600_000);
    const info = await client.enqueue(new Task('uniq:scheduled', { s: 1 }), { unique: 60_000, queue: Q, processAt: at });
    assert.equal(info.state, 'scheduled');
    const key = (await mustRow(info)).unique_key;
    const lock = (await lockRows()).find((l) => l.queue === Q && l.key === key);
    near(lock?.expires_at, at.getTime() + 60_000, 1_000, 'lock expires_at');
  });

  test('unique: 1000 (the minimum) is accepted', async () => {
    const info = await client.enqueue(new Task('uniq:min'), { unique: 1_000, queue: Q });
    assert.equal(info.state, 'pending');
  });
});
