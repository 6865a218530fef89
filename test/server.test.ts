import assert from 'node:assert/strict';
import { after, afterEach, before, describe, test } from 'node:test';
import {
  Client,
  ConfigError,
  FailedPreconditionError,
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
import { claim } from '../src/broker/leases.js';
import { queueOrder } from '../src/server/queues.js';
import { countByState, deferred, testDb, waitFor, type TestDb } from './helpers.js';

let db: TestDb;
let client: Client;

before(async () => {
  db = await testDb('t_server');
  client = new Client({ connectionString: db.connectionString, schema: db.schema });
});
/** Servers a test started: shut down after each test, even one that failed half-way. */
const running: Server[] = [];
afterEach(async () => {
  await Promise.all(running.splice(0).map((s) => s.shutdown()));
});

after(async () => {
  await client.close();
  await db.close();
});

/** Fast durations for tests; each test empties the tables first. */
async function startServer(handler: ServeMux | ((t: Task, c: TaskContext) => unknown), config: ServerConfig = {}): Promise<Server> {
  const server = new Server({
    connectionString: db.connectionString,
    schema: db.schema,
    concurrency: 4,
    taskCheckInterval: 50,
    delayedTaskCheckInterval: 50,
    leaseDuration: 2000,
    heartbeatInterval: 200,
    ...config,
  });
  running.push(server);
  await server.start(handler as ServeMux);
  return server;
}

async function reset(): Promise<void> {
  await db.query('TRUNCATE {{schema}}.tasks, {{schema}}.unique_locks, {{schema}}.daily_stats, {{schema}}.queues, {{schema}}.servers');
}

const taskRow = async (id: string) => (await db.query('SELECT * FROM {{schema}}.tasks WHERE id = $1', [id]))[0];

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
    const row = await waitFor(async () => {
      const r = await taskRow(info.id);
      return r?.state === 'completed' ? r : undefined;
    });
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
    const row = await waitFor(async () => {
      const r = await taskRow(info.id);
      return r?.state === 'retry' ? r : undefined;
    });
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
    const row = await waitFor(async () => {
      const r = await taskRow(info.id);
      return r?.state === 'archived' ? r : undefined;
    });
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
    const row = await waitFor(async () => {
      const r = await taskRow(info.id);
      return r?.state === 'retry' ? r : undefined;
    });
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
    const server = await startServer(new ServeMux().handle('email:', () => {}), { retryDelay: () => 3_600_000 });
    const row = await waitFor(async () => {
      const r = await taskRow(info.id);
      return r?.state === 'retry' ? r : undefined;
    });
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
    const row = await waitFor(async () => {
      const r = await taskRow(info.id);
      return r?.state === 'retry' ? r : undefined;
    });
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
    const row = await waitFor(async () => {
      const r = await taskRow(info.id);
      return r?.state === 'retry' ? r : undefined;
    });
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
    const row = await waitFor(async () => {
      const r = await taskRow(info.id);
      return r?.state === 'retry' ? r : undefined;
    });
    assert.equal(row.retried, 1);
    assert.match(row.error_msg, /timeout/);
    await server.shutdown();
  });

  test('a deadline aborts the handler when it passes', { timeout: 30_000 }, async () => {
    await reset();
    const info = await client.enqueue(new Task('deadline'), { deadline: new Date(Date.now() + 1500) });
    let reason: unknown;
    const server = await startServer(
      (_t, ctx) =>
        new Promise<void>(() => {
          ctx.signal.addEventListener('abort', () => (reason = ctx.signal.reason));
        }),
      { retryDelay: () => 3_600_000 },
    );
    const row = await waitFor(async () => {
      const r = await taskRow(info.id);
      return r?.state === 'retry' ? r : undefined;
    });
    assert.equal(row.error_msg, 'task deadline exceeded');
    // On a loaded machine the claim may come after the deadline: then the handler never runs.
    if (reason !== undefined) assert.ok(reason instanceof TaskTimeoutError);
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
    const row = await waitFor(async () => {
      const r = await taskRow(info.id);
      return r?.state === 'archived' ? r : undefined;
    });
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
      for (const order of [['light', 'heavy'], ['heavy', 'light'], ['light', 'heavy'], ['heavy', 'light']]) {
        const rows = await claim(broker, order, 2, 'order-test', 60_000);
        assert.deepEqual(rows.map((r) => r.queue), [order[0], order[0]], `claim in order ${order}`);
      }
      // One task is left in each queue: the claim empties the first and goes on into the next.
      const rest = await claim(broker, ['light', 'heavy'], 3, 'order-test', 60_000);
      assert.deepEqual(rest.map((r) => r.queue), ['light', 'heavy']);
    } finally {
      await broker.close();
    }
  });

  test('queueOrder: weighted order starts with each queue in proportion to its weight', { timeout: 30_000 }, () => {
    const first = new Map<string, number>();
    let seed = 1;
    const random = () => ((seed = (seed * 16807) % 2147483647) / 2147483647);
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
    await new Promise((r) => setTimeout(r, 200));
    assert.equal((await taskRow(paused.id)).state, 'pending');
    await db.query("UPDATE {{schema}}.queues SET paused = false WHERE name = 'paused_q'");
    await waitFor(async () => (await taskRow(paused.id)) === undefined, 5000, 'served once unpaused');
    assert.deepEqual(ran, [open.id, paused.id]);
    await server.shutdown();
  });

  test('pending tasks run in FIFO order', { timeout: 30_000 }, async () => {
    await reset();
    const infos = await client.enqueueMany(Array.from({ length: 30 }, (_, i) => new Task('fifo', i)));
    for (let i = 0; i < 5; i++) await client.enqueue(new Task('fifo', 30 + i));
    const seen: number[] = [];
    const server = await startServer((t) => void seen.push(t.payload as number), { concurrency: 1 });
    await waitFor(() => seen.length === 35);
    assert.deepEqual(seen, Array.from({ length: 35 }, (_, i) => i));
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
    const rows = await db.query("SELECT queue, day, processed::int, failed::int FROM {{schema}}.daily_stats");
    assert.equal(rows.length, 1);
    assert.equal(rows[0].processed, 50);
    assert.equal(rows[0].failed, 10);
    const [q] = await db.query("SELECT processed_total::int, failed_total::int FROM {{schema}}.queues WHERE name = 'default'");
    assert.deepEqual(q, { processed_total: 50, failed_total: 10 });
  });

  test('start twice is refused; shutdown is idempotent', { timeout: 30_000 }, async () => {
    const server = await startServer(() => {});
    await assert.rejects(server.start(() => {}), ValidationError);
    await Promise.all([server.shutdown(), server.shutdown()]);
    await assert.rejects(server.start(() => {}), /server closed/);
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
    assert.equal(defaultRetryDelay(0, () => 0), 15_000);
    assert.equal(defaultRetryDelay(0, () => 0.999), 44_000);
    assert.equal(defaultRetryDelay(1, () => 0.5), (1 + 15 + 15 * 2) * 1000);
    assert.equal(defaultRetryDelay(5, () => 0), (625 + 15) * 1000);
    assert.equal(defaultRetryDelay(10, () => 0.999), (10_000 + 15 + 29 * 11) * 1000);
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
    await migrate({ connectionString: db.connectionString, schema, to: '0002_views' });
    const server = new Server({ connectionString: db.connectionString, schema });
    await assert.rejects(server.start(() => {}), (err: unknown) => {
      assert.ok(err instanceof FailedPreconditionError);
      assert.match(err.message, /schema "t_server\w*_old" lacks migration 0003_active_index: run `pgasynq migrate`/);
      return true;
    });
    assert.equal(server.status, 'new');
    assert.equal((await db.pool.query(`SELECT count(*)::int AS n FROM "${schema}".servers`)).rows[0].n, 0, 'nothing registered');
    await migrate({ connectionString: db.connectionString, schema });
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
