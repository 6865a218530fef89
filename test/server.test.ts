import assert from 'node:assert/strict';
import { lookup } from 'node:dns/promises';
import { createServer, connect as tcpConnect, type Server as NetServer, type Socket } from 'node:net';
import { describe } from 'node:test';
import {
  Client,
  ConfigError,
  DatabaseUnavailableError,
  FailedPreconditionError,
  Inspector,
  PeriodicTaskManager,
  Scheduler,
  HandlerNotFoundError,
  RevokeTask,
  ServeMux,
  Server,
  SkipRetry,
  Task,
  TaskTimeoutError,
  ValidationError,
  defaultRetryDelay,
  migrate,
  type ServerConfig,
  type TaskContext,
} from '../src/index.js';
import { Db } from '../src/broker/db.js';
import { queueOrder } from '../src/server/queues.js';
import { FailureRun } from '../src/internal/logger.js';
import { backoffMs } from '../src/internal/backoff.js';
import { TcpProxy, reset as resetEveryConnection } from './faults/proxy.js';
import { claim } from './broker-helpers.js';
import { captureLog, LEVEL, parseLogLines, type LogLine } from './logs.js';
import { countByState, deferred, dsnWith, MIGRATIONS, runNode, setupDb, test, waitFor } from './helpers.js';

/** Fast durations for tests; each test empties the tables first. */
const { db, client, running, startServer, reset, taskRow, taskIn } = setupDb('t_server', {
  server: { concurrency: 4, taskCheckInterval: 50, delayedTaskCheckInterval: 50, leaseDuration: 2000, heartbeatInterval: 200 },
});

