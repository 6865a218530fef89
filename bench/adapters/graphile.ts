/**
 * graphile-worker 0.18, two ways:
 *  - `graphile` (tuned), as its performance page advises for throughput:
 *    `preset.worker.localQueue = { size: 500 }` (jobs fetched and locked in
 *    batches, handed to workers without a round trip), `completeJobBatchDelay`
 *    and `failJobBatchDelay` 0 (completions batched), a pool of concurrency + 1
 *    connections (their example: 24 jobs, pool of 25), capped at 30;
 *  - `graphile-default`: `run({ concurrency, taskList })` and nothing else
 *    (pool of 10, no local queue, one completion statement per job): what a
 *    user gets out of the box.
 * Both poll every 2 s (`pollInterval`, default), which only matters for jobs
 * due in the future (W4): new jobs arrive by LISTEN/NOTIFY.
 */
import { Logger, makeWorkerUtils, run, runMigrations, type RunnerOptions, type WorkerUtils } from 'graphile-worker';
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

export function create(tuned = true): Adapter {
  // The admin pool lives from setup() to teardown(): a workload may set up again after a teardown.
  let pool: pg.Pool | undefined;
  const admin = (): pg.Pool => (pool ??= adminPool());
  let utils: WorkerUtils | undefined;
  return {
    name: tuned ? 'graphile' : 'graphile-default',
    label: tuned ? 'graphile-worker (tuned: localQueue 500, completeJobBatchDelay 0)' : 'graphile-worker (default settings)',
    schema: SCHEMA,
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
      const options: RunnerOptions = {
        connectionString: DATABASE_URL,
        schema: SCHEMA,
        concurrency,
        noHandleSignals: true,
        logger: silent,
        taskList: { noop: async (payload) => handler(payload as Payload) },
        ...(tuned ? { maxPoolSize: Math.min(concurrency + 1, 30), preset: { worker: TUNING } } : {}),
      };
      const runner = await run(options);
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
