/**
 * W5 — claim cost as finished rows pile up: the table is filled with
 * `finished` completed/archived rows (INSERT … SELECT generate_series, then
 * VACUUM ANALYZE), `pending` tasks are enqueued, and a worker with
 * `concurrency` slots drains them while every claim statement is timed
 * (client round trip of the statement, claims that returned rows only).
 * Then, with `explainPending` tasks pending again, the last claim statement
 * seen is run under EXPLAIN (ANALYZE, BUFFERS) in a rolled-back transaction:
 * the server-side execution time and the buffers it touched, without the
 * commit's WAL flush that dominates the round trip on this disk.
 * Systems whose finished rows we cannot write (no fillFinished) are skipped.
 */
import type { Adapter } from '../adapters/types.js';
import { adminPool, mean, median, now, percentile, sleep } from '../lib/common.js';
import { enqueueInChunks, untilDrained } from './w2-drain.js';

export interface W5Params {
  finished: number;
  pending: number;
  concurrency: number;
}

export async function measure(a: Adapter, p: W5Params): Promise<Record<string, number>> {
  if (!a.fillFinished || !a.startTimedWorkers) throw new Error(`${a.name}: W5 needs fillFinished and startTimedWorkers`);
  await a.setup({ fresh: true });
  const f0 = now();
  await a.fillFinished(p.finished);
  const fillMs = now() - f0;
  await enqueueInChunks(a, p.pending);
  const claimMs: number[] = [];
  const claimRows: number[] = [];
  let lastClaim: { text: string; values: unknown[] } | undefined;
  let handled = 0;
  let first = 0;
  const workers = await a.startTimedWorkers({
    concurrency: p.concurrency,
    handler: () => {
      if (handled++ === 0) first = now();
    },
    onClaim: (ms, rows, statement) => {
      claimMs.push(ms);
      claimRows.push(rows);
      lastClaim = statement;
    },
  });
  const started = now();
  while (handled < p.pending && now() - started < 120_000) await sleep(10);
  const left = await untilDrained(a, now() + 30_000);
  const end = now();
  await workers.stop();
  if (claimMs.length === 0 || !lastClaim) throw new Error('no claim statement was seen (has the claim SQL changed shape?)');
  await enqueueInChunks(a, 100);
  const plan = await explain(lastClaim);
  await a.teardown();
  return {
    ...plan,
    claimMs: median(claimMs),
    claimMsP95: percentile(claimMs, 95),
    claimMsMean: mean(claimMs),
    rowsPerClaim: mean(claimRows),
    claims: claimMs.length,
    drainPerSec: (p.pending - left) / ((end - first) / 1000),
    fillMs,
  };
}

/** EXPLAIN (ANALYZE, BUFFERS) of one statement, 5 times, each rolled back: median execution ms, and the buffers of the last. */
async function explain(statement: { text: string; values: unknown[] }): Promise<Record<string, number>> {
  const pool = adminPool(1);
  const client = await pool.connect();
  const times: number[] = [];
  let buffers = 0;
  try {
    for (let i = 0; i < 5; i++) {
      await client.query('BEGIN');
      try {
        const { rows } = await client.query(`EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ${statement.text}`, statement.values);
        const [root] = rows[0]['QUERY PLAN'] as [{ 'Execution Time': number; Plan: Record<string, number> }];
        times.push(root['Execution Time']);
        buffers = (root.Plan['Shared Hit Blocks'] ?? 0) + (root.Plan['Shared Read Blocks'] ?? 0);
      } finally {
        await client.query('ROLLBACK');
      }
    }
  } finally {
    client.release();
    await pool.end();
  }
  return { explainMs: median(times), explainBuffers: buffers };
}
