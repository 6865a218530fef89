/**
 * Security tests SEC6 (NOTIFY spoofing) and SEC7 (cheap rejection) of the
 * reliability plan (§5.3), and the bound on stored errors (§3.6).
 */
import assert from 'node:assert/strict';
import { describe } from 'node:test';
import pg from 'pg';
import { Client, Inspector, InvalidCronSpecError, MAX_LAST_ERROR_BYTES, PayloadTooLargeError, Scheduler, Server, Task } from '../src/index.js';
import { parseSchedule } from '../src/model/cron.js';
import { lastErrorText } from '../src/server/retry.js';
import { caught, DATABASE_URL, test, waitFor } from './helpers.js';
import { MINUTE, securityFile } from './shared.js';

const MIB = 1_048_576;

const { db, pool, startServer, taskIn } = securityFile('t_security_limits');

// ---------------------------------------------------------------------------
describe('SEC6 NOTIFY spoofing', () => {
  test('10,000 NOTIFYs (random, empty, 7,999-byte) on our channel: the server stays up, keeps working, no claim storm', { timeout: 180_000 }, async (t) => {
    const CHANNEL = `${db.schema}_tasks`;
    // The server's own pool, counting its claim statements (named prepared statements "pgasynq:<schema>:claim").
    let claims = 0;
    const serverPool = new pg.Pool({ connectionString: DATABASE_URL, max: 10 });
    const query = serverPool.query.bind(serverPool) as (...args: unknown[]) => unknown;
    Object.assign(serverPool, {
      query: (...args: unknown[]) => {
        const first = args[0] as { name?: unknown } | undefined;
        if (typeof first?.name === 'string' && first.name.endsWith(':claim')) claims++;
        return query(...args);
      },
    });
    // A listener of our own, to know the flood was delivered.
    const listener = new pg.Client({ connectionString: DATABASE_URL });
    await listener.connect();
    let delivered = 0;
    listener.on('notification', (n) => n.channel === CHANNEL && delivered++);
    await listener.query(`LISTEN "${CHANNEL}"`);

    const done = new Set<string>();
    /** `claims` when each task's handler ran: the claim that brought it is counted, nothing after it. */
    const claimsAt = new Map<string, number>();
    // The poll is set far beyond the test's timeout: after the claim at start, every claim answers
    // a wake-up (a notification naming a served queue, or a finished task), so claims are counted
    // exactly instead of against what polling would allow in the time the flood took.
    const server = new Server({ pool: serverPool, schema: db.schema, logger: false, queues: { default: 1 }, concurrency: 4, taskCheckInterval: 10 * MINUTE });
    await server.start((task) => {
      const { n } = task.payload as { n: string };
      claimsAt.set(n, claims);
      done.add(n);
    });
    const client = new Client({ connectionString: DATABASE_URL, schema: db.schema });
    const sender = new pg.Client({ connectionString: DATABASE_URL });
    await sender.connect();
    /** Enqueues a task named `n` and waits until it ran: the server's listener got every notification sent before it. */
    const sentinel = async (n: string) => {
      await client.enqueue(new Task('real', { n }));
      await waitFor(() => done.has(n), 20_000, `task ${n} processed`);
      return claimsAt.get(n)!;
    };

    /** A valid-UTF-8 random string of `len` characters, some of them multi-byte. */
    const alphabet = 'abcXYZ019 _-:;\'"$\\{}[]é€😀\t';
    const random = (len: number) => Array.from({ length: len }, () => alphabet[Math.floor(Math.random() * alphabet.length)]).join('');
    let serial = 0;
    /** 100 distinct payloads per statement (PostgreSQL folds identical ones within a transaction): 1 empty, 10 of 7,999 bytes, 89 random. */
    const batch = () => [
      '',
      ...Array.from({ length: 10 }, () => `${serial++}:`.padEnd(7999, 'x')),
      ...Array.from({ length: 89 }, () => `${serial++}:${random(1 + Math.floor(Math.random() * 60))}`),
    ];
    const flood = async (statements: number) => {
      for (let i = 0; i < statements; i++) await sender.query('SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p', [CHANNEL, batch()]);
    };
    try {
      // The claim at start; then the server sleeps until woken.
      await waitFor(() => claims >= 1, 10_000, 'the first claim');
      const claims0 = claims;

      // 10,000 garbage notifications: only wake-up hints for queues we do not serve, so not one claim.
      const cpu0 = process.cpuUsage();
      const floodStart = performance.now();
      const delivered0 = delivered;
      await flood(100);
      await waitFor(() => delivered - delivered0 >= 10_000, 30_000, '10,000 notifications delivered');
      const afterGarbage = await sentinel('after-garbage');
      const cpu = process.cpuUsage(cpu0);
      t.diagnostic(
        `flood: ${delivered - delivered0} notifications in ${Math.round(performance.now() - floodStart)} ms; test process CPU ${Math.round((cpu.user + cpu.system) / 1000)} ms`,
      );
      assert.equal(server.status, 'active');
      assert.equal(afterGarbage - claims0, 1, 'no claim storm: the only claim since the flood began brought the task enqueued after it');

      // The worst case: 1,000 notifications naming a queue we serve, each in its own transaction.
      // Each is a wake-up; they coalesce while a claim is in flight, and never amplify: at most one
      // claim each, plus the next task's and the two wake-ups the task before it gave as it finished.
      for (let i = 0; i < 1000; i++) await sender.query('SELECT pg_notify($1, $2)', [CHANNEL, 'default']);
      const wakeClaims = (await sentinel('after-wake-ups')) - afterGarbage;
      t.diagnostic(`1,000 "default" notifications: ${wakeClaims} claims`);
      assert.ok(wakeClaims <= 1000 + 1 + 2, `no amplification: ${wakeClaims} claims for 1,000 wake-ups`);
      assert.equal(server.status, 'active');

      // During another flood, real tasks are still processed promptly.
      const during = flood(20);
      const ids = Array.from({ length: 20 }, (_, i) => `real-${i}`);
      await client.enqueueMany(ids.map((n) => new Task('real', { n })));
      await during;
      await waitFor(() => ids.every((n) => done.has(n)), 30_000, 'every real task processed during the flood');
      assert.equal(server.status, 'active');
      await sentinel('last');
    } finally {
      // (The server's pool once the server is done with it.)
      await Promise.all([sender.end(), listener.end(), client.close(), server.shutdown().then(() => serverPool.end())]);
    }
  });
});

