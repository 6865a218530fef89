/**
 * Flow control: Snooze (a handler's "not now"), replace (debounce), priority
 * within a queue, and weighted queues chosen per slot within one claim.
 * (The cluster-wide limits are limits.test.ts's.)
 */
import assert from 'node:assert/strict';
import { describe } from 'node:test';
import { InvalidOptionError, Snooze, Task, TaskIdConflictError } from '../src/index.js';
import { Db } from '../src/broker/db.js';
import { claimFrom } from '../src/broker/claim.js';
import { claimShares, queueOrder } from '../src/server/queues.js';
import { caught, setupDb, test, waitFor } from './helpers.js';

const { db, client, inspector, startServer } = setupDb('t_flow_control', {
  resetEach: true,
  server: { concurrency: 2, taskCheckInterval: 50, delayedTaskCheckInterval: 60_000 },
});

const row = async (id: string) =>
  (
    await db.query<{ state: string; retried: number; due_in_ms: number | null; error_msg: string | null }>(
      `SELECT state, retried, error_msg, (extract(epoch FROM run_at - now()) * 1000)::float8 AS due_in_ms FROM {{schema}}.tasks WHERE id = $1`,
      [id],
    )
  )[0];

/** Starts a one-slot server; once `n` tasks ran, each one's [id, payload] in the order they ran. */
async function oneByOne(n: number, what: string): Promise<[string, unknown][]> {
  const ran: [string, unknown][] = [];
  await startServer((task, ctx) => void ran.push([ctx.taskId, task.payload]), { concurrency: 1 });
  await waitFor(() => ran.length === n, 10_000, what);
  return ran;
}

describe('Snooze', () => {
  test('back to scheduled, due in its delay, retry count unchanged, counted neither processed nor failed', { timeout: 30_000 }, async () => {
    await client.enqueue(new Task('later', null, { taskId: 'sleepy', maxRetry: 0 }));
    const attempts: { retryCount: number; at: number }[] = [];
    const errors: Error[] = [];
    // The forwarder sleeps a minute unless woken: the snooze's own notification must wake it.
    const server = await startServer(
      (_task, ctx) => {
        attempts.push({ retryCount: ctx.retryCount, at: performance.now() });
        if (attempts.length < 3) throw new Snooze(attempts.length === 1 ? 60_000 : 400);
      },
      { errorHandler: (err) => void errors.push(err) },
    );
    await waitFor(async () => (await row('sleepy'))?.state === 'scheduled', 10_000, 'snoozed');
    const snoozed = (await row('sleepy'))!;
    assert.equal(snoozed.retried, 0);
    assert.equal(snoozed.error_msg, null);
    assert.ok(snoozed.due_in_ms! > 50_000 && snoozed.due_in_ms! <= 60_000, `due in ${snoozed.due_in_ms} ms`);
    // Run it now by hand; the second snooze (400 ms) must then wake the forwarder itself.
    await db.query(`UPDATE {{schema}}.tasks SET state = 'pending' WHERE id = 'sleepy'`);
    await waitFor(() => attempts.length === 3, 15_000, 'the third attempt');
    assert.deepEqual(
      attempts.map((a) => a.retryCount),
      [0, 0, 0],
      'maxRetry 0, and never archived: snoozes use no retry',
    );
    assert.ok(attempts[2]!.at - attempts[1]!.at >= 350, `the 400 ms snooze waited ${Math.round(attempts[2]!.at - attempts[1]!.at)} ms`);
    await waitFor(async () => (await row('sleepy')) === undefined, 10_000, 'completed');
    await server.shutdown();
    assert.deepEqual(errors, [], 'no errorHandler call');
    const [stats] = await db.query('SELECT processed::int, failed::int FROM {{schema}}.daily_stats');
    assert.deepEqual(stats, { processed: 1, failed: 0 });
  });

  test('a Snooze wrapped as the cause of another error still snoozes', { timeout: 30_000 }, async () => {
    await client.enqueue(new Task('wrapped', null, { taskId: 'w' }));
    let n = 0;
    await startServer(() => {
      n++;
      throw new Error('upstream busy', { cause: new Snooze(3_600_000) });
    });
    await waitFor(async () => (await row('w'))?.state === 'scheduled', 10_000, 'snoozed');
    assert.equal(n, 1);
    assert.equal((await row('w'))!.retried, 0);
  });

  for (const bad of [-1, Number.NaN, Number.POSITIVE_INFINITY, 2_147_483_648, '5' as unknown as number, undefined as unknown as number]) {
    test(`new Snooze(${String(bad)}) is an InvalidOptionError naming delayMs`, async () => {
      const err = await caught(() => new Snooze(bad));
      assert.ok(err instanceof InvalidOptionError, String(err));
      assert.match(err.message, /^delayMs must be a finite duration in ms/);
    });
  }
});

