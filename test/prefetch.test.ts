/**
 * ServerConfig.prefetch: claims beyond the free slots, held leased until a
 * slot frees, given back at stop without using a retry.
 */
import assert from 'node:assert/strict';
import { afterEach, describe } from 'node:test';
import { ConfigError, Server, Task } from '../src/index.js';
import { DatabaseClock } from '../src/internal/clock.js';
import { Prefetch } from '../src/server/prefetch.js';
import { countByState, deferred, setupDb, test, waitFor } from './helpers.js';
import { HOUR, LONG_LEASE, MINUTE } from './shared.js';

/** The database's time as this test's servers see it: moved forward instead of slept through (a new one per test). */
let clock = new DatabaseClock();
afterEach(() => void (clock = new DatabaseClock()));

/** `server` reads `clock` at each start: a test's own. */
const { db, client, startServer } = setupDb('t_prefetch', {
  resetEach: true,
  server: () => ({ clock, taskCheckInterval: 50, leaseDuration: 3000, heartbeatInterval: 300, recoverInterval: 100, recoverCutoff: 0, shutdownTimeout: 200 }),
});

/** Waits until `n` active tasks hold a lease with at least `remainingMs` left on the moved clock: a heartbeat landed. */
async function leasesExtended(n: number, remainingMs: number): Promise<void> {
  await waitFor(
    async () =>
      (
        await db.query(
          "SELECT count(*)::int AS n FROM {{schema}}.tasks WHERE state = 'active' AND lease_expires_at > now() + ($1::float8 + $2::float8) * interval '1 millisecond'",
          [clock.offsetMs, remainingMs],
        )
      )[0]!.n === n,
    10_000,
    `${n} leases extended`,
  );
}

const enqueueN = (n: number, opts = {}) =>
  client.enqueueMany(
    Array.from({ length: n }, (_, i) => new Task('held', { i })),
    opts,
  );

describe('adaptive prefetch (the default)', () => {
  test('short tasks: claims come to bring more tasks than there are slots', { timeout: 60_000 }, async () => {
    // Kept after completion, so each task's started_at (its claim's transaction time) stays readable.
    await enqueueN(3000, { retention: 60_000 });
    let done = 0;
    await startServer(async () => void done++, { concurrency: 2 });
    await waitFor(async () => (await countByState(db)).completed === 3000, 30_000, 'all completed');
    const [{ most }] = await db.query('SELECT max(n)::int AS most FROM (SELECT count(*) AS n FROM {{schema}}.task_states GROUP BY started_at) c');
    // Without prefetch a claim takes at most the free slots: 2.
    assert.ok(most > 2, `the largest claim brought ${most} tasks with concurrency 2`);
  });

  test('tasks slower than a claim round trip: none waits held for a slot', { timeout: 60_000 }, async () => {
    await enqueueN(6);
    const started: string[] = [];
    // Each handler takes ten minutes on the server's clock (moved, not slept through; within the
    // default timeout of 30): the time prefetch measures for it dwarfs any claim's round trip, so
    // none is held, however slow the machine.
    await startServer(
      async (_task, ctx) => {
        started.push(ctx.taskId);
        // (Unref'd: a real timer of ten minutes must not hold the process if the test fails first.)
        await new Promise<void>((resolve) => clock.setTimeout(resolve, 10 * MINUTE, true));
      },
      { concurrency: 2, ...LONG_LEASE },
    );
    for (const n of [2, 4, 6]) {
      // The n-th task started and the ones before it finished: only the two running are active,
      // the rest pending, claimable by any server. A held task would stay active, not pending.
      const expected = { active: 2, ...(n < 6 ? { pending: 6 - n } : {}) };
      await waitFor(
        async () => started.length === n && JSON.stringify(await countByState(db)) === JSON.stringify(expected),
        10_000,
        `tasks ${n - 1} and ${n} running, none held`,
      );
      clock.advance(10 * MINUTE);
    }
    await waitFor(async () => Object.keys(await countByState(db)).length === 0, 10_000, 'all done');
  });

  test('the count held: two round trips of starts, none when a task outlasts them', () => {
    const adaptive = (handlerMs: number, roundTripMs: number) => {
      const p = new Prefetch(null, 4, 1000);
      p.ran(handlerMs);
      p.claimed(roundTripMs);
      return p.count;
    };
    assert.equal(new Prefetch(null, 4, 1000).count, 0, 'nothing measured yet: none held');
    assert.equal(adaptive(1, 5), 40, '4 slots × 5 starts per round trip × 2 round trips');
    assert.equal(adaptive(100, 5), 0, 'a task longer than two round trips per slot: none held');
    assert.equal(adaptive(0.001, 50), 1000, 'never more than the maximum');
    assert.equal(new Prefetch(3, 4, 1000).count, 3, 'a configured count is used as it is');
  });
});