// ---------------------------------------------------------------------------
describe('SEC7 cheap rejection', () => {
  test('a payload just over the cap is refused on the client, with no round trip', async () => {
    const client = new Client({ pool, schema: db.schema });
    const inspector = new Inspector({ pool, schema: db.schema });
    const small = new Client({ pool, schema: db.schema, maxPayloadBytes: 1000 });
    const sentBefore = pool.sent;
    for (const [attempt, message] of [
      [() => client.enqueue(new Task('big', 'x'.repeat(MIB - 1))), /^payload is 1048577 bytes as JSON; the limit is 1048576 \(option maxPayloadBytes\)$/],
      [() => client.enqueue(new Task('big', new Uint8Array(MIB + 1))), /^payload is 1048577 bytes; the limit is 1048576 \(option maxPayloadBytes\)$/],
      [
        () => client.enqueueMany([new Task('ok'), new Task('big', { s: 'x'.repeat(MIB) })]),
        /^tasks\[1\]\.payload is 1048584 bytes as JSON; the limit is 1048576/,
      ],
      [() => small.enqueue(new Task('big', 'é'.repeat(500))), /^payload is 1002 bytes as JSON; the limit is 1000 \(option maxPayloadBytes\)$/],
      [() => inspector.updateTaskPayload('default', 'some-id', 'x'.repeat(MIB - 1)), /^payload is 1048577 bytes as JSON; the limit is 1048576/],
    ] as const) {
      const err = await caught(attempt);
      assert.ok(err instanceof PayloadTooLargeError, String(err));
      assert.match(err.message, message);
    }
    assert.equal(pool.sent, sentBefore, 'no SQL sent');
  });

  // How fast is a figure for bench/, shown here as a diagnostic only: the test asserts what is
  // refused, and by which check (the length, before any parsing).
  test('a 10 KB cron string is refused before parsing, by its length', async (t) => {
    const scheduler = new Scheduler({ pool, schema: db.schema });
    const spec = `${'1,'.repeat(4999)}10`; // 10,000 characters of a list croner would parse
    assert.equal(spec.length, 10_000);
    const times: number[] = [];
    for (let i = 0; i < 21; i++) {
      const start = performance.now();
      const err = await caught(() => scheduler.register(spec, new Task('cron:t')));
      times.push(performance.now() - start);
      assert.ok(err instanceof InvalidCronSpecError, String(err));
      assert.equal(err.message, 'cronspec must be at most 256 characters (got 10000)');
    }
    assert.equal(scheduler.entryIds().length, 0);
    const median = [...times].sort((a, b) => a - b)[10]!;
    t.diagnostic(`10,000-character cron spec refused in ${times[0]!.toFixed(3)} ms (first call), ${median.toFixed(3)} ms (median of 21)`);
  });

  test('a long valid spec (every minute and hour listed) parses, to every minute', (t) => {
    const list = (n: number) => Array.from({ length: n }, (_, i) => i).join(',');
    const spec = `${list(60)} ${list(24)} * * *`;
    assert.ok(spec.length <= 256);
    const start = performance.now();
    const schedule = parseSchedule(spec);
    t.diagnostic(`a ${spec.length}-character spec parsed in ${(performance.now() - start).toFixed(3)} ms`);
    assert.deepEqual(
      [schedule.next(new Date(0)), schedule.next(new Date('2024-05-15T23:59:30Z'))].map((d) => d?.toISOString()),
      ['1970-01-01T00:01:00.000Z', '2024-05-16T00:00:00.000Z'],
    );
  });
});