const job = (id: string, payload: unknown, opts = {}) => new Task('job', payload, { taskId: id, ...opts });
const info = async (id: string) =>
  (await db.query(`SELECT state, payload, headers, max_retry, pending_seq, retried FROM {{schema}}.tasks WHERE id = $1`, [id]))[0];

describe('replace', () => {
  test('a pending task: new payload and options, its place in the queue kept; run once, as last enqueued', { timeout: 30_000 }, async () => {
    await client.enqueueMany([job('a', 1), job('x', 'first'), job('c', 3)]);
    const before = await info('x');
    for (let n = 2; n <= 10; n++) {
      const replaced = await client.enqueue(job('x', `version ${n}`, { headers: { n: String(n) }, maxRetry: n }), { replace: true });
      assert.equal(replaced.state, 'pending');
      assert.equal(replaced.payload, `version ${n}`);
    }
    const after = await info('x');
    assert.deepEqual([after.payload, after.headers, after.max_retry], ['version 10', { n: '10' }, 10]);
    assert.equal(after.pending_seq, before.pending_seq, 'same place in the queue');
    assert.deepEqual(await oneByOne(3, 'three tasks'), [
      ['a', 1],
      ['x', 'version 10'],
      ['c', 3],
    ]);
  });

  test('the due time moves: pending to scheduled, scheduled to pending at the back, retry to pending', async () => {
    await client.enqueueMany([job('p', 1), job('s', 2, { processIn: 3_600_000 }), job('r', 3), job('tail', 4)]);
    await db.query(`UPDATE {{schema}}.tasks SET state = 'retry', run_at = now() + interval '1 hour', retried = 2, error_msg = 'boom' WHERE id = 'r'`);
    const [p, s, r] = await client.enqueueMany([job('p', 'later', { processIn: 3_600_000 }), job('s', 'now'), job('r', 'again')], { replace: true });
    assert.equal(p!.state, 'scheduled');
    assert.ok(p!.nextProcessAt!.getTime() > Date.now() + 3_000_000);
    assert.equal(s!.state, 'pending');
    assert.equal(r!.state, 'pending');
    assert.equal(r!.retried, 2, 'the retry count is kept');
    const order = await db.query(`SELECT id FROM {{schema}}.tasks WHERE state = 'pending' ORDER BY pending_seq`);
    // Both join the back, behind the task that was pending all along (their own order is the update's).
    assert.equal(order[0]!.id, 'tail');
    assert.deepEqual(
      order
        .slice(1)
        .map((o) => o.id)
        .sort(),
      ['r', 's'],
    );
  });

  test('a waiting task keeps waiting for its dependencies, with the new payload', { timeout: 30_000 }, async () => {
    await client.enqueueMany([job('dep', 0), job('w', 'old', { dependsOn: ['dep'] })]);
    const replaced = await client.enqueue(job('w', 'new'), { replace: true });
    assert.equal(replaced.state, 'waiting');
    assert.deepEqual(replaced.dependsOn, [{ queue: 'default', id: 'dep' }]);
    assert.deepEqual(await oneByOne(2, 'both ran'), [
      ['dep', 0],
      ['w', 'new'],
    ]);
  });

  test('no task with the id: enqueued as usual', async () => {
    const created = await client.enqueue(job('fresh', 1), { replace: true });
    assert.equal(created.state, 'pending');
    assert.equal((await info('fresh')).payload, 1);
  });

  test('an active, completed or archived task with the id is a TaskIdConflictError, and nothing changes', async () => {
    await client.enqueueMany([job('act', 1), job('done', 2, { retention: 3_600_000 }), job('gone', 3)]);
    await db.query(
      `UPDATE {{schema}}.tasks SET state = 'active', lease_owner = 'x', lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 hour', started_at = now() WHERE id = 'act'`,
    );
    await db.query(`UPDATE {{schema}}.tasks SET state = 'completed', completed_at = now(), run_at = now() + interval '1 hour' WHERE id = 'done'`);
    await db.query(`UPDATE {{schema}}.tasks SET state = 'archived', run_at = now() WHERE id = 'gone'`);
    for (const [id, state] of [
      ['act', 'active'],
      ['done', 'completed'],
      ['gone', 'archived'],
    ] as const) {
      const err = await caught(() => client.enqueueMany([job('other', 0), job(id, 'replacement')], { replace: true }));
      assert.ok(err instanceof TaskIdConflictError, `${id}: ${String(err)}`);
      assert.equal((await info(id)).state, state);
      assert.notEqual((await info(id)).payload, 'replacement');
      assert.equal(await info('other'), undefined, 'nothing of the call written');
    }
  });

  test('inside the caller’s transaction: undone with it', async () => {
    await client.enqueue(job('t', 'original'));
    const conn = await db.pool.connect();
    try {
      await conn.query('BEGIN');
      await client.enqueue(job('t', 'replaced'), { replace: true, tx: conn });
      await conn.query('ROLLBACK');
    } finally {
      conn.release();
    }
    assert.equal((await info('t')).payload, 'original');
  });

  const bad: [string, Record<string, unknown>, RegExp][] = [
    ['without a taskId', { replace: true }, /^replace needs a taskId/],
    ['not a boolean', { taskId: 'a', replace: 'yes' }, /^replace must be/],
    ['with unique', { taskId: 'a', replace: true, unique: 60_000 }, /^replace cannot be combined with unique/],
    ['with a group', { taskId: 'a', replace: true, group: 'g' }, /^replace cannot be combined with group/],
    ['with dependsOn', { taskId: 'a', replace: true, dependsOn: ['b'] }, /^replace cannot be combined with dependsOn/],
  ];
  for (const [what, opts, message] of bad) {
    test(`replace ${what} is an InvalidOptionError`, async () => {
      const err = await caught(() => client.enqueue(new Task('job'), opts));
      assert.ok(err instanceof InvalidOptionError, String(err));
      assert.match(err.message, message);
    });
  }
});