describe('outcomes', () => {
  test('success deletes the row and releases the unique lock', { timeout: 30_000 }, async () => {
    await reset();
    const info = await client.enqueue(new Task('ok', { a: 1 }), { unique: 60_000 });
    const seen = deferred<unknown>();
    const server = await startServer((task) => seen.resolve(task.payload));
    assert.deepEqual(await seen.promise, { a: 1 });
    await waitFor(async () => (await taskRow(info.id)) === undefined, 5000, 'row deleted');
    assert.equal((await db.query('SELECT * FROM {{schema}}.unique_locks')).length, 0);
    await server.shutdown();
  });

  test('success with retention keeps the task completed, with its result', { timeout: 30_000 }, async () => {
    await reset();
    const info = await client.enqueue(new Task('keep'), { retention: 60_000 });
    const server = await startServer(async (_t, ctx) => ctx.writeResult({ answer: 42 }));
    const row = await taskIn(info.id, 'completed');
    assert.deepEqual(row.result, { answer: 42 });
    assert.ok(row.completed_at instanceof Date);
    assert.equal(row.lease_token, null);
    const [{ secs }] = await db.query('SELECT extract(epoch FROM run_at - completed_at)::int AS secs FROM {{schema}}.tasks WHERE id = $1', [info.id]);
    assert.equal(secs, 60, 'kept until completed_at + retention');
    await server.shutdown();
  });

  test('failure retries with retried + 1, the error and the retry delay', { timeout: 30_000 }, async () => {
    await reset();
    const info = await client.enqueue(new Task('boom'), { maxRetry: 3 });
    const seen: number[] = [];
    const server = await startServer(
      (_t, ctx) => {
        seen.push(ctx.retryCount);
        throw new Error('kaput');
      },
      { retryDelay: (n) => (n === 0 ? 3_600_000 : 0) },
    );
    const row = await taskIn(info.id, 'retry');
    assert.equal(row.retried, 1);
    assert.equal(row.error_msg, 'kaput');
    assert.ok(row.last_failed_at instanceof Date);
    const [{ mins }] = await db.query('SELECT round(extract(epoch FROM run_at - now()) / 60)::int AS mins FROM {{schema}}.tasks WHERE id = $1', [info.id]);
    assert.equal(mins, 60);
    assert.deepEqual(seen, [0]);
    await server.shutdown();
  });

  test('retries run again once due, and the task is archived when retried reaches maxRetry', { timeout: 30_000 }, async () => {
    await reset();
    const info = await client.enqueue(new Task('always-fails'), { maxRetry: 2 });
    const attempts: number[] = [];
    const server = await startServer(
      (_t, ctx) => {
        attempts.push(ctx.retryCount);
        throw new Error(`attempt ${ctx.retryCount}`);
      },
      { retryDelay: () => 0 },
    );
    const row = await taskIn(info.id, 'archived');
    assert.deepEqual(attempts, [0, 1, 2], 'maxRetry 2 runs the task 3 times');
    assert.equal(row.retried, 2);
    assert.equal(row.error_msg, 'attempt 2');
    await server.shutdown();
    const [stats] = await db.query('SELECT processed::int, failed::int FROM {{schema}}.daily_stats WHERE queue = $1', ['default']);
    assert.deepEqual(stats, { processed: 3, failed: 3 });
  });

  test('maxRetry 0 runs once, then archives', { timeout: 30_000 }, async () => {
    await reset();
    const info = await client.enqueue(new Task('once'), { maxRetry: 0 });
    let runs = 0;
    const server = await startServer(() => {
      runs++;
      throw new Error('no');
    });
    await waitFor(async () => (await taskRow(info.id))?.state === 'archived');
    assert.equal(runs, 1);
    await server.shutdown();
  });

  test('SkipRetry archives at once, also when found on the cause chain', { timeout: 30_000 }, async () => {
    await reset();
    const a = await client.enqueue(new Task('skip'));
    const b = await client.enqueue(new Task('skip-wrapped'));
    const server = await startServer((t) => {
      if (t.type === 'skip') throw new SkipRetry('bad input');
      throw new Error('wrapper', { cause: new SkipRetry() });
    });
    await waitFor(async () => (await taskRow(a.id))?.state === 'archived' && (await taskRow(b.id))?.state === 'archived');
    assert.equal((await taskRow(a.id)).retried, 0);
    assert.equal((await taskRow(a.id)).error_msg, 'bad input');
    await server.shutdown();
  });

  test('RevokeTask deletes the task, even with retention', { timeout: 30_000 }, async () => {
    await reset();
    const info = await client.enqueue(new Task('revoke'), { retention: 60_000 });
    const ran = deferred();
    const server = await startServer(() => {
      ran.resolve();
      throw new RevokeTask();
    });
    await ran.promise;
    await waitFor(async () => (await taskRow(info.id)) === undefined);
    await server.shutdown();
  });

  test('an error isFailure rejects retries without using a retry', { timeout: 30_000 }, async () => {
    await reset();
    const info = await client.enqueue(new Task('transient'), { maxRetry: 1 });
    const server = await startServer(
      () => {
        throw new Error('rate limited');
      },
      { isFailure: (err) => err.message !== 'rate limited', retryDelay: () => 3_600_000 },
    );
    const row = await taskIn(info.id, 'retry');
    assert.equal(row.retried, 0);
    await server.shutdown();
    assert.equal((await db.query('SELECT * FROM {{schema}}.daily_stats')).length, 0, 'not counted as processed or failed');
  });

  test('errorHandler sees every failed attempt', { timeout: 30_000 }, async () => {
    await reset();
    await client.enqueue(new Task('err'), { maxRetry: 0 });
    const seen = deferred<[string, string]>();
    const server = await startServer(
      () => {
        throw new Error('handler said no');
      },
      { errorHandler: (err, task) => seen.resolve([err.message, task.type]) },
    );
    assert.deepEqual(await seen.promise, ['handler said no', 'err']);
    await server.shutdown();
  });

  test('a task with no handler fails like asynq NotFound and is retried', { timeout: 30_000 }, async () => {
    await reset();
    const info = await client.enqueue(new Task('nobody:handles'));
    const server = await startServer(
      new ServeMux().handle('email:', () => {}),
      { retryDelay: () => 3_600_000 },
    );
    const row = await taskIn(info.id, 'retry');
    assert.equal(row.error_msg, new HandlerNotFoundError('nobody:handles').message);
    assert.equal(row.error_msg, 'handler not found for task "nobody:handles"');
    await server.shutdown();
  });

  test('a non-Error thrown is retried with its text', { timeout: 30_000 }, async () => {
    await reset();
    const info = await client.enqueue(new Task('throws-string'));
    const server = await startServer(
      () => {
        throw 'boom';
      },
      { retryDelay: () => 3_600_000 },
    );
    const row = await taskIn(info.id, 'retry');
    assert.equal(row.error_msg, 'non-Error thrown: "boom"');
    await server.shutdown();
  });

  test('a retryDelay returning NaN falls back to the default delay', { timeout: 30_000 }, async () => {
    await reset();
    const info = await client.enqueue(new Task('nan-delay'));
    const server = await startServer(
      () => {
        throw new Error('x');
      },
      { retryDelay: () => Number.NaN },
    );
    const row = await taskIn(info.id, 'retry');
    const [{ secs }] = await db.query('SELECT extract(epoch FROM run_at - last_failed_at)::float8 AS secs FROM {{schema}}.tasks WHERE id = $1', [row.id]);
    assert.ok(secs >= 15 && secs < 45, `default delay for n = 0 is 15–44 s, got ${secs}`);
    await server.shutdown();
  });
});

