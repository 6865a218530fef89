/**
 * What a workflow costs: W2 (drain pre-enqueued no-op tasks, one server at
 * concurrency 10, defaults otherwise) with the same number of tasks in three
 * shapes, alternated run by run on a throwaway cluster with production
 * settings (lib/cluster.ts):
 *
 *   plain    independent tasks: W2 as it is
 *   chain    1,000 chains, each task depending on the one before: every
 *            completion releases its successor in the same transaction
 *   fan-in   groups of 1,000 tasks and one task depending on all of them:
 *            every completion settles an edge of the same dependent row
 *
 * Prints tasks/s for enqueue (enqueueMany, 10,000 per call) and drain per
 * shape, medians over the repetitions, and each shape's ratio to plain.
 *
 *   node --import tsx bench/workflows.ts [--n 50000] [--reps 3] [--concurrency 10] [--shapes plain,chain,fan-in] [--shared]
 * --shared: on DATABASE_URL (the machine's shared server) instead of a throwaway cluster.
 */
import pg from 'pg';
import { Client, Task, migrate } from '../src/index.js';
import { startBenchCluster } from './lib/cluster.js';
import { drain } from './lib/drain.js';
import { DATABASE_URL, median, now, parseArgs } from './lib/common.js';

const args = parseArgs(process.argv.slice(2));
const N = Number(args.n ?? 50_000);
const REPS = Number(args.reps ?? 3);
const CONCURRENCY = Number(args.concurrency ?? 10);
const CHAINS = 1000;
const FAN_IN = 1000;
const SCHEMA = 'bench_workflows';
const ALL_SHAPES = ['plain', 'chain', 'fan-in'] as const;
type Shape = (typeof ALL_SHAPES)[number];
const SHAPES = (args.shapes?.split(',') ?? ALL_SHAPES) as Shape[];

/** The tasks of one shape, about N of them, in an order where each task's dependencies come before it. */
function tasksOf(shape: Shape): Task[] {
  const noop = (id: string, dependsOn?: string[]) => new Task('noop', null, { taskId: id, ...(dependsOn ? { dependsOn } : {}) });
  if (shape === 'plain') return Array.from({ length: N }, (_, i) => noop(`t${i}`));
  if (shape === 'chain') {
    const links = Math.floor(N / CHAINS);
    const out: Task[] = [];
    // Link by link across the chains, so that every enqueueMany call holds the next link of each.
    for (let l = 0; l < links; l++) for (let c = 0; c < CHAINS; c++) out.push(noop(`c${c}-${l}`, l === 0 ? undefined : [`c${c}-${l - 1}`]));
    return out;
  }
  const out: Task[] = [];
  for (let g = 0; out.length + FAN_IN + 1 <= N; g++) {
    const parts = Array.from({ length: FAN_IN }, (_, i) => `g${g}-${i}`);
    for (const id of parts) out.push(noop(id));
    out.push(noop(`g${g}-all`, parts));
  }
  return out;
}

async function runOnce(url: string, admin: pg.Pool, shape: Shape): Promise<{ tasks: number; enqueuePerSec: number; drainPerSec: number }> {
  await admin.query(`DROP SCHEMA IF EXISTS ${SCHEMA} CASCADE`);
  await migrate({ connectionString: url, schema: SCHEMA, logger: false });
  const client = new Client({ connectionString: url, schema: SCHEMA, logger: false });
  const tasks = tasksOf(shape);
  const e0 = now();
  for (let i = 0; i < tasks.length; i += 10_000) await client.enqueueMany(tasks.slice(i, i + 10_000));
  const enqueueMs = now() - e0;
  await client.close();
  await admin.query(`VACUUM ANALYZE ${SCHEMA}.task_states, ${SCHEMA}.task_inputs, ${SCHEMA}.task_dependencies`);
  const drainMs = await drain(url, admin, SCHEMA, CONCURRENCY);
  return { tasks: tasks.length, enqueuePerSec: (tasks.length / enqueueMs) * 1000, drainPerSec: (tasks.length / drainMs) * 1000 };
}

const cluster = args.shared === undefined ? await startBenchCluster() : undefined;
process.on('exit', () => cluster?.destroy());
const url = cluster?.url ?? DATABASE_URL;
const admin = new pg.Pool({ connectionString: url, max: 2 });
const results = new Map<Shape, { tasks: number; enqueuePerSec: number; drainPerSec: number }[]>(SHAPES.map((s) => [s, []]));
try {
  for (let rep = 1; rep <= REPS; rep++) {
    for (const shape of SHAPES) {
      const r = await runOnce(url, admin, shape);
      results.get(shape)!.push(r);
      console.error(`rep ${rep} ${shape}: ${r.tasks} tasks, enqueue ${Math.round(r.enqueuePerSec)}/s, drain ${Math.round(r.drainPerSec)}/s`);
    }
  }
} finally {
  await admin.end();
}

const fmt = (x: number) => Math.round(x).toLocaleString('en-US');
const plain = median(results.get('plain')!.map((r) => r.drainPerSec));
const plainEnqueue = median(results.get('plain')!.map((r) => r.enqueuePerSec));
console.log(
  `W2 with workflows: ${N} tasks, concurrency ${CONCURRENCY}, ${REPS} repetitions (medians), ${cluster ? 'throwaway cluster, production settings' : 'shared server'}`,
);
console.log('');
console.log('| shape | tasks | enqueue tasks/s | drain tasks/s | drain ÷ plain | enqueue ÷ plain |');
console.log('|---|---:|---:|---:|---:|---:|');
for (const shape of SHAPES) {
  const rs = results.get(shape)!;
  const drain = median(rs.map((r) => r.drainPerSec));
  const enqueue = median(rs.map((r) => r.enqueuePerSec));
  console.log(`| ${shape} | ${fmt(rs[0]!.tasks)} | ${fmt(enqueue)} | ${fmt(drain)} | ${(drain / plain).toFixed(2)} | ${(enqueue / plainEnqueue).toFixed(2)} |`);
}
process.exit(0);
