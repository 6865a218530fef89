/**
 * What the test files split by topic share (server-*, security-*, leases-* and
 * scheduler-*, each file on a schema of its own), and the tools that let a
 * test check behaviour that depends on time without judging by the wall clock:
 *
 *   - a DatabaseClock moved forward instead of sleeping through a lease, a
 *     timeout, a deadline, a retention or a cutoff (LONG_LEASE, moveClock);
 *   - connections counted through a proxy instead of "it was fast"
 *     (refusedAtOnce);
 *   - a session that may not wait for a lock instead of "it did not wait
 *     long" (noLockWaitPool);
 *   - rate-limited log lines judged by the gaps they carry, not by how many
 *     came in some real time (assertRateLimited).
 */
import assert from 'node:assert/strict';
import pg from 'pg';
import { DatabaseUnavailableError, Scheduler, Task, type ServerConfig, type SchedulerOptions, type TaskContext } from '../src/index.js';
import type { DatabaseClock } from '../src/internal/clock.js';
import { TcpProxy } from './faults/proxy.js';
import type { LogLine } from './logs.js';
import { countedPool, DATABASE_URL, setupDb, type TestDb } from './helpers.js';

export const MINUTE = 60_000;
export const HOUR = 60 * MINUTE;

/**
 * For a server whose clock a test moves by minutes to hours while a task runs:
 * the worker trusts this lease for 3 h 20 min after each extension, and the
 * database holds it for 4 h, so a handler is aborted for what the test moved
 * the clock past (a timeout, a deadline, a shutdown), never for its lease.
 */
export const LONG_LEASE = { leaseDuration: 4 * HOUR } as const satisfies ServerConfig;

/** Moves `clock` forward to the time `to` gives for the database's time on it now (both in ms since the epoch). */
export async function moveClock(db: TestDb, clock: DatabaseClock, to: (now: number) => number): Promise<void> {
  const [row] = await db.query<{ now: Date }>('SELECT now() AS now');
  const now = row!.now.getTime() + clock.offsetMs;
  clock.advance(to(now) - now);
}

/**
 * Ten minutes past the next whole hour after `now`: a scheduler's pass once
 * the clock moved there finds exactly that hour's tick due, whatever real
 * time the step took (unless it took 50 minutes).
 */
export const nextHour = (now: number) => (Math.floor(now / HOUR) + 1) * HOUR + 10 * MINUTE;

/**
 * Runs `start` with `dsn` pointed at a TCP proxy of its own in front of the
 * same server, and returns the DatabaseUnavailableError it rejected with,
 * having checked that it opened one connection: "rejects at once" as a count
 * of attempts (no retry), not as a time that would judge the machine.
 */
export async function refusedAtOnce(dsn: string, start: (viaProxy: string) => Promise<unknown>): Promise<DatabaseUnavailableError> {
  const target = new URL(dsn);
  const proxy = await TcpProxy.start({ targetHost: target.hostname, targetPort: Number(target.port || 5432) });
  let refusal: unknown;
  try {
    refusal = await start(proxy.dsn(dsn)).then(
      () => assert.fail('started'),
      (err: unknown) => err,
    );
    assert.equal(proxy.connections.length, 1, 'one connection: not retried');
  } finally {
    await proxy.close();
  }
  assert.ok(refusal instanceof DatabaseUnavailableError, String(refusal));
  return refusal;
}

/**
 * A pool to the test database whose sessions may not wait for a lock: a
 * statement that would wait fails with lock_not_available (55P03) instead.
 * No lock in these tests is held for more than milliseconds unless the code
 * under test holds it across the test's next step, which is what this turns
 * from a hang into an error.
 */
export function noLockWaitPool(): pg.Pool {
  return new pg.Pool({ connectionString: DATABASE_URL, max: 2, options: '-c lock_timeout=5s' });
}

/**
 * A FailureRun's lines (internal/logger.ts): the first at once, each later
 * one at least a gap after the one before, the gap doubling from 1 s. Judged
 * by the `downMs` the lines carry, so a slow machine (fewer lines, later) passes.
 */
export function assertRateLimited(lines: readonly LogLine[]): void {
  assert.equal(lines[0]?.downMs, 0, 'the first failure of the run is logged at once');
  for (let i = 1, gap = 1000; i < lines.length; i++, gap *= 2) {
    const apart = (lines[i]!.downMs as number) - (lines[i - 1]!.downMs as number);
    // (downMs is rounded to the ms.)
    assert.ok(apart >= gap - 1, `line ${i} came ${apart} ms after the one before, within the ${gap} ms gap`);
    assert.ok((lines[i]!.failures as number) > (lines[i - 1]!.failures as number), 'the run is counted on');
  }
}

// ---- server-*.test.ts -------------------------------------------------------------------------

