/**
 * What the queue limits cost: W2 (drain pre-enqueued no-op tasks, one server
 * at concurrency 10, defaults otherwise) with the queue unlimited and with
 * each limit set high enough never to bind, so that only its bookkeeping is
 * measured, alternated run by run on a throwaway cluster with production
 * settings (lib/cluster.ts):
 *
 *   plain        no limit: W2 as it is
 *   concurrency  concurrency 1,000 (the server holds at most ~30)
 *   key          1,000 concurrency keys, the tasks dealt round-robin, keyConcurrency 10
 *   rate         1,000,000 starts per second
 *   all          the three at once
 *
 * Prints drain tasks/s per shape, medians over the repetitions, and each
 * shape's ratio to plain.
 *
 *   node --import tsx bench/limits.ts [--n 50000] [--reps 3] [--concurrency 10] [--shapes plain,concurrency,key,rate,all] [--shared]
 * --shared: on DATABASE_URL (the machine's shared server) instead of a throwaway cluster.
 */
import pg from 'pg';
import { Client, Inspector, Task, migrate, type QueueLimits } from '../src/index.js';
import { startBenchCluster } from './lib/cluster.js';
import { drain } from './lib/drain.js';
import { DATABASE_URL, median, parseArgs } from './lib/common.js';

const args = parseArgs(process.argv.slice(2));
const N = Number(args.n ?? 50_000);
const REPS = Number(args.reps ?? 3);
const CONCURRENCY = Number(args.concurrency ?? 10);
const KEYS = 1000;
const SCHEMA = 'bench_limits';
const LIMITS = {
  plain: {},
  concurrency: { concurrency: 1000 },
  key: { keyConcurrency: 10 },
  rate: { rateLimit: { limit: 1_000_000, interval: 1000 } },
  all: { concurrency: 1000, keyConcurrency: 10, rateLimit: { limit: 1_000_000, interval: 1000 } },
} satisfies Record<string, Partial<QueueLimits>>;
type Shape = keyof typeof LIMITS;
const SHAPES = (args.shapes?.split(',') ?? Object.keys(LIMITS)) as Shape[];

async function runOnce(url: string, admin: pg.Pool, shape: Shape): Promise<number> {
  await admin.query(`DROP SCHEMA IF EXISTS ${SCHEMA} CASCADE`);
  await migrate({ connectionString: url, schema: SCHEMA, logger: false });
  const client = new Client({ connectionString: url, schema: SCHEMA, logger: false });
  const keyed = 'keyConcurrency' in LIMITS[shape];
  for (let i = 0; i < N; i += 10_000) {
    const batch = Array.from({ length: Math.min(10_000, N - i) }, (_, j) => new Task('noop', null, keyed ? { concurrencyKey: `k${(i + j) % KEYS}` } : {}));
    await client.enqueueMany(batch);
  }
  await client.close();
  const inspector = new Inspector({ connectionString: url, schema: SCHEMA });
  await inspector.setQueueLimits('default', LIMITS[shape]);
  await inspector.close();
  await admin.query(`VACUUM ANALYZE ${SCHEMA}.task_states, ${SCHEMA}.task_inputs`);
  const drainMs = await drain(url, admin, SCHEMA, CONCURRENCY);
  return (N / drainMs) * 1000;
}

const cluster = args.shared === undefined ? await startBenchCluster() : undefined;
process.on('exit', () => cluster?.destroy());
const url = cluster?.url ?? DATABASE_URL;
const admin = new pg.Pool({ connectionString: url, max: 2 });
const results = new Map<Shape, number[]>(SHAPES.map((s) => [s, []]));
try {
  for (let rep = 1; rep <= REPS; rep++) {
    for (const shape of SHAPES) {
      const perSec = await runOnce(url, admin, shape);
      results.get(shape)!.push(perSec);
      console.error(`rep ${rep} ${shape}: drain ${Math.round(perSec)}/s`);
    }
  }
} finally {
  await admin.end();
}

const fmt = (x: number) => Math.round(x).toLocaleString('en-US');
const plain = median(results.get('plain') ?? [Number.NaN]);
console.log(
  `W2 with queue limits: ${N} tasks, concurrency ${CONCURRENCY}, ${REPS} repetitions (medians), ${cluster ? 'throwaway cluster, production settings' : 'shared server'}`,
);
console.log('');
console.log('| limits | drain tasks/s | ÷ plain |');
console.log('|---|---:|---:|');
for (const shape of SHAPES) {
  const drain = median(results.get(shape)!);
  console.log(`| ${shape} | ${fmt(drain)} | ${(drain / plain).toFixed(2)} |`);
}
process.exit(0);
