/**
 * W1 — enqueue throughput. Bulk: `bulk` small JSON tasks in one call of the
 * system's bulk API. One by one: `single` awaited enqueue calls in a row.
 * Each part starts from a clean slate after a short warm-up (connections
 * open, code paths compiled), which is not timed.
 */
import type { Adapter, Payload } from '../adapters/types.js';
import { now } from '../lib/common.js';

export interface W1Params {
  bulk: number;
  single: number;
}

const payloads = (n: number, from = 0): Payload[] => Array.from({ length: n }, (_, i) => ({ i: from + i }));

async function warmUp(a: Adapter): Promise<void> {
  await a.enqueueMany(payloads(100, 1e9));
  for (let i = 0; i < 20; i++) await a.enqueueOne({ i: 2e9 + i });
}

export async function measure(a: Adapter, p: W1Params): Promise<Record<string, number>> {
  await a.setup({ fresh: true });
  await warmUp(a);
  const batch = payloads(p.bulk);
  const t0 = now();
  await a.enqueueMany(batch);
  const bulkMs = now() - t0;
  await a.teardown();

  await a.setup({ fresh: true });
  await warmUp(a);
  const t1 = now();
  for (let i = 0; i < p.single; i++) await a.enqueueOne({ i });
  const singleMs = now() - t1;
  await a.teardown();
  return {
    bulkPerSec: p.bulk / (bulkMs / 1000),
    bulkMs,
    singlePerSec: p.single / (singleMs / 1000),
    singleMs,
  };
}