describe('timeouts and deadlines', () => {
  test('a timeout aborts ctx.signal with TaskTimeoutError and retries the task', { timeout: 30_000 }, async () => {
    await reset();
    const info = await client.enqueue(new Task('slow'), { timeout: 100 });
    const reason = deferred<unknown>();
    const server = await startServer(
      (_t, ctx) =>
        new Promise<void>(() => {
          ctx.signal.addEventListener('abort', () => reason.resolve(ctx.signal.reason));
        }),
      { retryDelay: () => 3_600_000 },
    );
    assert.ok((await reason.promise) instanceof TaskTimeoutError);
    const row = await taskIn(info.id, 'retry');
    assert.equal(row.retried, 1);
    assert.match(row.error_msg, /timeout/);
    await server.shutdown();
  });

  test('a deadline aborts the handler when it passes', { timeout: 30_000 }, async () => {
    await reset();
    let reason: unknown;
    const started = deferred();
    const server = await startServer(
      (_t, ctx) =>
        new Promise<void>(() => {
          ctx.signal.addEventListener('abort', () => (reason = ctx.signal.reason));
          started.resolve();
        }),
      { retryDelay: () => 3_600_000 },
    );
    // Enqueued once the server runs, with time to spare for the claim: the handler runs, and
    // the deadline aborts it (a task claimed after its deadline is the next test's case).
    const info = await client.enqueue(new Task('deadline'), { deadline: new Date(Date.now() + 3000) });
    await started.promise;
    const row = await taskIn(info.id, 'retry');
    assert.equal(row.error_msg, 'task deadline exceeded');
    assert.ok(reason instanceof TaskTimeoutError, `the handler's signal was aborted with ${String(reason)}`);
    await server.shutdown();
  });

  test('a task whose deadline passed before it was claimed fails without running', { timeout: 30_000 }, async () => {
    await reset();
    const info = await client.enqueue(new Task('late'), { deadline: new Date(Date.now() + 60_000), maxRetry: 0 });
    await db.query("UPDATE {{schema}}.tasks SET deadline = now() - interval '1 second' WHERE id = $1", [info.id]);
    let ran = false;
    const server = await startServer(() => {
      ran = true;
    });
    const row = await taskIn(info.id, 'archived');
    assert.equal(ran, false);
    assert.equal(row.error_msg, 'task deadline exceeded');
    await server.shutdown();
  });
});

describe('scheduling', () => {
  test('a scheduled task runs once due; the forwarder is woken by the enqueue', { timeout: 30_000 }, async () => {
    await reset();
    const started = deferred<number>();
    const s2 = await startServer(() => started.resolve(Date.now()), { delayedTaskCheckInterval: 60_000 });
    const due = Date.now() + 400;
    const info = await client.enqueue(new Task('later'), { processAt: new Date(due) });
    assert.equal(info.state, 'scheduled');
    const at = await started.promise;
    assert.ok(at >= due - 50, 'not before it is due');
    assert.ok(at - due < 2000, `started ${at - due} ms after due, without waiting for the 60 s poll`);
    await s2.shutdown();
  });

  test('a completed task is deleted by the janitor once its retention ends', { timeout: 30_000 }, async () => {
    await reset();
    const info = await client.enqueue(new Task('short-retention'), { retention: 1000 });
    const server = await startServer(() => {}, { janitorInterval: 100 });
    await waitFor(async () => (await taskRow(info.id))?.state === 'completed');
    await waitFor(async () => (await taskRow(info.id)) === undefined, 5000, 'janitor deletes it');
    await server.shutdown();
  });

  test('the janitor deletes expired unique locks', { timeout: 30_000 }, async () => {
    await reset();
    await client.enqueue(new Task('u', 1), { unique: 60_000, processIn: 60_000 });
    await db.query("UPDATE {{schema}}.unique_locks SET expires_at = now() - interval '1 second'");
    const server = await startServer(() => {}, { janitorInterval: 50 });
    await waitFor(async () => (await db.query('SELECT * FROM {{schema}}.unique_locks')).length === 0);
    await server.shutdown();
  });
});

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
    const server = await startServer((_t, ctx) => void order.push(ctx.queue), { concurrency: 1, queues: { heavy: 3, light: 1 } });
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

describe('retry delay', () => {
  test("asynq's formula n^4 + 15 + rand(30)·(n + 1) seconds", { timeout: 30_000 }, () => {
    assert.equal(
      defaultRetryDelay(0, () => 0),
      15_000,
    );
    assert.equal(
      defaultRetryDelay(0, () => 0.999),
      44_000,
    );
    assert.equal(
      defaultRetryDelay(1, () => 0.5),
      (1 + 15 + 15 * 2) * 1000,
    );
    assert.equal(
      defaultRetryDelay(5, () => 0),
      (625 + 15) * 1000,
    );
    assert.equal(
      defaultRetryDelay(10, () => 0.999),
      (10_000 + 15 + 29 * 11) * 1000,
    );
  });
});

