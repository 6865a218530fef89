/**
 * W8 — a steady stream under a long snapshot (BENCH.md): `rate` tasks/s
 * enqueued one at a time (awaited `enqueueOne` calls on a fixed schedule, by
 * `producers` concurrent producers so that one slow call does not hold the
 * others back; the achieved rate is recorded) for `seconds`, into a worker
 * already running (`concurrency` slots, the system's own settings). From
 * `snapshotAt` s another connection to the SAME database holds a REPEATABLE
 * READ transaction that has taken a snapshot (BEGIN ISOLATION LEVEL
 * REPEATABLE READ; a SELECT on a table) until the end: from then on no vacuum
 * may remove a row version deleted after it, so every dead tuple the queue
 * makes stays in its tables and indexes, and the claim has to step over them.
 *
 * `hold` says what is held from `snapshotAt`: 'snapshot', that REPEATABLE READ
 * transaction; 'xid', a writing transaction (BEGIN; SELECT txid_current()),
 * idle in transaction with a transaction id, as a session that wrote and
 * never committed; 'readers', four REPEATABLE READ transactions that
 * re-scan every table of the system's schema in a loop, each a new snapshot
 * that overlaps the others (a reporting job's shape): the horizon moves, but
 * never past the oldest of them.
 *
 * Figures: handler start − the instant just before the enqueue call (one
 * process, one monotonic clock), per `window` s of enqueue time (p50, p99,
 * the backlog at the window's end, dead tuples in the schema), the p50/p99
 * before the snapshot and over the last 30 s, the backlog (enqueue calls
 * returned − tasks started) at the end and its maximum, and the dead tuples
 * of the system's schema (sum of n_dead_tup over all its tables) at the end,
 * read after the workers closed and while the snapshot still holds.
 *
 * Tasks not started when the producers stop get up to `drainWait` s more
 * (snapshot still held); any still not started then count with their wait so
 * far: a lower bound (`unstarted` says how many).
 */
import pg from 'pg';
import type { Adapter } from '../adapters/types.js';
import { DATABASE_URL, adminPool, log, now, percentile, schemaStats, sleep } from '../lib/common.js';

/** What W8 holds from `snapshotAt` to the end (see above). */
export type W8Hold = 'snapshot' | 'xid' | 'readers';

export interface W8Params {
  hold: W8Hold;
  rate: number;
  seconds: number;
  snapshotAt: number;
  window: number;
  concurrency: number;
  producers: number;
  drainWait: number;
}

