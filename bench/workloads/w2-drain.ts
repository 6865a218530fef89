/**
 * W2 — drain: `n` no-op tasks are enqueued (untimed, in bulk), then one worker
 * process with `concurrency` slots runs them. The clock starts when the first
 * handler starts (so library start-up does not count) and stops when the
 * system's own tables say nothing is left: every completion recorded.
 * A run still going after `capMs` stops early and reports the rate so far
 * (completed ÷ elapsed), flagged `capped`. With `payload` > 0 every task
 * carries a realistic JSON document of that many bytes (lib/payload.ts, the
 * same bytes for every system) instead of `{ i }` alone.
 */
import type { Adapter } from '../adapters/types.js';
import { now, sleep } from '../lib/common.js';
import { payload } from '../lib/payload.js';

export interface W2Params {
  n: number;
  concurrency: number;
  capMs: number;
  /** Bytes of JSON per task; 0 or absent: `{ i }` alone. */
  payload?: number;
}

export async function enqueueInChunks(a: Adapter, n: number, chunk = 10_000, bytes = 0): Promise<void> {
  for (let from = 0; from < n; from += chunk) {
    const size = Math.min(chunk, n - from);
    await a.enqueueMany(Array.from({ length: size }, (_, i) => payload(from + i, bytes)));
  }
}

/** Polls remaining() until 0 (every `everyMs`) or until `deadline`; returns what is left. */
export async function untilDrained(a: Adapter, deadline: number, everyMs = 2): Promise<number> {
  for (;;) {
    const left = await a.remaining();
    if (left === 0 || now() > deadline) return left;
    await sleep(everyMs);
  }
}

export async function measure(a: Adapter, p: W2Params): Promise<Record<string, number>> {
  await a.setup({ fresh: true });
  await enqueueInChunks(a, p.n, 10_000, p.payload ?? 0);
  let handled = 0;
  let first = 0;
  const workers = await a.startWorkers({
    concurrency: p.concurrency,
    handler: () => {
      if (handled++ === 0) first = now();
    },
  });
  const started = now();
  // Cheap in-process wait while handlers run; the database is asked only near the end.
  while (handled < p.n && (first === 0 || now() - first < p.capMs) && now() - started < p.capMs + 30_000) await sleep(10);
  if (first === 0) throw new Error('no task ran');
  const left = await untilDrained(a, first + p.capMs);
  const end = now();
  await workers.stop();
  await a.teardown();
  const seconds = (end - first) / 1000;
  return { perSec: (p.n - left) / seconds, seconds, completed: p.n - left, capped: left > 0 ? 1 : 0 };
}