describe('configuration', () => {
  const bad: [string, ServerConfig, string][] = [
    ['concurrency 0', { concurrency: 0 }, 'concurrency'],
    ['concurrency 2.5', { concurrency: 2.5 }, 'concurrency'],
    ['heartbeat not below lease / 2', { leaseDuration: 30_000, heartbeatInterval: 15_000 }, 'heartbeatInterval'],
    ['negative recoverCutoff', { recoverCutoff: -1000 }, 'recoverCutoff'],
    ['NaN shutdownTimeout', { shutdownTimeout: Number.NaN }, 'shutdownTimeout'],
    ['empty queues', { queues: {} }, 'queues'],
    ['zero weight', { queues: { a: 0 } }, 'queues.a'],
    ['bad queue name', { queues: { 'a b': 1 } }, 'queues key "a b"'],
    ['unknown key', { concurency: 3 } as ServerConfig, 'config.concurency'],
    ['string retryDelay', { retryDelay: 'x' as never }, 'retryDelay'],
    ['groupGracePeriod 50 ms', { groupGracePeriod: 50 }, 'groupGracePeriod'],
    ['bad schema', { schema: 'a;b' }, 'schema'],
  ];
  for (const [name, config, field] of bad) {
    test(`refused: ${name}`, { timeout: 30_000 }, () => {
      assert.throws(
        () => new Server({ connectionString: db.connectionString, ...config }),
        (err: unknown) => err instanceof ValidationError && err.field === field,
      );
    });
  }

  test('start refuses a schema that lacks migrations, naming them; an up-to-date one starts', { timeout: 30_000 }, async () => {
    const schema = `${db.schema}_old`;
    await db.pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    await migrate({ connectionString: db.connectionString, schema, to: '0004_storage_v2', logger: false });
    const server = new Server({ connectionString: db.connectionString, schema, logger: false });
    await assert.rejects(
      server.start(() => {}),
      (err: unknown) => {
        assert.ok(err instanceof FailedPreconditionError);
        assert.match(
          err.message,
          new RegExp(
            `schema "t_server\\w*_old" lacks migrations ${MIGRATIONS.slice(MIGRATIONS.indexOf('0004_storage_v2') + 1).join(', ')}: run \`pgasynq migrate\``,
          ),
        );
        return true;
      },
    );
    assert.equal(server.status, 'new');
    assert.equal((await db.pool.query(`SELECT count(*)::int AS n FROM "${schema}".servers`)).rows[0].n, 0, 'nothing registered');
    await migrate({ connectionString: db.connectionString, schema, logger: false });
    await server.start(() => {});
    assert.equal(server.status, 'active');
    await server.shutdown();
    await db.pool.query(`DROP SCHEMA "${schema}" CASCADE`);
  });

  test('ConfigError is a ValidationError', { timeout: 30_000 }, () => {
    assert.ok(new ConfigError('x', 'y') instanceof ValidationError);
  });
});

describe('claim loop', () => {
  test('with every slot busy, a notification does not spin the loop: timers of running handlers still fire', { timeout: 30_000 }, async () => {
    await reset();
    await client.enqueue(new Task('busy'));
    const started = deferred();
    const timerFired = deferred();
    const server = await startServer(
      async (t) => {
        if (t.type !== 'busy') return;
        started.resolve();
        await new Promise((r) => setTimeout(r, 300));
        timerFired.resolve();
      },
      { concurrency: 1, taskCheckInterval: 10_000 },
    );
    await started.promise;
    // A notification arrives while the only slot is busy.
    await client.enqueue(new Task('second'));
    await timerFired.promise;
    await waitFor(async () => (await countByState(db)).pending === undefined && (await countByState(db)).active === undefined);
    await server.shutdown();
  });
});

