/**
 * The Server's queues (strict and weighted priority, the order of a claim,
 * paused queues, FIFO), its row in the servers table and its counters, and
 * ServeMux.
 */
import assert from 'node:assert/strict';
import { describe } from 'node:test';
import { HandlerNotFoundError, ServeMux, Task, ValidationError, type TaskContext } from '../src/index.js';
import { Db } from '../src/broker/db.js';
import { queueOrder } from '../src/server/queues.js';
import { claim } from './broker-helpers.js';
import { countByState, test, waitFor } from './helpers.js';
import { serverFile } from './shared.js';

const { db, client, startServer, reset, taskRow } = serverFile('t_server_queues');

describe('queues', () => {
  test('strict priority: every task of a higher queue before any of a lower one', { timeout: 30_000 }, async () => {
    await reset();
    await client.enqueueMany(Array.from({ length: 20 }, (_, i) => new Task('p', i, { queue: 'low' })));
    await client.enqueueMany(Array.from({ length: 20 }, (_, i) => new Task('p', i, { queue: 'high' })));
    const order: string[] = [];
    const server = await startServer((_t, ctx) => void order.push(ctx.queue), { concurrency: 1, queues: { high: 5, low: 1 }, strictPriority: true });
    await waitFor(() => order.length === 40);
    assert.deepEqual(order, [...Array(20).fill('high'), ...Array(20).fill('low')]);
    await server.shutdown();
  });

  test('weighted priority: the share of each queue follows its weight', { timeout: 30_000 }, async () => {
    await reset();
    await client.enqueueMany(Array.from({ length: 300 }, (_, i) => new Task('w', i, { queue: 'heavy' })));
    await client.enqueueMany(Array.from({ length: 300 }, (_, i) => new Task('w', i, { queue: 'light' })));
    const order: string[] = [];
    // One task a claim (prefetch 0): the share follows each claim's weighted order, not the size of
    // the batches adaptive prefetch would bring, which the machine's timing decides.
    const server = await startServer((_t, ctx) => void order.push(ctx.queue), { concurrency: 1, prefetch: 0, queues: { heavy: 3, light: 1 } });
    await waitFor(() => order.length >= 200, 20_000);
    await server.shutdown();
    const heavy = order.slice(0, 200).filter((q) => q === 'heavy').length / 200;
    assert.ok(heavy > 0.6 && heavy < 0.9, `heavy share ${heavy} should be near 0.75`);
  });

  test('a claim takes the queues in the order it is given, whatever the plan', { timeout: 30_000 }, async () => {
    await reset();
    await client.enqueueMany(Array.from({ length: 5 }, (_, i) => new Task('w', i, { queue: 'heavy' })));
    await client.enqueueMany(Array.from({ length: 5 }, (_, i) => new Task('w', i, { queue: 'light' })));
    const broker = new Db({ connectionString: db.connectionString, schema: db.schema });
    try {
      for (const order of [
        ['light', 'heavy'],
        ['heavy', 'light'],
        ['light', 'heavy'],
        ['heavy', 'light'],
      ]) {
        const rows = await claim(broker, order, 2, 'order-test', 60_000);
        assert.deepEqual(
          rows.map((r) => r.queue),
          [order[0], order[0]],
          `claim in order ${order}`,
        );
      }
      // One task is left in each queue: the claim empties the first and goes on into the next.
      const rest = await claim(broker, ['light', 'heavy'], 3, 'order-test', 60_000);
      assert.deepEqual(
        rest.map((r) => r.queue),
        ['light', 'heavy'],
      );
    } finally {
      await broker.close();
    }
  });

  test('queueOrder: weighted order starts with each queue in proportion to its weight', { timeout: 30_000 }, () => {
    const first = new Map<string, number>();
    let seed = 1;
    const random = () => (seed = (seed * 16807) % 2147483647) / 2147483647;
    for (let i = 0; i < 10_000; i++) {
      const q = queueOrder({ critical: 6, default: 3, low: 1 }, false, random)[0] as string;
      first.set(q, (first.get(q) ?? 0) + 1);
    }
    assert.ok(Math.abs((first.get('critical') ?? 0) / 10_000 - 0.6) < 0.03);
    assert.ok(Math.abs((first.get('low') ?? 0) / 10_000 - 0.1) < 0.03);
    assert.deepEqual(queueOrder({ low: 1, critical: 6, default: 3 }, true), ['critical', 'default', 'low']);
  });

  test('a paused queue is skipped while others are served', { timeout: 30_000 }, async () => {
    await reset();
    const paused = await client.enqueue(new Task('x'), { queue: 'paused_q' });
    const open = await client.enqueue(new Task('x'), { queue: 'open_q' });
    await db.query("UPDATE {{schema}}.queues SET paused = true WHERE name = 'paused_q'");
    const ran: string[] = [];
    const server = await startServer((_t, ctx) => void ran.push(ctx.taskId), { queues: { paused_q: 1, open_q: 1 } });
    await waitFor(async () => (await taskRow(open.id)) === undefined);
    // A task enqueued later and run proves a later claim ran too: it still left the paused one.
    const later = await client.enqueue(new Task('x'), { queue: 'open_q' });
    await waitFor(async () => (await taskRow(later.id)) === undefined, 5000, 'a later claim');
    assert.equal((await taskRow(paused.id)).state, 'pending');
    await db.query("UPDATE {{schema}}.queues SET paused = false WHERE name = 'paused_q'");
    await waitFor(async () => (await taskRow(paused.id)) === undefined, 5000, 'served once unpaused');
    assert.deepEqual(ran, [open.id, later.id, paused.id]);
    await server.shutdown();
  });

  test('pending tasks run in FIFO order', { timeout: 30_000 }, async () => {
    await reset();
    const infos = await client.enqueueMany(Array.from({ length: 30 }, (_, i) => new Task('fifo', i)));
    for (let i = 0; i < 5; i++) await client.enqueue(new Task('fifo', 30 + i));
    const seen: number[] = [];
    const server = await startServer((t) => void seen.push(t.payload as number), { concurrency: 1 });
    await waitFor(() => seen.length === 35);
    assert.deepEqual(
      seen,
      Array.from({ length: 35 }, (_, i) => i),
    );
    assert.equal(infos.length, 30);
    await server.shutdown();
  });
});

