/**
 * graphile-worker, tuned as its performance page advises for throughput:
 * localQueue of 500 (jobs fetched and locked in batches, handed to workers
 * without a round trip), completeJobBatchDelay 0 and failJobBatchDelay 0
 * (completions batched), a pool of concurrency + 1 connections (their example:
 * 24 jobs, pool of 25; capped at 30 here: max_connections is 100 and shared).
 */
import { Logger, makeWorkerUtils, run, runMigrations, type WorkerUtils } from 'graphile-worker';
import type pg from 'pg';
import { DATABASE_URL, adminPool, count, dropSchema } from '../lib/common.js';
import type { Adapter, Payload } from './types.js';

const SCHEMA = 'bench_graphile';
const silent = new Logger(() => () => {});

export const TUNING = {
  localQueue: { size: 500 },
  completeJobBatchDelay: 0,
  failJobBatchDelay: 0,
};

export function create(): Adapter {
  // The admin pool lives from setup() to teardown(): a workload may set up again after a teardown.
  let pool: pg.Pool | undefined;
  const admin = (): pg.Pool => (pool ??= adminPool());
  let utils: WorkerUtils | undefined;
  return {
    name: 'graphile',
    label: 'graphile-worker',
    table: `"${SCHEMA}"._private_jobs`,
    async setup({ fresh = false } = {}) {
      if (fresh) {
        await dropSchema(admin(), SCHEMA);
        await runMigrations({ connectionString: DATABASE_URL, schema: SCHEMA, logger: silent });
      }
      utils = await makeWorkerUtils({ connectionString: DATABASE_URL, schema: SCHEMA, logger: silent });
    },
    async enqueueOne(payload) {
      await utils!.addJob('noop', payload);
    },
    async enqueueMany(payloads) {
      await utils!.addJobs(payloads.map((p) => ({ identifier: 'noop', payload: p })));
    },
    async enqueueAt(payload, at) {
      await utils!.addJob('noop', payload, { runAt: at });
    },
    async startWorkers({ concurrency, handler }) {
      const runner = await run({
        connectionString: DATABASE_URL,
        schema: SCHEMA,
        concurrency,
        maxPoolSize: Math.min(concurrency + 1, 30),
        noHandleSignals: true,
        logger: silent,
        taskList: { noop: async (payload) => handler(payload as Payload) },
        preset: { worker: TUNING },
      });
      return { stop: () => runner.stop() };
    },
    remaining: () => count(admin(), `SELECT count(*) AS n FROM "${SCHEMA}"._private_jobs`),
    async teardown() {
      await utils?.release();
      await pool?.end();
      pool = undefined;
    },
  };
}