describe('prefetch', () => {
  test('a claim holds up to concurrency + prefetch tasks; no more than concurrency run', { timeout: 30_000 }, async () => {
    await enqueueN(20);
    const release = deferred();
    let runningNow = 0;
    let most = 0;
    await startServer(
      async () => {
        most = Math.max(most, ++runningNow);
        await release.promise;
        runningNow--;
      },
      { concurrency: 2, prefetch: 3 },
    );
    await waitFor(async () => (await countByState(db)).active === 5, 10_000, '5 active');
    assert.equal((await countByState(db)).pending, 15);
    // Held tasks keep their leases past two lease durations (heartbeats) and are never rescued:
    // the database's clock moves on a third of a lease at a time, each step once every lease
    // was extended past it (the recoverer runs every 100 ms with no cutoff meanwhile).
    for (let step = 0; step < 6; step++) {
      clock.advance(1000);
      await leasesExtended(5, 2500);
    }
    assert.deepEqual(await countByState(db), { active: 5, pending: 15 });
    assert.equal(most, 2);
    release.resolve();
    await waitFor(async () => Object.keys(await countByState(db)).length === 0, 10_000, 'all done');
    assert.equal(most, 2);
  });

  test('held tasks start in claim order as slots free', { timeout: 30_000 }, async () => {
    const infos = await enqueueN(12);
    const started: number[] = [];
    await startServer(
      async (task) => {
        started.push((task.payload as { i: number }).i);
        await new Promise((r) => setTimeout(r, 5));
      },
      { concurrency: 1, prefetch: 4 },
    );
    await waitFor(() => started.length === infos.length, 10_000, 'every task started');
    assert.deepEqual(
      started,
      infos.map((_, i) => i),
    );
  });

  test('stop gives held tasks back to pending at once, their retries unused', { timeout: 30_000 }, async () => {
    await enqueueN(6);
    const release = deferred();
    const server = await startServer(() => release.promise, { concurrency: 1, prefetch: 4 });
    await waitFor(async () => (await countByState(db)).active === 5, 10_000, '5 active');
    await server.stop();
    // One is running; the four held ones are pending again, untouched, with no lease.
    assert.deepEqual(await countByState(db), { active: 1, pending: 5 });
    const back = await db.query('SELECT retried, lease_token, error_msg FROM {{schema}}.tasks WHERE state = $1', ['pending']);
    assert.ok(back.every((r) => r.retried === 0 && r.lease_token === null && r.error_msg === null));
    release.resolve();
    await server.shutdown();
    assert.deepEqual(await countByState(db), { pending: 5 });
  });

  test('the time a task was held counts against its deadline, not its timeout', { timeout: 30_000 }, async () => {
    await client.enqueueMany([new Task('block')], { timeout: 2 * HOUR });
    const [late] = await client.enqueueMany([new Task('late')], { deadline: new Date(Date.now() + HOUR) });
    await client.enqueueMany([new Task('timed')], { timeout: HOUR / 2 });
    const ran = new Map<string, string>();
    const gate = deferred();
    const timedStarted = deferred();
    const timedMayEnd = deferred();
    await startServer(
      async (task, ctx) => {
        if (task.type === 'block') return gate.promise;
        timedStarted.resolve();
        const aborted = new Promise<string>((resolve) => ctx.signal.addEventListener('abort', () => resolve((ctx.signal.reason as Error).name)));
        ran.set(task.type, await Promise.race([aborted, timedMayEnd.promise.then(() => 'ran in full')]));
      },
      { concurrency: 1, prefetch: 2, retryDelay: () => HOUR, ...LONG_LEASE },
    );
    await waitFor(async () => (await countByState(db)).active === 3, 10_000, 'all three claimed');
    // Both wait behind the blocker for an hour and a minute of the server's clock: past the
    // deadline, and twice the timeout.
    clock.advance(HOUR + MINUTE);
    gate.resolve();
    // The timeout runs from the handler's start: the held task runs for most of it, and to its end.
    await timedStarted.promise;
    clock.advance(HOUR / 2 - MINUTE);
    timedMayEnd.resolve();
    await waitFor(() => ran.get('timed'), 10_000, 'timed ran');
    assert.equal(ran.get('timed'), 'ran in full');
    // The deadline passed while the task was held: it fails without its handler running.
    const row = await waitFor(
      async () => (await db.query('SELECT error_msg FROM {{schema}}.tasks WHERE id = $1 AND state = $2', [late!.id, 'retry']))[0],
      10_000,
      'late to retry',
    );
    assert.match(row.error_msg, /deadline/);
    assert.equal(ran.has('late'), false);
  });

  test('prefetch must be an integer in [0, 10000]', () => {
    for (const prefetch of [-1, 1.5, 10_001, '5']) {
      assert.throws(
        () => new Server({ connectionString: db.connectionString, prefetch: prefetch as number }),
        (err: unknown) => err instanceof ConfigError && err.field === 'prefetch',
      );
    }
  });
});