describe('priority within a queue', () => {
  test('higher first, FIFO within a priority', { timeout: 30_000 }, async () => {
    const order: [string, number][] = [
      ['a', 0],
      ['b', 5],
      ['c', 0],
      ['d', -3],
      ['e', 5],
      ['f', 100],
      ['g', 0],
      ['h', -100],
    ];
    const infos = await client.enqueueMany(order.map(([id, priority]) => job(id, null, { priority })));
    assert.deepEqual(
      infos.map((t) => t.priority),
      order.map(([, p]) => p),
    );
    assert.deepEqual(await inspector.getTaskInfo('default', 'f').then((t) => [t.priority, t.concurrencyKey]), [100, null]);
    const ran: string[] = [];
    await startServer((_t, ctx) => void ran.push(ctx.taskId), { concurrency: 1 });
    await waitFor(() => ran.length === order.length, 10_000, 'every task');
    assert.deepEqual(ran, ['f', 'b', 'e', 'a', 'c', 'g', 'd', 'h']);
  });

  test('a higher priority enqueued while a backlog runs goes next, and every task of every priority runs once', { timeout: 30_000 }, async () => {
    // One task per claim (no prefetch): each claim shows the order. The server's claims
    // raise their floors as they go; the bands that appear later have floors of their own.
    await client.enqueueMany(Array.from({ length: 20 }, (_, i) => job(`low${String(i).padStart(2, '0')}`, null)));
    const ran: string[] = [];
    await startServer(
      async (_t, ctx) => {
        ran.push(ctx.taskId);
        if (ctx.taskId === 'low04') {
          await client.enqueueMany([
            job('urgent1', null, { priority: 5 }),
            job('late', null),
            job('urgent2', null, { priority: 5 }),
            job('last', null, { priority: -1 }),
          ]);
        }
      },
      { concurrency: 1, prefetch: 0 },
    );
    await waitFor(() => ran.length === 24, 20_000, 'every task');
    const lows = Array.from({ length: 20 }, (_, i) => `low${String(i).padStart(2, '0')}`);
    assert.deepEqual(ran, [...lows.slice(0, 5), 'urgent1', 'urgent2', ...lows.slice(5), 'late', 'last']);
  });

  test('replace and an UPDATE through the tasks view move a pending task to its new priority', { timeout: 30_000 }, async () => {
    await client.enqueueMany([job('a', 1), job('b', 2), job('c', 3), job('d', 4)]);
    const replaced = await client.enqueue(job('c', 'urgent', { priority: 1 }), { replace: true });
    assert.equal(replaced.priority, 1);
    await db.query(`UPDATE {{schema}}.tasks SET priority = 2 WHERE id = 'd'`);
    assert.deepEqual(await oneByOne(4, 'four tasks'), [
      ['d', 4],
      ['c', 'urgent'],
      ['a', 1],
      ['b', 2],
    ]);
  });

  test('priority and concurrencyKey are validated, naming the option', async () => {
    const bad: [object, string][] = [
      [{ priority: -101 }, 'priority'],
      [{ priority: 101 }, 'priority'],
      [{ priority: 1.5 }, 'priority'],
      [{ priority: '1' }, 'priority'],
      [{ priority: Number.NaN }, 'priority'],
      [{ concurrencyKey: '' }, 'concurrencyKey'],
      [{ concurrencyKey: '   ' }, 'concurrencyKey'],
      [{ concurrencyKey: 'k'.repeat(201) }, 'concurrencyKey'],
      [{ concurrencyKey: 'a\u0007b' }, 'concurrencyKey'],
      [{ concurrencyKey: 7 }, 'concurrencyKey'],
    ];
    for (const [options, field] of bad) {
      for (const attempt of [() => new Task('t', null, options), () => client.enqueue(new Task('t', null), options)]) {
        const err = await caught(attempt);
        assert.ok(err instanceof InvalidOptionError, `${JSON.stringify(options)}: ${String(err)}`);
        assert.equal(err.field, field);
      }
    }
    assert.equal((await db.query(`SELECT count(*)::int AS n FROM {{schema}}.tasks`))[0].n, 0, 'nothing written');
    const ok = await client.enqueue(new Task('t', null, { priority: -100, concurrencyKey: 'tenant ü/42' }));
    assert.deepEqual([ok.priority, ok.concurrencyKey], [-100, 'tenant ü/42']);
  });
});