/** A server-* file's schema, with servers that poll, forward and heartbeat fast. */
export const serverFile = (name: string) =>
  setupDb(name, { server: { concurrency: 4, taskCheckInterval: 50, delayedTaskCheckInterval: 50, leaseDuration: 2000, heartbeatInterval: 200 } });

// ---- security-*.test.ts -----------------------------------------------------------------------

/** A security-* file's schema, and a real pool whose connect() and query() calls are counted ("no SQL sent"). */
export function securityFile(name: string) {
  const pool = countedPool();
  const file = setupDb(name, {
    server: { concurrency: 4, taskCheckInterval: 50, delayedTaskCheckInterval: 50, leaseDuration: 3000, heartbeatInterval: 300, shutdownTimeout: 2000 },
    teardown: () => pool.end(),
  });
  return { ...file, pool };
}

// ---- leases-*.test.ts -------------------------------------------------------------------------

/** Leases of a second that run out, and a recoverer that takes them back, within about 1.5 s. */
export const FAST_LEASES: ServerConfig = {
  concurrency: 4,
  taskCheckInterval: 50,
  delayedTaskCheckInterval: 50,
  leaseDuration: 1000,
  heartbeatInterval: 150,
  recoverInterval: 200,
  recoverCutoff: 300,
  retryDelay: () => 0,
  shutdownTimeout: 200,
};

/** A leases-* file's schema, with a side_effects table that handlers' transactions write to, and helpers on it. */
export function leasesFile(name: string) {
  const file = setupDb(name, {
    setup: (db) => db.query('CREATE TABLE {{schema}}.side_effects (task_id text NOT NULL, worker text NOT NULL)'),
    tables: { also: ['side_effects'] },
    server: FAST_LEASES,
  });
  const { db, client } = file;
  return {
    ...file,
    /** A handler whose transaction records that `worker` ran the task, then does `after` (still inside the transaction). */
    recordsEffect:
      (worker: string, after: () => void = () => {}) =>
      async (_t: Task, ctx: TaskContext) => {
        await ctx.transaction(async (trx) => {
          await trx.insertInto(`${db.schema}.side_effects`).values({ task_id: ctx.taskId, worker }).execute();
          after();
        });
      },
    /** Puts a new task straight into the active state, leased by a server that is gone, its lease running out at `leaseExpiresSql`. */
    activeTask: async (retried: number, maxRetry: number, leaseExpiresSql: string): Promise<string> => {
      const info = await client.enqueue(new Task('orphan'), { maxRetry, processIn: 3_600_000 });
      await db.query(
        `UPDATE {{schema}}.tasks SET state = 'active', retried = $2, run_at = NULL, lease_owner = 'gone',
           lease_token = gen_random_uuid(), lease_expires_at = ${leaseExpiresSql} WHERE id = $1`,
        [info.id, retried],
      );
      return info.id;
    },
  };
}

// ---- scheduler-*.test.ts ----------------------------------------------------------------------

export interface EventRow {
  tick_at: Date;
  task_id: string;
  enqueued_at: Date;
}

/** The ms between consecutive events. */
export const gapsMs = (ev: EventRow[]) => ev.slice(1).map((e, i) => e.tick_at.getTime() - ev[i]!.tick_at.getTime());

/** A scheduler-* file's schema; its schedulers and managers, pushed to `running`, are shut down after each test. */
export function schedulerFile(name: string) {
  const file = setupDb(name);
  const { db, running } = file;
  const events = (entryId: string) =>
    db.query<EventRow>('SELECT tick_at, task_id, enqueued_at FROM {{schema}}.scheduler_events WHERE entry_id = $1 ORDER BY tick_at', [entryId]);
  return {
    ...file,
    events,
    /** A Scheduler on the file's schema, logging off, refreshing its entries every 200 ms. */
    scheduler: (opts: SchedulerOptions = {}): Scheduler => {
      const s = new Scheduler({ connectionString: db.connectionString, schema: db.schema, logger: false, heartbeatInterval: 200, ...opts });
      running.push(s);
      return s;
    },
    /**
     * Every event names a task that exists, no two events share a tick or a
     * task, and there are as many tasks of `type` as events: one task per tick.
     */
    assertOneTaskPerTick: async (entryId: string, type: string): Promise<EventRow[]> => {
      const ev = await events(entryId);
      const tasks = await db.query<{ id: string }>('SELECT id FROM {{schema}}.tasks WHERE type = $1', [type]);
      assert.equal(tasks.length, ev.length, `tasks (${tasks.length}) = events (${ev.length})`);
      assert.equal(new Set(ev.map((e) => e.tick_at.getTime())).size, ev.length, 'one event per tick');
      assert.deepEqual(new Set(ev.map((e) => e.task_id)), new Set(tasks.map((t) => t.id)), 'each event names its own task');
      for (const e of ev) assert.equal(e.tick_at.getTime() % 1000, 0, 'ticks on whole seconds');
      return ev;
    },
  };
}