export async function measure(a: Adapter, p: W8Params): Promise<Record<string, number>> {
  if (!a.schema) throw new Error(`${a.name}: W8 reads the dead tuples of a PostgreSQL schema`);
  const schema = a.schema;
  await a.setup({ fresh: true });
  const total = Math.ceil(p.rate * p.seconds);
  const sentAt = new Float64Array(total).fill(Number.NaN);
  const latency = new Float64Array(total).fill(Number.NaN);
  let started = 0;
  let resolved = 0;
  const workers = await a.startWorkers({
    concurrency: p.concurrency,
    handler: (payload) => {
      if (payload.sentAt === undefined || payload.i >= total) return;
      if (Number.isNaN(latency[payload.i]!)) {
        latency[payload.i] = now() - payload.sentAt;
        started++;
      }
    },
  });
  await sleep(1000); // let the worker settle into its idle state

  const admin = adminPool(1);
  const holders = await Promise.all(
    Array.from({ length: p.hold === 'readers' ? READERS : 1 }, async () => {
      const c = new pg.Client({ connectionString: DATABASE_URL, application_name: HOLDER });
      await c.connect();
      await c.query('SET idle_in_transaction_session_timeout = 0');
      return c;
    }),
  );
  let snapshotTakenAt = Number.NaN;
  let holding = true;

  const windowMs = p.window * 1000;
  const windows = Math.ceil(p.seconds / p.window);
  const backlogAt: number[] = [];
  const deadAt: number[] = [];
  let backlogMax = 0;
  const enqueueMs: number[] = [];
  let enqueueErrors = 0;

  const t0 = now();
  const endAt = t0 + p.seconds * 1000;
  const period = 1000 / p.rate;
  let next = 0;
  const producers = Array.from({ length: p.producers }, async () => {
    for (;;) {
      const k = next++;
      const due = t0 + k * period;
      if (k >= total || due >= endAt) return;
      const wait = due - now();
      if (wait > 0) await sleep(wait);
      if (now() >= endAt) return;
      const s = now();
      sentAt[k] = s;
      try {
        await a.enqueueOne({ i: k, sentAt: s });
        resolved++;
      } catch (e) {
        enqueueErrors++;
        sentAt[k] = Number.NaN;
        if (enqueueErrors <= 3) log(`W8 enqueue failed: ${(e as Error).message}`);
      }
      enqueueMs.push(now() - s);
    }
  });
  const held = (async () => {
    await sleep(t0 + p.snapshotAt * 1000 - now());
    snapshotTakenAt = (now() - t0) / 1000;
    return hold(p.hold, holders, schema, () => holding);
  })();
  const sampler = setInterval(() => {
    backlogMax = Math.max(backlogMax, resolved - started);
  }, 100);
  const windowsDone = (async () => {
    for (let w = 1; w <= windows; w++) {
      await sleep(t0 + Math.min(w * windowMs, p.seconds * 1000) - now());
      backlogAt.push(Math.max(0, resolved - started));
      try {
        deadAt.push((await schemaStats(admin, schema)).deadTuples);
      } catch {
        deadAt.push(Number.NaN);
      }
    }
  })();

  await Promise.all(producers);
  const producedMs = now() - t0;
  const backlogEnd = Math.max(0, resolved - started);
  backlogMax = Math.max(backlogMax, backlogEnd);
  await windowsDone;
  clearInterval(sampler);
  const enqueued = resolved;
  // Time for what is left to start, the snapshot still held.
  const drainFrom = now();
  while (started < enqueued && now() - drainFrom < p.drainWait * 1000) await sleep(20);
  const drainSeconds = started >= enqueued ? (now() - drainFrom) / 1000 : Number.NaN;
  const tEnd = now();
  let unstarted = 0;
  for (let k = 0; k < total; k++) {
    if (!Number.isNaN(sentAt[k]!) && Number.isNaN(latency[k]!)) {
      latency[k] = tEnd - sentAt[k]!;
      unstarted++;
    }
  }

  const { rows: xminRows } = await admin.query<{ held: boolean }>(
    `SELECT bool_or(backend_xmin IS NOT NULL OR backend_xid IS NOT NULL) AS held FROM pg_stat_activity WHERE application_name = '${HOLDER}'`,
  );
  await workers.stop();
  await a.teardown();
  await sleep(1500); // every closed backend has flushed its statistics
  const stats = await schemaStats(admin, schema);
  holding = false;
  const readerPasses = await held;
  for (const c of holders) {
    await c.query('ROLLBACK').catch(() => {});
    await c.end();
  }
  await admin.end();

  // Latencies by enqueue time.
  const inRange = (fromS: number, toS: number) => {
    const out: number[] = [];
    for (let k = 0; k < total; k++) {
      const s = sentAt[k]!;
      if (Number.isNaN(s)) continue;
      const at = (s - t0) / 1000;
      if (at >= fromS && at < toS) out.push(latency[k]!);
    }
    return out;
  };
  const before = inRange(0, p.snapshotAt);
  const last = inRange(Math.max(p.snapshotAt, p.seconds - 30), p.seconds);
  const result: Record<string, number> = {
    achievedRate: enqueued / (producedMs / 1000),
    enqueued,
    enqueueErrors,
    enqueueP50: percentile(enqueueMs, 50),
    enqueueP99: percentile(enqueueMs, 99),
    p50Before: percentile(before, 50),
    p99Before: percentile(before, 99),
    p50Last30: percentile(last, 50),
    p99Last30: percentile(last, 99),
    p50Ratio: percentile(last, 50) / percentile(before, 50),
    backlogEnd,
    backlogMax,
    drainSeconds,
    unstarted,
    snapshotTakenAt,
    snapshotHeld: xminRows[0]?.held ? 1 : 0,
    readerPasses,
    deadTuples: stats.deadTuples,
    liveTuples: stats.liveTuples,
    totalBytes: stats.totalBytes,
    autovacuums: stats.autovacuums,
  };
  // The bar: no 10 s window's p50 above 3× the p50 before the hold.
  let worst = 0;
  for (let w = 0; w < windows; w++) {
    const xs = inRange(w * p.window, (w + 1) * p.window);
    if (w * p.window >= p.snapshotAt) worst = Math.max(worst, percentile(xs, 50));
    const key = `w${String(w).padStart(2, '0')}`;
    result[`${key}.p50`] = percentile(xs, 50);
    result[`${key}.p99`] = percentile(xs, 99);
    result[`${key}.n`] = xs.length;
    result[`${key}.backlog`] = backlogAt[w] ?? Number.NaN;
    result[`${key}.dead`] = deadAt[w] ?? Number.NaN;
  }
  result.worstWindowRatio = worst / result.p50Before!;
  return result;
}

const HOLDER = 'bench:w8:hold';
/** The 'readers' hold: as many overlapping REPEATABLE READ readers as a published harness runs. */
const READERS = 4;

/**
 * Takes the hold on `clients` and keeps it while `holding()`: resolves at
 * once for 'snapshot' and 'xid' (their transaction stays open until the
 * caller rolls it back), and when the readers stop for 'readers', with the
 * number of passes they made over the schema.
 */
async function hold(kind: W8Hold, clients: pg.Client[], schema: string, holding: () => boolean): Promise<number> {
  if (kind === 'snapshot') {
    await clients[0]!.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
    await clients[0]!.query('SELECT count(*) FROM pg_catalog.pg_class'); // the snapshot is taken here, and held
    return 0;
  }
  if (kind === 'xid') {
    await clients[0]!.query('BEGIN');
    await clients[0]!.query('SELECT txid_current()'); // a transaction id, held: as a write never committed
    return 0;
  }
  const { rows } = await clients[0]!.query<{ name: string }>(
    `SELECT format('%I.%I', schemaname, tablename) AS name FROM pg_catalog.pg_tables WHERE schemaname = $1 ORDER BY tablename`,
    [schema],
  );
  let passes = 0;
  await Promise.all(
    clients.map(async (c, n) => {
      await sleep((n * 250) / clients.length); // staggered, so that their snapshots overlap rather than coincide
      while (holding()) {
        await c.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
        for (const t of rows) await c.query(`SELECT count(*) FROM ${t.name}`);
        await c.query('COMMIT');
        passes++;
      }
    }),
  );
  return passes;
}
