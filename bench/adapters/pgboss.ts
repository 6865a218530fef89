/**
 * pg-boss 10 (the newest release whose engines allow Node 20; 11 and 12 ask
 * for Node 22), tuned for throughput as BENCH.md did with 12.x:
 *  - batchSize 100: one fetch statement claims up to 100 jobs, one completes them;
 *  - pollingIntervalSeconds 0.5: the smallest pg-boss accepts (default 2 s);
 *  - one work() loop per unit of concurrency (10.x dropped teamSize: "call
 *    work() again for more concurrency"; 12.x calls it localConcurrency);
 *  - a full batch calls boss.notifyWorker(id), the documented way to skip the
 *    polling sleep: 10.x otherwise sleeps the interval after every fetch, and
 *    this is what 12.x's burstWhenBatchFull does. 10.x has no LISTEN/NOTIFY.
 * The producer is a second instance with supervise/schedule off (a client).
 */
import PgBoss from 'pg-boss';
import type pg from 'pg';
import { DATABASE_URL, adminPool, count, dropSchema } from '../lib/common.js';
import type { Adapter, Payload } from './types.js';

const SCHEMA = 'bench_pgboss';
const QUEUE = 'noop';
export const TUNING = { batchSize: 100, pollingIntervalSeconds: 0.5 };

export function create(): Adapter {
  // The admin pool lives from setup() to teardown(): a workload may set up again after a teardown.
  let pool: pg.Pool | undefined;
  const admin = (): pg.Pool => (pool ??= adminPool());
  let producer: PgBoss | undefined;
  return {
    name: 'pgboss',
    label: 'pg-boss',
    table: `"${SCHEMA}".job`,
    async setup({ fresh = false } = {}) {
      if (fresh) await dropSchema(admin(), SCHEMA);
      producer = new PgBoss({ connectionString: DATABASE_URL, schema: SCHEMA, supervise: false, schedule: false });
      producer.on('error', () => {});
      await producer.start();
      if (fresh) await producer.createQueue(QUEUE);
    },
    async enqueueOne(payload) {
      await producer!.send(QUEUE, payload);
    },
    async enqueueMany(payloads) {
      await producer!.insert(payloads.map((p) => ({ name: QUEUE, data: p })));
    },
    async enqueueAt(payload, at) {
      await producer!.send(QUEUE, payload, { startAfter: at });
    },
    async startWorkers({ concurrency, handler }) {
      const boss = new PgBoss({ connectionString: DATABASE_URL, schema: SCHEMA });
      boss.on('error', () => {});
      await boss.start();
      for (let k = 0; k < concurrency; k++) {
        let id = '';
        id = await boss.work<Payload>(QUEUE, TUNING, async (jobs) => {
          for (const job of jobs) handler(job.data);
          if (jobs.length === TUNING.batchSize && id) boss.notifyWorker(id);
        });
      }
      return { stop: () => boss.stop({ graceful: true, wait: true, timeout: 10_000 }) };
    },
    remaining: () => count(admin(), `SELECT count(*) AS n FROM "${SCHEMA}".job WHERE name = $1 AND state IN ('created', 'retry', 'active')`, [QUEUE]),
    async teardown() {
      await producer?.stop({ graceful: false, wait: true });
      await pool?.end();
      pool = undefined;
    },
  };
}
