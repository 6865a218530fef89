/**
 * RT — a request that waits for its task's result: `n` tasks enqueued one at
 * a time at `rate` per second (on a fixed schedule) into an idle, running
 * worker, each with the system's enqueue-and-wait call (pgasynq's
 * Client.enqueueAndWait); for each, the call's duration: enqueue, claim,
 * handler, completion, and the waiter woken and reading the outcome. The
 * waiter and the worker share one process and its monotonic clock, but the
 * wait goes through the database (a notification and a read), as it does
 * from another host. The first `warmup` tasks are not counted.
 */
import type { Adapter } from '../adapters/types.js';
import { mean, now, percentile, sleep } from '../lib/common.js';

export interface RtParams {
  n: number;
  rate: number;
  warmup: number;
  concurrency: number;
}

export async function measure(a: Adapter, p: RtParams): Promise<Record<string, number>> {
  if (!a.enqueueAndWait) throw new Error(`${a.name} has no enqueue-and-wait call`);
  await a.setup({ fresh: true });
  const workers = await a.startWorkers({ concurrency: p.concurrency, handler: () => {} });
  await sleep(1000); // let the worker settle into its idle state
  const total = p.warmup + p.n;
  const period = 1000 / p.rate;
  const durations: number[] = [];
  const calls: Promise<void>[] = [];
  const t0 = now();
  for (let i = 0; i < total; i++) {
    const wait = t0 + i * period - now();
    if (wait > 0) await sleep(wait);
    const sent = now();
    calls.push(
      a.enqueueAndWait({ i }).then(() => {
        if (i >= p.warmup) durations.push(now() - sent);
      }),
    );
  }
  await Promise.all(calls);
  await workers.stop();
  await a.teardown();
  return { p50: percentile(durations, 50), p95: percentile(durations, 95), p99: percentile(durations, 99), mean: mean(durations) };
}
