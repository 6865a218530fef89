/**
 * What a Server logs: its start and stop lines, failed attempts and archives
 * (never a payload), queues no server serves, rate-limited runs of failures,
 * and the default logger as a user's process writes it.
 */
import assert from 'node:assert/strict';
import { describe } from 'node:test';
import { SkipRetry, Task, migrate } from '../src/index.js';
import { backoffMs } from '../src/internal/backoff.js';
import { FailureRun } from '../src/internal/logger.js';
import { captureLog, LEVEL, parseLogLines, type LogLine } from './logs.js';
import { runNode, test } from './helpers.js';
import { serverFile } from './shared.js';

const { db, client, startServer, reset } = serverFile('t_server_logging');

describe('logging', () => {
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

/**
 * Runs `fn` with the monotonic clock FailureRun reads (performance.now) standing at
 * `at.ms`, which `fn` moves: the gaps of a run without waiting them out. `fn` is
 * synchronous, so nothing else in the process reads the stand-in.
 */
function onMovedTime(fn: (at: { ms: number }) => void): void {
  const real = performance.now.bind(performance);
  // Whole milliseconds: moves of 20 ms add up exactly (fractions would drift, 50 × 20 falling short of 1000).
  const at = { ms: Math.ceil(real()) };
  performance.now = () => at.ms;
  try {
    fn(at);
  } finally {
    performance.now = real;
  }
}

describe('failure runs', () => {
  test('failures that alternate with successes (a full max_connections) log one line per gap, not one per turn', () => {
    const log = captureLog('info');
    const run = new FailureRun(log.logger, 'database unreachable; retrying in the background', 'database reachable again');
    const flap = () => {
      run.failed(new Error('sorry, too many clients already'));
      run.succeeded();
    };
    onMovedTime((at) => {
      for (let i = 0; i < 200; i++) flap();
      // Within the first gap (1 s): the first failure and its recovery only.
      assert.deepEqual(
        log.lines.map((l) => l.msg),
        ['database unreachable; retrying in the background', 'database reachable again'],
      );
      assert.equal(log.lines[0]!.failures, 1);
      // Flapping on, a turn every 20 ms, for a little over the gap: one more pair, at the
      // 50th turn (1 s after the first line), counting the whole run.
      for (let turn = 0; turn < 55; turn++) {
        at.ms += 20;
        flap();
      }
    });
    assert.deepEqual(
      log.lines.map((l) => [l.msg, l.failures, l.downMs]),
      [
        ['database unreachable; retrying in the background', 1, 0],
        ['database reachable again', 1, 0],
        ['database unreachable; retrying in the background', 250, 1000],
        ['database reachable again', 250, 1000],
      ],
    );
  });

  test('a failure long after the last success starts a new run, logged at once', () => {
    const log = captureLog('info');
    const run = new FailureRun(log.logger, 'down', 'up');
    onMovedTime((at) => {
      run.failed(new Error('x'));
      run.succeeded();
      at.ms += 1050;
      run.failed(new Error('y'));
    });
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
    for (const [attempt, draw, ms] of [
      [0, 0, 50],
      [0, 1, 100],
      [3, 1, 800],
      [30, 0, 2500],
    ] as const) {
      assert.equal(
        backoffMs(attempt, 100, 5000, () => draw),
        ms,
        `attempt ${attempt}, draw ${draw}`,
      );
    }
    const draws = new Set(Array.from({ length: 50 }, () => backoffMs(2, 100, 5000)));
    assert.ok(draws.size > 40, 'processes that fail together retry apart');
    for (const d of draws) assert.ok(d >= 200 && d <= 400);
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