describe('logging', () => {
  test('logLevel and logger are validated by every class that takes ConnectionOptions, naming the option', { timeout: 30_000 }, async () => {
    const cs = db.connectionString;
    const makers: [string, (o: object) => unknown][] = [
      ['Server', (o) => new Server({ connectionString: cs, ...o })],
      ['Client', (o) => new Client({ connectionString: cs, ...o })],
      ['Inspector', (o) => new Inspector({ connectionString: cs, ...o })],
      ['Scheduler', (o) => new Scheduler({ connectionString: cs, ...o })],
      ['PeriodicTaskManager', (o) => new PeriodicTaskManager({ connectionString: cs, getConfigs: () => [], ...o })],
      ['migrate', (o) => migrate({ connectionString: cs, schema: db.schema, ...o })],
    ];
    const bad: [object, string, RegExp][] = [
      [{ logLevel: 'verbose' }, 'logLevel', /^logLevel must be one of "debug", "info", "warn", "error" \(got "verbose"\)$/],
      [{ logLevel: 30 }, 'logLevel', /must be one of/],
      [{ logger: true }, 'logger', /^logger must be a pino-shaped logger \(with debug, info, warn, error, child methods\) or false \(got true\)$/],
      [{ logger: null }, 'logger', /got null/],
      [{ logger: { info() {}, warn() {} } }, 'logger', /pino-shaped/],
      [{ logger: captureLog().logger, logLevel: 'debug' }, 'logLevel', /default logger only/],
    ];
    for (const [name, make] of makers) {
      for (const [opts, field, message] of bad) {
        const err = await (async () => {
          try {
            await make(opts);
          } catch (e) {
            return e;
          }
          return undefined;
        })();
        assert.ok(err instanceof ConfigError, `${name} ${JSON.stringify(opts)}: ${String(err)}`);
        assert.equal(err.field, field, `${name} ${JSON.stringify(opts)}`);
        assert.match(err.message, message);
      }
    }
    // Accepted: a level alone, silence (a level with it is moot), a pino-shaped object.
    for (const opts of [{ logLevel: 'warn' }, { logger: false }, { logger: false, logLevel: 'debug' }, { logger: captureLog().logger }]) {
      const c = new Client({ connectionString: cs, ...opts } as never);
      await c.close();
    }
  });

  test('start and stop lines, a warn per failed attempt and an error at archive: fields, never the payload', { timeout: 30_000 }, async () => {
    await reset();
    const log = captureLog('info');
    const server = await startServer(
      (t) => {
        throw t.type === 'skip' ? new SkipRetry('do not retry') : new Error('boom 503');
      },
      { logger: log.logger, queues: { lg: 3, lg2: 1 }, concurrency: 2, retryDelay: () => 0 },
    );
    const started = await log.find('server started');
    assert.equal(started.level, LEVEL.info);
    assert.equal(started.component, 'server');
    assert.deepEqual(started.queues, { lg: 3, lg2: 1 });
    assert.equal(started.concurrency, 2);
    assert.equal(started.schema, db.schema);
    assert.equal(started.serverId, server.id);
    assert.match(String(started.database), /:\d+\/\w+$/);

    const twice = await client.enqueue(new Task('fail', { card: 'PAYLOAD-SENTINEL' }), { queue: 'lg', maxRetry: 1 });
    const skipped = await client.enqueue(new Task('skip', { card: 'PAYLOAD-SENTINEL' }), { queue: 'lg2' });
    const retried = await log.find('task failed; will retry', (l) => (l.task as { id: string }).id === twice.id);
    assert.equal(retried.level, LEVEL.warn);
    assert.equal(retried.component, 'processor');
    assert.deepEqual(retried.task, { id: twice.id, type: 'fail', queue: 'lg', attempt: 1 });
    assert.equal(retried.maxAttempts, 2, 'attempt 1 of 2: maxRetry 1 allows two runs');
    assert.equal(retried.retryInMs, 0);
    assert.deepEqual(
      { type: (retried.err as { type: string }).type, message: (retried.err as { message: string }).message },
      { type: 'Error', message: 'boom 503' },
    );
    assert.match((retried.err as { stack: string }).stack, /^Error: boom 503\n\s+at /);

    const exhausted = await log.find('task archived', (l) => (l.task as { id: string }).id === twice.id);
    assert.equal(exhausted.level, LEVEL.error);
    assert.equal(exhausted.reason, 'retries-exhausted');
    assert.equal((exhausted.task as { attempt: number }).attempt, 2);
    assert.equal(exhausted.maxAttempts, 2);
    const skip = await log.find('task archived', (l) => (l.task as { id: string }).id === skipped.id);
    assert.equal(skip.reason, 'skip-retry');
    assert.deepEqual(skip.task, { id: skipped.id, type: 'skip', queue: 'lg2', attempt: 1 });
    assert.equal((skip.err as { type: string }).type, 'SkipRetry');

    await server.shutdown();
    const stopped = await log.find('server stopped');
    assert.equal(stopped.level, LEVEL.info);
    assert.equal(stopped.serverId, server.id);
    assert.equal(stopped.claimed, 3);
    assert.deepEqual(
      log.raw.filter((l) => l.includes('PAYLOAD-SENTINEL')),
      [],
      'no payload in any line',
    );
    assert.ok(
      log.lines.every((l) => l.level >= LEVEL.info),
      'nothing below the level',
    );
  });

  test('at start, one warn per queue with pending tasks that no running server serves (a typo shows at once)', { timeout: 30_000 }, async () => {
    await reset();
    await client.enqueue(new Task('a'), { queue: 'served-elsewhere' });
    await client.enqueue(new Task('b'), { queue: 'emails' });
    await client.enqueue(new Task('c'), { queue: 'emails' });
    await client.enqueue(new Task('d'), { queue: 'email', processIn: 60_000 }); // scheduled, not pending: no warning
    // Rows of other servers: one live that serves a queue, one whose row expired and one stopped (neither serves).
    await db.query(`INSERT INTO {{schema}}.servers (id, host, pid, concurrency, queues, strict_priority, status, expires_at) VALUES
      ('live', 'h', 1, 1, '{"served-elsewhere": 1}', false, 'active', now() + interval '1 minute'),
      ('gone', 'h', 2, 1, '{"emails": 1}', false, 'active', now() - interval '1 second'),
      ('stopping', 'h', 3, 1, '{"emails": 1}', false, 'stopped', now() + interval '1 minute')`);
    const log = captureLog('warn');
    const server = await startServer(() => {}, { logger: log.logger, queues: { email: 1, default: 1 } });
    const warned = await log.find('queue has pending tasks but no running server serves it');
    await server.shutdown();
    const unserved = log.lines.filter((l) => l.msg === 'queue has pending tasks but no running server serves it');
    assert.deepEqual(
      unserved.map((l) => ({ queue: l.queue, pending: l.pending, level: l.level, component: l.component })),
      [{ queue: 'emails', pending: 2, level: LEVEL.warn, component: 'server' }],
    );
    assert.deepEqual(warned.servedQueues, ['default', 'email', 'served-elsewhere']);
  });
});

