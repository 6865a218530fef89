/**
 * W3 — latency on an idle, running worker: `n` tasks enqueued one at a time
 * at `rate` per second (on a fixed schedule, not back to back); for each, the
 * handler's start minus the moment just before the enqueue call. Enqueuer and
 * worker share one process, so both read the same monotonic clock. The first
 * `warmup` tasks are not counted.
 */
import type { Adapter } from '../adapters/types.js';
import { mean, now, percentile, sleep, waitFor } from '../lib/common.js';

export interface W3Params {
  n: number;
  rate: number;
  warmup: number;
  concurrency: number;
}

export async function measure(a: Adapter, p: W3Params): Promise<Record<string, number>> {
  await a.setup({ fresh: true });
  const latencies: number[] = [];
  let handled = 0;
  const workers = await a.startWorkers({
    concurrency: p.concurrency,
    handler: (payload) => {
      const at = now();
      if (payload.i >= p.warmup && payload.sentAt !== undefined) latencies.push(at - payload.sentAt);
      handled++;
    },
  });
  await sleep(1000); // let the worker settle into its idle state
  const total = p.warmup + p.n;
  const period = 1000 / p.rate;
  const t0 = now();
  for (let i = 0; i < total; i++) {
    const wait = t0 + i * period - now();
    if (wait > 0) await sleep(wait);
    await a.enqueueOne({ i, sentAt: now() });
  }
  await waitFor(() => handled >= total, 30_000, 5, 'every W3 task to start');
  await workers.stop();
  await a.teardown();
  return {
    p50: percentile(latencies, 50),
    p95: percentile(latencies, 95),
    p99: percentile(latencies, 99),
    max: Math.max(...latencies),
    mean: mean(latencies),
    count: latencies.length,
  };
}