describe('weighted queues within one claim', () => {
  test('a claim of 40 from queues weighted 3:1 takes 30 and 10, whatever the shuffle; what one queue lacks the other fills', async () => {
    await client.enqueueMany(Array.from({ length: 100 }, (_, i) => new Task('w', i, { queue: 'heavy' })));
    await client.enqueueMany(Array.from({ length: 100 }, (_, i) => new Task('w', i, { queue: 'light' })));
    const broker = new Db({ connectionString: db.connectionString, schema: db.schema });
    try {
      const weights = { heavy: 3, light: 1 };
      const claimOnce = async (limit: number, random: () => number) => {
        const order = queueOrder(weights, false, random);
        const { rows } = await claimFrom(broker, order, { bands: [], olderThan: null }, claimShares(weights, order, false, limit), limit, 'srv', 60_000);
        return { heavy: rows.filter((r) => r.queue === 'heavy').length, light: rows.filter((r) => r.queue === 'light').length };
      };
      // A shuffle that puts light first, and one that puts heavy first: the shares hold either way.
      assert.deepEqual(await claimOnce(40, () => 0.99), { heavy: 30, light: 10 });
      assert.deepEqual(await claimOnce(40, () => 0), { heavy: 30, light: 10 });
      // 40 heavy and 80 light left: a claim of 120 takes the rest of both.
      assert.deepEqual(await claimOnce(120, () => 0.5), { heavy: 40, light: 80 });
    } finally {
      await broker.close();
    }
  });
});