describe('failure runs', () => {
  test('failures that alternate with successes (a full max_connections) log one line per gap, not one per turn', async () => {
    const log = captureLog('info');
    const run = new FailureRun(log.logger, 'database unreachable; retrying in the background', 'database reachable again');
    for (let i = 0; i < 200; i++) {
      run.failed(new Error('sorry, too many clients already'));
      run.succeeded();
    }
    // Within the first gap (1 s): the first failure and its recovery only.
    assert.deepEqual(
      log.lines.map((l) => l.msg),
      ['database unreachable; retrying in the background', 'database reachable again'],
    );
    assert.equal(log.lines[0]!.failures, 1);
    // Flapping on for a little over the gap: one more pair, counting the whole run.
    let turns = 200;
    const until = performance.now() + 1100;
    while (performance.now() < until) {
      run.failed(new Error('sorry, too many clients already'));
      run.succeeded();
      turns++;
      await new Promise((r) => setTimeout(r, 20));
    }
    assert.equal(log.lines.length, 4);
    assert.ok((log.lines[2]!.failures as number) > 200 && (log.lines[2]!.failures as number) <= turns, 'the same run, counted whole');
  });

  test('a failure long after the last success starts a new run, logged at once', async () => {
    const log = captureLog('info');
    const run = new FailureRun(log.logger, 'down', 'up');
    run.failed(new Error('x'));
    run.succeeded();
    await new Promise((r) => setTimeout(r, 1050));
    run.failed(new Error('y'));
    assert.deepEqual(
      log.lines.map((l) => [l.msg, l.failures]),
      [
        ['down', 1],
        ['up', 1],
        ['down', 1],
      ],
    );
  });

  test('backoff: exponential with jitter in [½, 1] of its ceiling, capped', () => {
    assert.equal(
      backoffMs(0, 100, 5000, () => 0),
      50,
    );
    assert.equal(
      backoffMs(0, 100, 5000, () => 1),
      100,
    );
    assert.equal(
      backoffMs(3, 100, 5000, () => 1),
      800,
    );
    assert.equal(
      backoffMs(30, 100, 5000, () => 0),
      2500,
    );
    const draws = new Set(Array.from({ length: 50 }, () => backoffMs(2, 100, 5000)));
    assert.ok(draws.size > 40, 'processes that fail together retry apart');
    for (const d of draws) assert.ok(d >= 200 && d <= 400);
  });
});