// ---------------------------------------------------------------------------
describe(`stored errors: last_error is bounded (${MAX_LAST_ERROR_BYTES} bytes) and storable`, () => {
  test('lastErrorText: non-Errors described, NULs replaced, cut at 4 KiB of UTF-8 without splitting a character, passwords masked', () => {
    assert.equal(lastErrorText('boom'), 'non-Error thrown: "boom"');
    assert.equal(lastErrorText(undefined), 'non-Error thrown: undefined');
    assert.equal(lastErrorText(null), 'non-Error thrown: null');
    assert.equal(lastErrorText(42), 'non-Error thrown: 42');
    assert.equal(lastErrorText({ code: 7 }), 'non-Error thrown: {"code":7}');
    const cyclic: Record<string, unknown> = {};
    cyclic.self = cyclic;
    assert.equal(lastErrorText(cyclic), 'non-Error thrown: [object Object]');
    assert.equal(lastErrorText(new Error('')), 'Error');
    assert.equal(lastErrorText(new TypeError('bad')), 'bad');
    assert.equal(lastErrorText(new Error('a\u0000b')), 'a\uFFFDb');
    assert.equal(lastErrorText(new Error('x\uD800y')), 'x\uFFFDy');
    assert.equal(lastErrorText(new Error('to postgres://u:hunter2@db/x failed')), 'to postgres://u:***@db/x failed');
    for (const unit of ['x', 'é', '€', '😀']) {
      const text = lastErrorText(new Error(unit.repeat(10_000)));
      assert.ok(Buffer.byteLength(text) <= MAX_LAST_ERROR_BYTES, `${unit}: ${Buffer.byteLength(text)} bytes`);
      assert.ok(Buffer.byteLength(text) > MAX_LAST_ERROR_BYTES - 8, 'cut close to the bound');
      assert.ok(text.endsWith('… [truncated]'));
      assert.ok(text.isWellFormed(), 'no character split');
      assert.ok(!text.includes('\uFFFD'));
    }
    const exact = 'y'.repeat(MAX_LAST_ERROR_BYTES);
    assert.equal(lastErrorText(new Error(exact)), exact, 'a message at the bound is kept whole');
  });

  test('a handler error of 100 KB is stored cut to the bound', { timeout: 30_000 }, async () => {
    const client = new Client({ connectionString: DATABASE_URL, schema: db.schema });
    const server = await startServer(
      () => {
        throw new Error('é'.repeat(50_000));
      },
      { queues: { errbound: 1 }, retryDelay: () => 3_600_000 },
    );
    try {
      const info = await client.enqueue(new Task('long-error'), { queue: 'errbound' });
      const row = await taskIn(info.id, 'retry', 15_000);
      assert.ok(Buffer.byteLength(row.error_msg) <= MAX_LAST_ERROR_BYTES, `${Buffer.byteLength(row.error_msg)} bytes stored`);
      assert.ok(String(row.error_msg).endsWith('… [truncated]'));
    } finally {
      await server.shutdown();
      await client.close();
    }
  });

  test('a handler error holding a NUL character is stored (PostgreSQL text refuses NUL)', { timeout: 30_000 }, async () => {
    const client = new Client({ connectionString: DATABASE_URL, schema: db.schema });
    const server = await startServer(
      () => {
        throw new Error('bad\u0000byte');
      },
      { queues: { errnul: 1 }, retryDelay: () => 3_600_000 },
    );
    try {
      const info = await client.enqueue(new Task('nul-error'), { queue: 'errnul' });
      const row = await taskIn(info.id, 'retry', 10_000);
      assert.equal(row.error_msg, 'bad\uFFFDbyte');
    } finally {
      await server.shutdown();
      await client.close();
    }
  });
});
