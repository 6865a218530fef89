/**
 * W4 — scheduled tasks: with a worker running, `n` tasks are enqueued with due
 * times spread evenly from `leadMs` to `leadMs + spreadMs` ahead; for each,
 * how late its handler starts after it was due (wall clock, sub-ms). Systems
 * without delayed tasks are skipped.
 */
import type { Adapter } from '../adapters/types.js';
import { mean, now, percentile, waitFor, wallNow } from '../lib/common.js';

export interface W4Params {
  n: number;
  leadMs: number;
  spreadMs: number;
  concurrency: number;
}

export async function measure(a: Adapter, p: W4Params): Promise<Record<string, number>> {
  if (!a.enqueueAt) throw new Error(`${a.name} has no delayed tasks`);
  await a.setup({ fresh: true });
  const lateness: number[] = [];
  const workers = await a.startWorkers({
    concurrency: p.concurrency,
    handler: (payload) => {
      if (payload.due !== undefined) lateness.push(wallNow() - payload.due);
    },
  });
  const base = wallNow() + p.leadMs;
  const t0 = now();
  for (let i = 0; i < p.n; i++) {
    const due = base + (i * p.spreadMs) / Math.max(1, p.n - 1);
    await a.enqueueAt({ i, due }, new Date(due));
  }
  const enqueueMs = now() - t0;
  await waitFor(() => lateness.length >= p.n, p.leadMs + p.spreadMs + 30_000, 10, 'every W4 task to start');
  await workers.stop();
  await a.teardown();
  return {
    p50: percentile(lateness, 50),
    p99: percentile(lateness, 99),
    max: Math.max(...lateness),
    min: Math.min(...lateness),
    mean: mean(lateness),
    enqueueMs,
  };
}
