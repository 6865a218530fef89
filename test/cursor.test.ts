/**
 * The claim cursor (server/cursor.ts): claims start above a floor that rises
 * behind them, so a held snapshot's dead index entries are not stepped over
 * again and again; and no task is ever left below a floor for longer than a
 * notification takes, however late its transaction commits.
 */
import assert from 'node:assert/strict';
import { describe } from 'node:test';
import pg from 'pg';
import { Task } from '../src/index.js';
import { HEAD, type ClaimMark } from '../src/broker/claim.js';
import { DatabaseClock } from '../src/internal/clock.js';
import { ClaimCursor, SWEEP_EVERY_MS } from '../src/server/cursor.js';
import { setupDb, test, waitFor } from './helpers.js';

const { db, client, running, startServer } = setupDb('t_cursor', { resetEach: true, server: { taskCheckInterval: 50, shutdownTimeout: 200 } });

/**
 * A server clock that stands still but for advance(). The cursor sweeps from the head of every
 * queue every SWEEP_EVERY_MS of its server's clock: on this one, only the sweep at start comes.
 * A task below a floor is then found by the path under test or never (the wait for it fails),
 * however long the test takes, instead of "found before the periodic sweep" by the wall clock.
 */
class StillClock extends DatabaseClock {
  readonly #at = performance.now();
  override now(): number {
    return this.#at + this.offsetMs;
  }
}

describe('claim cursor', () => {
  test('a task whose transaction commits after later tasks were claimed is still claimed, without a periodic sweep', { timeout: 60_000 }, async () => {
    const done: number[] = [];
    await startServer((t) => void done.push(t.payload as number), { concurrency: 1, clock: new StillClock() });
    // The queue exists first: an open transaction that registers it would hold up every other enqueue.
    await client.enqueue(new Task('late', -1));
    await waitFor(() => done.includes(-1), 10_000, 'the queue registered');
    // Task 0 draws its position inside a transaction that stays open…
    const late = new pg.Client({ connectionString: db.connectionString });
    await late.connect();
    try {
      await late.query('BEGIN');
      await client.enqueue(new Task('late', 0), { tx: late });
      // …while tasks drawn after it are enqueued, claimed and done, many claims over.
      for (let i = 1; i <= 30; i++) await client.enqueue(new Task('late', i));
      await waitFor(() => done.length === 31, 20_000, '30 later tasks done');
      await late.query('COMMIT');
    } finally {
      await late.end();
    }
    // No periodic sweep on the server's still clock: the claims after the commit find task 0 only
    // if the floor never rose past its position.
    await waitFor(() => done.includes(0), 20_000, 'the late task done');
  });

  test('a task requeued to the front by another server is claimed through the sweep channel, without a periodic sweep', { timeout: 60_000 }, async () => {
    const done: string[] = [];
    const busy = new Set<string>();
    // Server A holds a task (its handler waits for shutdown) while B drains the rest above it.
    const a = await startServer(
      (_t, ctx) =>
        new Promise<void>((resolve) => {
          busy.add(ctx.taskId);
          ctx.signal.addEventListener('abort', () => resolve());
        }),
      { concurrency: 1, prefetch: 0, shutdownTimeout: 100 },
    );
    const first = await client.enqueue(new Task('front', 0));
    await waitFor(() => busy.has(first.id), 10_000, 'A holds the first task');
    // B's clock stands still: it sweeps at start, and then only when told to.
    await startServer((_t, ctx) => void done.push(ctx.taskId), { concurrency: 1, clock: new StillClock() });
    for (let i = 1; i <= 20; i++) await client.enqueue(new Task('front', i));
    await waitFor(() => done.length === 20, 20_000, 'B drained the later tasks');
    // A stops: the task goes back to the front of pending, below B's floor, and only the sweep
    // channel's notification can make B look there.
    await a.shutdown();
    running.splice(running.indexOf(a), 1);
    await waitFor(() => done.includes(first.id), 20_000, 'B ran the requeued task');
  });

  test(
    'under a held snapshot and a long transaction elsewhere, claims do not step over the dead entries of earlier claims again',
    { timeout: 120_000 },
    async (t) => {
      const n = 1500;
      // A REPEATABLE READ snapshot held by another session: no dead row of the queue can be vacuumed.
      const holder = new pg.Client({ connectionString: db.connectionString });
      await holder.connect();
      await holder.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
      await holder.query('SELECT count(*) FROM pg_class');
      // A transaction with an id, open throughout, that never touches the queue (another
      // application's batch job): every snapshot's xmin stays behind it, so the floors
      // must rise on what holds task_seq, not on xmin.
      const bystander = new pg.Client({ connectionString: db.connectionString });
      await bystander.connect();
      await bystander.query('BEGIN');
      await bystander.query('SELECT pg_current_xact_id()');
      // A session sends its statistics as it ends, before it leaves pg_stat_activity: once the servers'
      // sessions are gone, every index read of theirs is counted (no wait for a periodic report).
      const reads = async () => {
        await waitFor(
          async () => (await db.query('SELECT 1 FROM pg_stat_activity WHERE application_name = $1', [`pgasynq:server:${process.pid}`])).length === 0,
          20_000,
          "the servers' sessions gone",
        );
        const rows = await db.query(
          "SELECT pg_stat_clear_snapshot(), (SELECT idx_tup_read FROM pg_stat_user_indexes WHERE schemaname = $1 AND indexrelname = 'task_states_pending_idx')::float8 AS n",
          [db.schema],
        );
        return rows[0]!.n as number;
      };
      try {
        const before = await reads();
        let done = 0;
        // One task per claim: n claims, each of which would start at the head of the queue. On a still
        // clock, the sweep at start is the only one, however long the claims take on this machine.
        const server = await startServer(() => void done++, { concurrency: 1, prefetch: 0, clock: new StillClock() });
        for (let i = 0; i < n; i += 100) await client.enqueueMany(Array.from({ length: 100 }, (_, j) => new Task('snap', i + j)));
        await waitFor(() => done === n, 90_000, 'all done');
        await server.shutdown();
        const read = (await reads()) - before;
        t.diagnostic(`the pending index was read ${read} times for ${n} claims`);
        // From the head, the k-th claim reads the k dead entries before it: about n²/2 = 1,125,000.
        // Above a floor it reads what is left of the queue.
        assert.ok(read < 20 * n, `the pending index was read ${read} times for ${n} claims`);
      } finally {
        await Promise.all(
          [holder, bystander].map(async (c) => {
            await c.query('ROLLBACK');
            await c.end();
          }),
        );
      }
    },
  );
});