describe('a database that cannot be used', () => {
  const bad = (parts: Parameters<typeof dsnWith>[0]): ServerConfig => ({ connectionString: dsnWith(parts), schema: db.schema, logger: false });

  test('unknown database: start rejects at once with DatabaseUnavailableError naming it', { timeout: 30_000 }, async () => {
    const server = new Server(bad({ database: 'no_such_db_xyz' }));
    const t0 = performance.now();
    await assert.rejects(
      server.start(() => {}),
      (err: unknown) => {
        assert.ok(err instanceof DatabaseUnavailableError, String(err));
        assert.equal(err.reason, 'database-not-found');
        assert.equal(err.code, 'ERR_DATABASE_UNAVAILABLE');
        assert.match(err.message, /^database "no_such_db_xyz" does not exist \(server [^)]+:\d+\/no_such_db_xyz\): create it/);
        assert.equal((err.cause as { code?: string }).code, '3D000');
        return true;
      },
    );
    assert.ok(performance.now() - t0 < 10_000, `rejected after ${Math.round(performance.now() - t0)} ms`);
    assert.equal(server.status, 'new');
    await server.shutdown();
  });

  test('unknown role: start rejects at once, naming the role', { timeout: 30_000 }, async () => {
    const server = new Server(bad({ user: 'no_such_role_xyz' }));
    const t0 = performance.now();
    await assert.rejects(
      server.start(() => {}),
      (err: unknown) => {
        assert.ok(err instanceof DatabaseUnavailableError, String(err));
        assert.equal(err.reason, 'authentication-failed');
        // Trust auth says the role does not exist (28000); password auth that its password failed (28P01).
        assert.match(err.message, /"no_such_role_xyz".*: check the user and password of the connection string$/);
        return true;
      },
    );
    assert.ok(performance.now() - t0 < 10_000);
    await server.shutdown();
  });

  test('unknown host: start rejects with host-not-found', { timeout: 30_000 }, async (t) => {
    const host = 'no-such-host.invalid';
    // Without a name server the lookup fails with EAI_AGAIN, which is retried, not refused.
    const code = await lookup(host).then(
      () => 'resolved',
      (e: { code?: string }) => e.code,
    );
    if (code !== 'ENOTFOUND') return t.skip(`the lookup of ${host} gives ${code} here, not ENOTFOUND`);
    const server = new Server(bad({ host }));
    await assert.rejects(
      server.start(() => {}),
      (err: unknown) => err instanceof DatabaseUnavailableError && err.reason === 'host-not-found' && err.message.includes(`"${host}"`),
    );
    await server.shutdown();
  });

  test('refused connection (port 1): start resolves, says so in a warn line, and keeps retrying', { timeout: 30_000 }, async () => {
    const log = captureLog('info');
    const server = new Server({ ...bad({ port: 1 }), logger: log.logger, taskCheckInterval: 50, heartbeatInterval: 100, leaseDuration: 1000 });
    const t0 = performance.now();
    await server.start(() => {});
    assert.ok(performance.now() - t0 < 10_000);
    assert.equal(server.status, 'active');
    const warn = await log.find('database unreachable; retrying in the background');
    assert.equal(warn.level, LEVEL.warn);
    assert.equal(warn.component, 'database');
    assert.match(String(warn.database), /:1\//);
    assert.match((warn.err as { message: string }).message, /ECONNREFUSED/);
    assert.ok(log.lines.some((l) => l.msg === 'server started'));
    // Rate-limited: the components retry every few ms to seconds, the warnings come with backoff.
    await new Promise((r) => setTimeout(r, 1500));
    const warnings = log.lines.filter((l) => l.level >= LEVEL.warn && l.component === 'database');
    assert.ok(warnings.length >= 1 && warnings.length <= 3, `${warnings.length} database warnings in 1.5 s`);
    assert.ok(
      log.lines.every((l) => l.level < LEVEL.error),
      'an unreachable database is no error line',
    );
    await server.shutdown();
  });

  test('a database that comes back: the server logs it and processes the waiting task', { timeout: 60_000 }, async () => {
    await reset();
    // A TCP proxy in front of the real server, closed at first: connections are refused.
    const target = new URL(db.connectionString);
    const probe = createServer();
    await new Promise<void>((r) => probe.listen(0, '127.0.0.1', r));
    const port = (probe.address() as { port: number }).port;
    await new Promise((r) => probe.close(r));
    const log = captureLog('info');
    const done = deferred();
    const server = new Server({
      ...bad({ host: '127.0.0.1', port }),
      logger: log.logger,
      taskCheckInterval: 50,
      delayedTaskCheckInterval: 50,
      heartbeatInterval: 100,
      leaseDuration: 1000,
    });
    running.push(server);
    await server.start(() => done.resolve());
    await log.find('database unreachable; retrying in the background');
    await client.enqueue(new Task('after-outage'));
    const sockets = new Set<Socket>();
    const proxy: NetServer = createServer((inbound) => {
      const outbound = tcpConnect(Number(target.port || 5432), target.hostname);
      sockets.add(inbound).add(outbound);
      inbound.pipe(outbound).pipe(inbound);
      const drop = () => (inbound.destroy(), outbound.destroy());
      inbound.on('error', drop).on('close', drop);
      outbound.on('error', drop).on('close', drop);
    });
    await new Promise<void>((r) => proxy.listen(port, '127.0.0.1', r));
    try {
      const back = await log.find('database reachable again');
      assert.equal(back.level, LEVEL.info);
      assert.ok((back.failures as number) >= 1);
      await done.promise;
      await server.shutdown();
    } finally {
      for (const s of sockets) s.destroy();
      await new Promise((r) => proxy.close(r));
    }
  });

  test('a server shut down while its listener cannot reconnect stops trying: nothing connects after the shutdown', { timeout: 30_000 }, async () => {
    await reset();
    const target = new URL(db.connectionString);
    const proxy = await TcpProxy.start({ targetHost: target.hostname, targetPort: Number(target.port || 5432) });
    try {
      const log = captureLog('info');
      const server = new Server({ connectionString: proxy.dsn(db.connectionString), schema: db.schema, logger: log.logger, taskCheckInterval: 50 });
      running.push(server);
      await server.start(() => {});
      let attempts = 0;
      proxy.server.on('connection', () => attempts++);
      // From now on every connection is reset: the listener loses its own and cannot get another.
      proxy.setMode(resetEveryConnection());
      await waitFor(() => attempts > 0, 10_000, 'a reconnection attempt');
      await log.find('listener cannot connect; polling for work until it can');
      await server.shutdown();
      const atShutdown = attempts;
      // The listener's retries came every 0.1–0.4 s by then: two seconds would show the next.
      await new Promise((r) => setTimeout(r, 2000));
      assert.equal(attempts, atShutdown, 'no connection attempt after the shutdown');
    } finally {
      await proxy.close();
    }
  });
});

