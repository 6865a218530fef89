/**
 * W7 — what `total` tasks leave behind: workers (`concurrency` slots) run
 * while a producer keeps a backlog of at most `backlog`, enqueueing in bulk
 * calls of `batch`. Once every completion is recorded, the workers and
 * clients close (so every backend flushes its statistics), and the main
 * table's heap, index and total size and its live/dead tuples are read;
 * then once more after a plain VACUUM (what autovacuum would give back: the
 * server this was written on runs with autovacuum off).
 */
import type { Adapter } from '../adapters/types.js';
import { adminPool, now, sleep } from '../lib/common.js';
import { untilDrained } from './w2-drain.js';

export interface W7Params {
  total: number;
  batch: number;
  backlog: number;
  concurrency: number;
}

export async function measure(a: Adapter, p: W7Params): Promise<Record<string, number>> {
  if (!a.table) throw new Error(`${a.name} has no table to measure`);
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
  const sizes = async () => {
    const { rows } = await pool.query(
      `SELECT sum(pg_relation_size(t.relid))::float8 AS heap, sum(pg_indexes_size(t.relid))::float8 AS indexes,
              sum(pg_total_relation_size(t.relid))::float8 AS total,
              sum(s.n_live_tup)::float8 AS live, sum(s.n_dead_tup)::float8 AS dead,
              sum(s.autovacuum_count)::float8 AS autovacuums, sum(s.autoanalyze_count)::float8 AS autoanalyzes
       FROM (SELECT relid FROM pg_partition_tree($1::regclass) UNION SELECT $1::regclass) t
       LEFT JOIN pg_stat_user_tables s ON s.relid = t.relid`,
      [a.table],
    );
    return rows[0] as Record<string, number>;
  };
  try {
    const r = await sizes();
    // What a (auto)vacuum would give back: this server may run with autovacuum off.
    await pool.query(`VACUUM ${a.table}`);
    await sleep(1000);
    const v = await sizes();
    return {
      totalBytes: r.total!,
      heapBytes: r.heap!,
      indexBytes: r.indexes!,
      liveTuples: r.live!,
      deadTuples: r.dead!,
      autovacuums: r.autovacuums!,
      autoanalyzes: r.autoanalyzes!,
      perSec: p.total / seconds,
      totalBytesAfterVacuum: v.total!,
      indexBytesAfterVacuum: v.indexes!,
      deadTuplesAfterVacuum: v.dead!,
    };
  } finally {
    await pool.end();
  }
}
