/**
 * pg-boss 12, tuned for throughput as BENCH.md did:
 *  - `useListenNotify: true` on the worker's instance and `notify: true` on
 *    the queue: a new job wakes the workers at once (12.x; 10.x only polled);
 *  - `work(queue, { localConcurrency, batchSize: 100, burstWhenBatchFull,
 *    pollingIntervalSeconds: 0.5, notifyPollingIntervalSeconds: 0.5 })`:
 *    `localConcurrency` workers, each fetching up to 100 jobs per statement
 *    and completing them in one; a full batch fetches again at once instead of
 *    sleeping; 0.5 s (the smallest allowed) between polls otherwise, also while
 *    NOTIFY is on (its default then is 30 s, which W4's delayed jobs — they
 *    get no NOTIFY when they come due — would wait out);
 *  - the queue's other options at their defaults (completed jobs are kept
 *    for `deleteAfterSeconds` = 7 days, as a user gets).
 * The producer is a second instance with supervise/schedule off (a client).
 */
import { PgBoss, type WorkOptions } from 'pg-boss';
import type pg from 'pg';
import { DATABASE_URL, adminPool, count, dropSchema } from '../lib/common.js';
import type { Adapter, Payload } from './types.js';

const SCHEMA = 'bench_pgboss';
const QUEUE = 'noop';
export const TUNING = {
  batchSize: 100,
  burstWhenBatchFull: true,
  pollingIntervalSeconds: 0.5,
  notifyPollingIntervalSeconds: 0.5,
} satisfies WorkOptions;

export function create(): Adapter {
  // The admin pool lives from setup() to teardown(): a workload may set up again after a teardown.
  let pool: pg.Pool | undefined;
  const admin = (): pg.Pool => (pool ??= adminPool());
  let producer: PgBoss | undefined;
  return {
    name: 'pgboss',
    label: 'pg-boss (tuned: batchSize 100, burstWhenBatchFull, polling 0.5 s, LISTEN/NOTIFY)',
    schema: SCHEMA,
    async setup({ fresh = false } = {}) {
      if (fresh) await dropSchema(admin(), SCHEMA);
      producer = new PgBoss({ connectionString: DATABASE_URL, schema: SCHEMA, supervise: false, schedule: false });
      producer.on('error', () => {});
      await producer.start();
      if (fresh) await producer.createQueue(QUEUE, { notify: true });
    },
    async enqueueOne(payload) {
      await producer!.send(QUEUE, payload);
    },
    async enqueueMany(payloads) {
      await producer!.insert(
        QUEUE,
        payloads.map((p) => ({ data: p })),
      );
    },
    async enqueueAt(payload, at) {
      await producer!.send(QUEUE, payload, { startAfter: at });
    },
    async startWorkers({ concurrency, handler }) {
      const boss = new PgBoss({ connectionString: DATABASE_URL, schema: SCHEMA, useListenNotify: true });
      boss.on('error', () => {});
      await boss.start();
      await boss.work<Payload>(QUEUE, { ...TUNING, localConcurrency: concurrency }, async (jobs) => {
        for (const job of jobs) await handler(job.data);
      });
      return { stop: () => boss.stop({ graceful: true, timeout: 10_000 }) };
    },
    remaining: () => count(admin(), `SELECT count(*) AS n FROM "${SCHEMA}".job WHERE name = $1 AND state IN ('created', 'retry', 'active')`, [QUEUE]),
    async teardown() {
      await producer?.stop({ graceful: false });
      await pool?.end();
      pool = undefined;
    },
  };
}