describe('the default logger, as a user sees it', () => {
  test(
    'a server process writes JSON lines to stderr at info: start, unserved queue, failed attempt, archive, stop; logLevel warn keeps only warnings and errors',
    { timeout: 120_000 },
    async () => {
      const env = (schema: string, level?: string) => ({ DATABASE_URL: db.connectionString, SCHEMA: schema, ...(level ? { LOG_LEVEL: level } : {}) });
      const schemas = [`${db.schema}_dl_info`, `${db.schema}_dl_warn`];
      for (const schema of schemas) {
        await db.pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
        await migrate({ connectionString: db.connectionString, schema, logger: false });
      }
      const [info, warn] = await Promise.all([
        runNode(['test/fixtures/default-logger.ts'], env(schemas[0]!)),
        runNode(['test/fixtures/default-logger.ts'], env(schemas[1]!, 'warn')),
      ]);
      for (const schema of schemas) await db.pool.query(`DROP SCHEMA "${schema}" CASCADE`);
      assert.equal(info.code, 0, info.stderr);
      assert.equal(info.stdout, 'done\n');
      const lines = parseLogLines(info.stderr);
      assert.ok(
        lines.every((l) => l.name === 'pgasynq' && typeof l.time === 'number' && l.level >= LEVEL.info),
        'pino lines at info and up',
      );
      const messages = lines.map((l) => `${l.level} ${l.component}: ${l.msg}`);
      const expected = [
        '30 server: server started',
        '40 server: queue has pending tasks but no running server serves it',
        '40 processor: task failed; will retry',
        '50 processor: task archived',
        '30 server: server stopped',
      ];
      assert.deepEqual(messages, expected, info.stderr);
      const [started, unserved, failed, archived] = lines;
      assert.deepEqual(started!.queues, { email: 2, default: 1 });
      assert.equal(unserved!.queue, 'emails');
      assert.deepEqual(unserved!.servedQueues, ['default', 'email']);
      const attempt = (l: LogLine) => (l.task as { attempt: number }).attempt;
      assert.deepEqual([attempt(failed!), failed!.maxAttempts, (failed!.err as { message: string }).message], [1, 2, 'smtp down']);
      assert.deepEqual([attempt(archived!), archived!.maxAttempts, archived!.reason], [2, 2, 'retries-exhausted']);
      assert.ok(!info.stderr.includes('PAYLOAD-SENTINEL'), 'never a payload');

      assert.equal(warn.code, 0, warn.stderr);
      assert.deepEqual(
        parseLogLines(warn.stderr).map((l) => l.msg),
        ['queue has pending tasks but no running server serves it', 'task failed; will retry', 'task archived'],
      );
    },
  );
});