describe('server bookkeeping', () => {
  test('the server registers itself while running and is gone after shutdown', { timeout: 30_000 }, async () => {
    await reset();
    const server = await startServer(() => {}, { queues: { a: 2, b: 1 }, concurrency: 3 });
    const [row] = await waitFor(async () => {
      const rows = await db.query('SELECT * FROM {{schema}}.servers WHERE id = $1', [server.id]);
      return rows.length ? rows : undefined;
    });
    assert.equal(row.concurrency, 3);
    assert.deepEqual(row.queues, { a: 2, b: 1 });
    assert.equal(row.pid, process.pid);
    assert.equal(row.status, 'active');
    await server.shutdown();
    assert.equal((await db.query('SELECT * FROM {{schema}}.servers WHERE id = $1', [server.id])).length, 0);
    assert.equal(server.status, 'closed');
  });

  test('processed and failed counts reach daily_stats in one row per queue and day', { timeout: 30_000 }, async () => {
    await reset();
    await client.enqueueMany(Array.from({ length: 50 }, (_, i) => new Task(i % 5 === 0 ? 'fail' : 'ok', i, { maxRetry: 0 })));
    const server = await startServer((t) => {
      if (t.type === 'fail') throw new Error('no');
    });
    await waitFor(async () => (await countByState(db)).archived === 10 && (await countByState(db)).pending === undefined);
    await server.shutdown();
    const rows = await db.query('SELECT queue, day, processed::int, failed::int FROM {{schema}}.daily_stats');
    assert.equal(rows.length, 1);
    assert.equal(rows[0].processed, 50);
    assert.equal(rows[0].failed, 10);
    const [q] = await db.query("SELECT processed_total::int, failed_total::int FROM {{schema}}.queues WHERE name = 'default'");
    assert.deepEqual(q, { processed_total: 50, failed_total: 10 });
  });

  test('start twice is refused; shutdown is idempotent', { timeout: 30_000 }, async () => {
    const server = await startServer(() => {});
    await assert.rejects(
      server.start(() => {}),
      ValidationError,
    );
    await Promise.all([server.shutdown(), server.shutdown()]);
    await assert.rejects(
      server.start(() => {}),
      /server closed/,
    );
  });
});

describe('ServeMux', () => {
  test('longest prefix wins; middleware runs first-added outermost', { timeout: 30_000 }, async () => {
    const calls: string[] = [];
    const mux = new ServeMux()
      .handle('email:', () => void calls.push('email:'))
      .handle('email:welcome', () => void calls.push('email:welcome'))
      .use((next) => (t, c) => {
        calls.push('outer');
        return next(t, c);
      })
      .use((next) => (t, c) => {
        calls.push('inner');
        return next(t, c);
      });
    const ctx = {} as TaskContext;
    await mux.processTask(new Task('email:welcome:v2'), ctx);
    await mux.processTask(new Task('email:reset'), ctx);
    assert.deepEqual(calls, ['outer', 'inner', 'email:welcome', 'outer', 'inner', 'email:']);
    await assert.rejects(async () => mux.processTask(new Task('sms'), ctx), HandlerNotFoundError);
    assert.throws(() => mux.handle('email:', () => {}), ValidationError);
    assert.throws(() => mux.handle('', () => {}), ValidationError);
  });
});
