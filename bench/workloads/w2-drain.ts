/**
 * W2 — drain: `n` no-op tasks are enqueued (untimed, in bulk), then one worker
 * process with `concurrency` slots runs them. The clock starts when the first
 * handler starts (so library start-up does not count) and stops when the
 * system's own tables say nothing is left: every completion recorded.
 * A run still going after `capMs` stops early and reports the rate so far
 * (completed ÷ elapsed), flagged `capped`. With `payload` > 0 every task
 * carries a realistic JSON document of that many bytes (lib/payload.ts, the
 * same bytes for every system) instead of `{ i }` alone.
 *
 * With `apart`, the backlog a production worker meets: filled by another
 * process (bench/fill.ts), then `VACUUM ANALYZE` of the system's tables (what
 * autovacuum does to a backlog that waited a minute), and the clock started
 * before the workers start, so their start-up counts.
 */
import { execFileSync } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Adapter } from '../adapters/types.js';
import { adminPool, now, sleep } from '../lib/common.js';
import { payload } from '../lib/payload.js';

export interface W2Params {
  n: number;
  concurrency: number;
  capMs: number;
  /** Bytes of JSON per task; 0 or absent: `{ i }` alone. */
  payload?: number;
  /** 1: filled by another process and vacuumed, the clock started before the workers (see above). */
  apart?: number;
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

/** `apart`'s backlog: enqueued by bench/fill.ts in a process of its own, then every table of the schema vacuumed and analysed. */
async function fillApart(a: Adapter, p: W2Params): Promise<void> {
  const bench = dirname(dirname(fileURLToPath(import.meta.url)));
  const spec = JSON.stringify({ system: a.name, n: p.n, payload: p.payload ?? 0 });
  execFileSync(process.execPath, ['--import', 'tsx', join(bench, 'fill.ts'), spec], { stdio: ['ignore', 'ignore', 'inherit'], env: process.env });
  if (a.schema === undefined) return;
  const admin = adminPool(1);
  try {
    const { rows } = await admin.query<{ t: string }>(
      `SELECT format('%I.%I', n.nspname, c.relname) AS t FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
       WHERE n.nspname = $1 AND c.relkind = 'r'`,
      [a.schema],
    );
    for (const { t } of rows) await admin.query(`VACUUM ANALYZE ${t}`);
  } finally {
    await admin.end();
  }
}

export async function measure(a: Adapter, p: W2Params): Promise<Record<string, number>> {
  await a.setup({ fresh: true });
  if (p.apart) await fillApart(a, p);
  else await enqueueInChunks(a, p.n, 10_000, p.payload ?? 0);
  let handled = 0;
  let first = 0;
  // Apart: the clock runs from before the workers start (their start-up is part of a real drain).
  const before = now();
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
  const from = p.apart ? before : first;
  const left = await untilDrained(a, from + p.capMs);
  const end = now();
  await workers.stop();
  await a.teardown();
  const seconds = (end - from) / 1000;
  return { perSec: (p.n - left) / seconds, seconds, completed: p.n - left, capped: left > 0 ? 1 : 0 };
}
