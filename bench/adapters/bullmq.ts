/**
 * BullMQ 6.7, on Redis (its default backend) and on PostgreSQL (its
 * createPostgresBackend, new in 6.x). Tuned as its docs advise for throughput:
 *  - removeOnComplete / removeOnFail: finished jobs are deleted, so the store
 *    does not grow (their "let retention do its work");
 *  - worker `concurrency` as asked; BullMQ fetches one job per slot (batches
 *    are a BullMQ Pro feature);
 *  - PostgreSQL: a pool of `concurrency` connections for the worker ("give
 *    each backend enough pool connections for its concurrency"), capped at 30
 *    (max_connections is 100 and shared), and 10 for the producer.
 * Redis here runs without persistence (appendonly no, no RDB saves): none of
 * its writes wait for a disk, unlike every PostgreSQL system's commits.
 */
import { Queue, Worker, createPostgresBackend, runMigrations } from 'bullmq';
import pg from 'pg';
import { DATABASE_URL, REDIS_URL, adminPool, dropSchema } from '../lib/common.js';
import type { Adapter, Payload } from './types.js';

const QUEUE = 'noop';
const PG_SCHEMA = 'bench_bullmq';
const PREFIX = 'bench';
const jobOpts = { removeOnComplete: true, removeOnFail: true } as const;

function redisConnection() {
  const u = new URL(REDIS_URL);
  return { host: u.hostname, port: Number(u.port || 6379), maxRetriesPerRequest: null };
}

const pgConnection = (max: number) => ({ connectionString: DATABASE_URL, schema: PG_SCHEMA, max });

export function create(backend: 'redis' | 'pg'): Adapter {
  // Typed loosely: the two backends' Queue types differ only in their connection type.
  let queue: Queue | undefined;
  const newQueue = (): Queue =>
    backend === 'pg'
      ? (new Queue(QUEUE, { connection: pgConnection(10), defaultJobOptions: jobOpts }, createPostgresBackend) as unknown as Queue)
      : new Queue(QUEUE, { connection: redisConnection(), prefix: PREFIX, defaultJobOptions: jobOpts });
  return {
    name: backend === 'pg' ? 'bullmq-pg' : 'bullmq',
    label: backend === 'pg' ? 'BullMQ (PostgreSQL backend)' : 'BullMQ (Redis)',
    ...(backend === 'pg' ? { schema: PG_SCHEMA } : {}),
    async setup({ fresh = false } = {}) {
      if (fresh && backend === 'pg') {
        const admin = adminPool(1);
        await dropSchema(admin, PG_SCHEMA).finally(() => admin.end());
        const c = new pg.Client({ connectionString: DATABASE_URL });
        await c.connect();
        try {
          await runMigrations(c, PG_SCHEMA);
        } finally {
          await c.end();
        }
      }
      queue = newQueue();
      queue.on('error', () => {});
      await queue.waitUntilReady();
      if (fresh && backend === 'redis') await queue.obliterate({ force: true });
    },
    async enqueueOne(payload) {
      await queue!.add(QUEUE, payload);
    },
    async enqueueMany(payloads) {
      await queue!.addBulk(payloads.map((p) => ({ name: QUEUE, data: p })));
    },
    async enqueueAt(payload, at) {
      await queue!.add(QUEUE, payload, { delay: Math.max(0, at.getTime() - Date.now()) });
    },
    async startWorkers({ concurrency, handler }) {
      const opts = { concurrency, removeOnComplete: { count: 0 }, removeOnFail: { count: 0 } };
      const worker =
        backend === 'pg'
          ? (new Worker(
              QUEUE,
              async (job) => handler(job.data as Payload),
              { ...opts, connection: pgConnection(Math.min(concurrency, 30)) },
              createPostgresBackend,
            ) as unknown as Worker)
          : new Worker(QUEUE, async (job) => handler(job.data as Payload), { ...opts, connection: redisConnection(), prefix: PREFIX });
      worker.on('error', () => {});
      await worker.waitUntilReady();
      return { stop: () => worker.close() };
    },
    async remaining() {
      const c = await queue!.getJobCounts('waiting', 'active', 'delayed', 'prioritized', 'waiting-children');
      return Object.values(c).reduce((a, b) => a + b, 0);
    },
    async teardown() {
      await queue?.close();
    },
  };
}
