/**
 * F17b lock-order races (reliability plan §5.2, R11): the two races F17's
 * storm (f17-deadlock-storm.test.ts) hits only by luck, each on its own:
 * servers flushing their stats counters over the same queues in different
 * orders (a deadlock before the fix in src/broker/servers.ts), and producers
 * resending the same batch of taskIds, or of unique tasks, in different orders
 * (enqueueMany). PostgreSQL detects deadlocks after 100 ms; checked:
 * pg_stat_database.deadlocks did not move, and nothing but the documented
 * errors reached the callers.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Client, DuplicateTaskError, Task, TaskIdConflictError } from '../../src/index.js';
import { Db } from '../../src/broker/db.js';
import { addStats } from '../../src/broker/servers.js';
import { recordFigures } from './harness.js';
import { ownedSchema, sqlState } from './kit.js';

const SCHEMA = 'f17';
const db = ownedSchema(SCHEMA, { cluster: { settings: { deadlock_timeout: "'100ms'", log_lock_waits: 'on' } } });
const q = db.q;

/** Runs `fn` on `n` workers until `ms` passed; returns the SQLSTATEs (or names) of what rejected. */
async function hammer(n: number, ms: number, fn: (worker: number) => Promise<unknown>, expected: (err: unknown) => boolean = () => false) {
  const errors = new Map<string, number>();
  let calls = 0;
  const until = performance.now() + ms;
  await Promise.all(
    Array.from({ length: n }, async (_, w) => {
      while (performance.now() < until) {
        calls++;
        try {
          await fn(w);
        } catch (err) {
          if (expected(err)) continue;
          const k = sqlState(err) ?? (err as Error).name;
          errors.set(k, (errors.get(k) ?? 0) + 1);
        }
      }
    }),
  );
  return { calls, errors: Object.fromEntries(errors) };
}

test('F17: stats flushes of many servers over the same queues, in any order, never deadlock', async () => {
  const queues = Array.from({ length: 8 }, (_, i) => `stats${i}`);
  await q(`INSERT INTO {{schema}}.queues (name) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING`, [queues]);
  const dbs = Array.from({ length: 6 }, () => new Db({ connectionString: db.cluster.connectionString, schema: SCHEMA }));
  const before = await db.deadlocks();
  const [totalBefore] = await q<{ n: number }>(`SELECT coalesce(sum(processed_total), 0)::int AS n FROM {{schema}}.queues WHERE name = ANY($1)`, [queues]);
  try {
    // What StatsCollector.flush() sends: each server's counts in the order its queues first finished a task.
    const r = await hammer(dbs.length, 2500, (w) =>
      addStats(
        dbs[w]!,
        [...queues].sort(() => Math.random() - 0.5).map((queue) => ({ queue, processed: 1, failed: 0 })),
      ),
    );
    const delta = (await db.deadlocks()) - before;
    const [totals] = await q<{ n: number; d: number }>(
      `SELECT (SELECT sum(processed_total)::int FROM {{schema}}.queues WHERE name = ANY($1)) AS n,
              (SELECT sum(processed)::int FROM {{schema}}.daily_stats WHERE queue = ANY($1)) AS d`,
      [queues],
    );
    assert.deepEqual(r.errors, {}, `stats flushes failed (${r.calls} calls)`);
    assert.equal(delta, 0, 'PostgreSQL detected deadlocks between stats flushes');
    assert.equal(totals!.n - totalBefore!.n, r.calls * queues.length, 'every flush counted once in the totals');
    assert.equal(totals!.d, r.calls * queues.length, 'every flush counted once in daily_stats');
  } finally {
    await Promise.all(dbs.map((d) => d.close()));
  }
});

test('F17: producers resending one batch (taskIds, or unique tasks) in different orders get TaskIdConflictError / DuplicateTaskError, never a deadlock', async () => {
  const clients = Array.from({ length: 4 }, () => new Client({ connectionString: db.cluster.connectionString, schema: SCHEMA }));
  // Slow inserts (2 ms a row, this queue only), so that concurrent batches overlap however idle the machine is.
  await q(`
      CREATE FUNCTION {{schema}}.f17_slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.002); RETURN NEW; END $$;
      CREATE TRIGGER f17_slow BEFORE INSERT ON {{schema}}.task_inputs FOR EACH ROW WHEN (NEW.queue = 'resend') EXECUTE FUNCTION {{schema}}.f17_slow();
      CREATE TRIGGER f17_slow BEFORE INSERT ON {{schema}}.unique_locks FOR EACH ROW WHEN (NEW.queue = 'resend') EXECUTE FUNCTION {{schema}}.f17_slow();`);
  const before = await db.deadlocks();
  const errors = new Map<string, number>();
  let rounds = 0;
  try {
    // An idempotent producer resends its batch after a timeout while another instance sends the same one.
    for (const until = performance.now() + 3000; performance.now() < until; rounds++) {
      // Even rounds: the same taskIds; odd rounds: the same unique tasks (same type and payload).
      const ids = Array.from({ length: 50 }, (_, i) => `b${rounds}-${i}`);
      const task = (id: string) =>
        rounds % 2 === 0 ? new Task('resend', null, { taskId: id, queue: 'resend' }) : new Task('resend', { id }, { unique: 60_000, queue: 'resend' });
      const results = await Promise.allSettled(clients.map((c) => c.enqueueMany([...ids].sort(() => Math.random() - 0.5).map(task))));
      for (const r of results) {
        if (r.status === 'fulfilled' || r.reason instanceof TaskIdConflictError || r.reason instanceof DuplicateTaskError) continue;
        const k = sqlState(r.reason) ?? (r.reason as Error).name;
        errors.set(k, (errors.get(k) ?? 0) + 1);
      }
    }
    const delta = (await db.deadlocks()) - before;
    recordFigures({
      test: 'F17 enqueueMany lock order',
      profile: 'fast',
      tasks: rounds * 50 * clients.length,
      deadlocks: delta,
      deadlock_errors_in_user_code: errors.get('40P01') ?? 0,
      notes: `${clients.length} clients send the same 50-task batch (taskIds, or unique tasks) in shuffled orders, ${rounds} rounds, inserts slowed 2 ms/row by a trigger; keyed batches insert in key order (src/broker/enqueue.ts), so none deadlocks`,
    });
    assert.deepEqual(Object.fromEntries(errors), {}, `enqueueMany rejected with something other than TaskIdConflictError (${rounds} rounds)`);
    assert.equal(delta, 0, 'PostgreSQL detected deadlocks between enqueueMany calls');
  } finally {
    await q('DROP TRIGGER f17_slow ON {{schema}}.task_inputs; DROP TRIGGER f17_slow ON {{schema}}.unique_locks');
    await Promise.all(clients.map((c) => c.close()));
  }
});