describe('claim cursor: a sweep and the floors after it', () => {
  /** A claim's mark whose snapshot saw every transaction before `xmin` end. */
  const mark = (drawn: bigint, xid: bigint, xmin: bigint, paused: string[] = []): ClaimMark => ({
    drawn,
    xid,
    xmin,
    drawersGone: null,
    paused,
    limited: [],
    locked: 0,
  });
  const top = (position: bigint) => new Map([['q', new Map([[0, position]])]]);
  const floorOf = (cursor: ClaimCursor) => cursor.next(['q']).bands.find((b) => b.queue === 'q')?.floor;

  /** A cursor whose band of queue q (priority 0) has risen to 60, and the clock that paces its sweeps. */
  function risen(): { cursor: ClaimCursor; clock: { at: number; now: () => number } } {
    const clock = { at: 0, now: () => clock.at };
    const cursor = new ClaimCursor(clock);
    assert.deepEqual(cursor.next(['q']).bands, [], 'the sweep at start knows no band');
    cursor.claimed(mark(100n, 10n, 10n), 10, top(50n), 10, ['q']);
    assert.equal(floorOf(cursor), HEAD);
    // This claim's snapshot saw every transaction older than the last claim's end: the floor
    // rises to the highest position it took.
    cursor.claimed(mark(200n, 20n, 11n), 10, top(60n), 10, ['q']);
    assert.equal(floorOf(cursor), '60');
    return { cursor, clock };
  }

  test('a sweep that took every task it could starts the next claims from the floors again', () => {
    const { cursor, clock } = risen();
    cursor.claimed(mark(300n, 30n, 12n), 10, top(70n), 10, ['q']);
    clock.at += SWEEP_EVERY_MS;
    assert.equal(floorOf(cursor), HEAD, 'the sweep starts from the head');
    // Three of ten: every scan ran out. The transaction of the last mark still runs, so nothing
    // may rise; the floor from before the sweep holds.
    cursor.claimed(mark(400n, 40n, 12n), 10, top(80n), 3, ['q']);
    assert.equal(floorOf(cursor), '60');
  });

  test('a sweep that took as many as it asked for leaves the next claims at the head', () => {
    const { cursor, clock } = risen();
    cursor.claimed(mark(300n, 30n, 12n), 10, top(70n), 10, ['q']);
    clock.at += SWEEP_EVERY_MS;
    assert.equal(floorOf(cursor), HEAD);
    // Ten of ten: tasks may be left below the old floor, for the claims from the head to take.
    cursor.claimed(mark(400n, 40n, 12n), 10, top(-5n), 10, ['q']);
    assert.equal(floorOf(cursor), HEAD);
  });

  test('a sweep restores no floor of a queue it did not scan (paused)', () => {
    const { cursor, clock } = risen();
    clock.at += SWEEP_EVERY_MS;
    assert.equal(floorOf(cursor), HEAD);
    cursor.claimed(mark(300n, 30n, 12n, ['q']), 10, new Map(), 0, ['q']);
    assert.equal(floorOf(cursor), HEAD, 'paused: nothing is known of q');
  });

  test('a claim after a sweep whose claim failed restores nothing', () => {
    const { cursor, clock } = risen();
    clock.at += SWEEP_EVERY_MS;
    assert.equal(floorOf(cursor), HEAD, 'the sweep; its claim fails (no claimed())');
    assert.equal(floorOf(cursor), HEAD, 'the claim after it starts at the head too');
    cursor.claimed(mark(300n, 30n, 12n), 10, new Map(), 0, ['q']);
    assert.equal(floorOf(cursor), HEAD);
  });
});
