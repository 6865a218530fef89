/**
 * W7 — what `total` tasks leave behind: workers (`concurrency` slots) run
 * while a producer keeps a backlog of at most `backlog`, enqueueing in bulk
 * calls of `batch`. Once every completion is recorded, the workers and
 * clients close (so every backend flushes its statistics), and the sizes and
 * live/dead tuples of the system's schema are read, summed over ALL its
 * tables (heap, indexes, toast): a design that splits a task over several
 * tables is counted whole. Then again once autovacuum has visited every table
 * left with dead tuples (issue 30's reading: the size after autovacuum has run
 * once; the cluster's production settings, each library's own per-table
 * settings, naptime 60 s, so at most AUTOVACUUM_CAP_MS), and once more after a
 * plain VACUUM of every table (what a vacuum gives back at once).
 */
import type { Adapter } from '../adapters/types.js';
import { adminPool, now, schemaStats, sleep, untilAutovacuumed, vacuumSchema } from '../lib/common.js';
import { untilDrained } from './w2-drain.js';

/** Two autovacuum naptimes and the vacuums themselves. */
const AUTOVACUUM_CAP_MS = 180_000;
/** Below this many dead tuples a table's autovacuum threshold may not be reached, and its size hardly matters. */
const MIN_DEAD = 1000;

export interface W7Params {
  total: number;
  batch: number;
  backlog: number;
  concurrency: number;
}

export async function measure(a: Adapter, p: W7Params): Promise<Record<string, number>> {
  if (!a.schema) throw new Error(`${a.name} has no schema to measure`);
  await a.setup({ fresh: true });
  let handled = 0;
  const workers = await a.startWorkers({ concurrency: p.concurrency, handler: () => void handled++ });
  const t0 = now();
  let produced = 0;
  while (produced < p.total) {
    if (produced - handled >= p.backlog) {
      await sleep(20);
      continue;
    }
    const size = Math.min(p.batch, p.total - produced);
    await a.enqueueMany(Array.from({ length: size }, (_, i) => ({ i: produced + i })));
    produced += size;
  }
  while (handled < p.total && now() - t0 < 30 * 60_000) await sleep(50);
  await untilDrained(a, now() + 60_000, 20);
  const seconds = (now() - t0) / 1000;
  await workers.stop();
  await a.teardown();
  await sleep(1500);
  const pool = adminPool(1);
  try {
    const ended = (await pool.query<{ t: Date }>('SELECT clock_timestamp() AS t')).rows[0]!.t;
    const r = await schemaStats(pool, a.schema);
    const autovacuum = await untilAutovacuumed(pool, a.schema, ended, { minDead: MIN_DEAD, capMs: AUTOVACUUM_CAP_MS });
    const av = await schemaStats(pool, a.schema);
    await vacuumSchema(pool, a.schema);
    await sleep(1000);
    const v = await schemaStats(pool, a.schema);
    return {
      totalBytes: r.totalBytes,
      heapBytes: r.heapBytes,
      indexBytes: r.indexBytes,
      toastBytes: r.toastBytes,
      tables: r.tables,
      liveTuples: r.liveTuples,
      deadTuples: r.deadTuples,
      autovacuums: r.autovacuums,
      autoanalyzes: r.autoanalyzes,
      perSec: p.total / seconds,
      autovacuumWaitS: autovacuum.waitedS,
      tablesNotAutovacuumed: autovacuum.unvisited,
      totalBytesAfterAutovacuum: av.totalBytes,
      indexBytesAfterAutovacuum: av.indexBytes,
      deadTuplesAfterAutovacuum: av.deadTuples,
      totalBytesAfterVacuum: v.totalBytes,
      heapBytesAfterVacuum: v.heapBytes,
      indexBytesAfterVacuum: v.indexBytes,
      deadTuplesAfterVacuum: v.deadTuples,
    };
  } finally {
    await pool.end();
  }
}
