/**
 * `pgasynq demo`: a worker demo. With no database configured (or with
 * PGASYNQ_EMBEDDED=1) it runs on the embedded database, in this process;
 * otherwise on the configured one, in the schema "pgasynq_demo" unless
 * --schema says otherwise. It enqueues a realistic mix, shows live progress
 * per queue, and ends with a summary and the SQL that reads the same state.
 *
 * The summary counts this run's tasks only, so a rerun on the same schema
 * adds nothing of the earlier runs' (their archived tasks stay): every task
 * the run enqueues, and every digest its aggregator makes, carries the run's
 * id in the header RUN_HEADER.
 */
import { randomUUID } from 'node:crypto';
import { Option } from '@commander-js/extra-typings';
import { Client } from '../client.js';
import { createEmbeddedDatabase, type EmbeddedDatabase } from '../embedded.js';
import { ConfigError, DuplicateTaskError, isQueueNotFound, SkipRetry } from '../model/errors.js';
import { Inspector } from '../inspector.js';
import { listTasksByState } from '../inspector-internal.js';
import { migrate } from '../migrate.js';
import { ServeMux } from '../mux.js';
import { Server } from '../server.js';
import { Task } from '../model/task.js';
import type { CliContext } from './context.js';
import type { CliProgram } from './root.js';

const QUEUES = { critical: 6, default: 3, low: 1 };
const STATES = ['pending', 'active', 'scheduled', 'retry', 'aggregating', 'archived', 'completed'] as const;
const UNFINISHED = ['pending', 'active', 'scheduled', 'retry', 'aggregating'] as const;
/** The header that tells this run's tasks from earlier runs' in the same schema. */
const RUN_HEADER = 'demo-run';

const positiveInt = (name: string) => (v: string) => {
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1) throw new ConfigError(name, `must be a positive integer (got ${JSON.stringify(v)})`);
  return n;
};

const sleep = (ms: number, signal: AbortSignal) =>
  new Promise<void>((resolve, reject) => {
    const t = setTimeout(resolve, ms);
    signal.addEventListener('abort', () => (clearTimeout(t), reject(signal.reason)), { once: true });
  });
const between = (a: number, b: number) => a + Math.floor(Math.random() * (b - a));

/** The demo's task mix: what a small web shop sends to its workers; each with `headers`. */
function tasks(n: number, headers: Record<string, string>): Task[] {
  const out: Task[] = [];
  for (let i = 0; out.length < n; i++) {
    const r = i % 20;
    if (r < 7) out.push(new Task('email:send', { to: `user${i}@example.com`, template: 'welcome' }, { queue: 'critical', headers }));
    else if (r < 12) out.push(new Task('image:resize', { image: `img/${i}.png`, width: 640 }, { headers }));
    else if (r < 14) out.push(new Task('webhook:deliver', { url: `https://example.com/hooks/${i}` }, { maxRetry: 3, headers }));
    else if (r < 15) out.push(new Task('report:generate', { day: '2026-11-30', part: i }, { queue: 'low', headers }));
    else if (r < 16) out.push(new Task('reminder:send', { user: i }, { queue: 'low', processIn: between(1000, 4000), headers }));
    else out.push(new Task('event:track', { user: i % 7, event: 'page_view' }, { queue: 'low', group: `user-${i % 7}`, headers }));
  }
  return out;
}

/** Whether a task (or a TaskInfo) is one of this run's. */
type Ours = (t: { headers: Record<string, string> }) => boolean;

/** This run's tasks only (Ours): what a rerun finds of an earlier run's is not counted. */
interface DemoCounters {
  /** Handlers that succeeded, digests included. */
  processed: number;
  /** Digest tasks the group aggregator made, and the events of this run merged into them. */
  digests: number;
  merged: number;
  firstAt: number | null;
}

function handlers(counters: DemoCounters, started: number, ours: Ours): ServeMux {
  const done = () => {
    counters.processed++;
    counters.firstAt ??= performance.now() - started;
  };
  return new ServeMux()
    .use((next) => async (task, ctx) => {
      await next(task, ctx);
      if (ours(task)) done();
    })
    .handle('email:send', (_t, ctx) => sleep(between(5, 30), ctx.signal))
    .handle('image:resize', async (_t, ctx) => {
      await sleep(between(20, 80), ctx.signal);
      await ctx.writeResult({ width: 640, height: 480 });
    })
    .handle('webhook:deliver', async (_t, ctx) => {
      await sleep(between(5, 20), ctx.signal);
      // The endpoint is flaky: every first attempt fails, and the retry goes through.
      if (ctx.retryCount === 0) throw new Error('503 Service Unavailable from endpoint');
    })
    .handle('report:generate', (_t, ctx) => sleep(between(50, 150), ctx.signal))
    .handle('reminder:send', (_t, ctx) => sleep(between(5, 20), ctx.signal))
    .handle('digest:send', async (task: Task<{ events: number; ofThisRun?: number }>, ctx) => {
      await sleep(between(10, 30), ctx.signal);
      if (!ours(task)) return;
      counters.digests++;
      counters.merged += task.payload.ofThisRun ?? 0;
    })
    .handle('import:parse', () => {
      throw new SkipRetry('malformed CSV on line 3: archived, not retried');
    });
}

interface Counts {
  queue: string;
  counts: Record<(typeof STATES)[number], number>;
  processed: number;
  failed: number;
}

async function snapshot(inspector: Inspector): Promise<Counts[]> {
  return Promise.all(
    Object.keys(QUEUES).map(async (queue) => {
      const q = await inspector.getQueueInfo(queue).catch(() => null);
      const counts = Object.fromEntries(STATES.map((s) => [s, q ? q[s] : 0])) as Counts['counts'];
      return { queue, counts, processed: q?.processed ?? 0, failed: q?.failed ?? 0 };
    }),
  );
}

function render(rows: Counts[], elapsed: number): string[] {
  const head = `pgasynq demo — ${(elapsed / 1000).toFixed(1)} s`;
  const lines = rows.map((r) => `  ${r.queue.padEnd(9)} ${STATES.map((s) => `${s} ${String(r.counts[s]).padStart(4)}`).join('  ')}`);
  return [head, ...lines];
}

/** How many of this run's tasks the demo's queues hold in `states`, read 1,000 at a time. */
async function countOurs(inspector: Inspector, ours: Ours, states: readonly (typeof STATES)[number][]): Promise<number> {
  const pageSize = 1000;
  let n = 0;
  for (const queue of Object.keys(QUEUES)) {
    for (let page = 1; ; page++) {
      const byState = await listTasksByState(inspector, queue, states, { page, pageSize }).catch((err: unknown) =>
        isQueueNotFound(err) ? [] : Promise.reject(err),
      );
      for (const { tasks } of byState) n += tasks.filter(ours).length;
      if (byState.every((s) => s.tasks.length < pageSize)) break;
    }
  }
  return n;
}

const unfinished = (rows: Counts[]) =>
  rows.reduce((n, r) => n + r.counts.pending + r.counts.active + r.counts.scheduled + r.counts.retry + r.counts.aggregating, 0);

export function registerDemo(program: CliProgram, ctx: CliContext): void {
  program
    .command('demo')
    .description('a worker demo: on the embedded database when none is configured')
    .addOption(new Option('--tasks <n>', 'tasks to enqueue').argParser(positiveInt('--tasks')).default(300))
    .addOption(new Option('--concurrency <n>', 'tasks run at once').argParser(positiveInt('--concurrency')).default(10))
    .addOption(new Option('--duration <seconds>', 'stop after this long even if tasks remain').argParser(positiveInt('--duration')).default(60))
    .option('--data-dir <dir>', 'keep the embedded database in this directory')
    .action(async (opts) => {
      const out = ctx.io.out;
      const interactive = (out as { isTTY?: boolean }).isTTY === true;
      const embeddedForced = ctx.io.env.PGASYNQ_EMBEDDED === '1';
      const useEmbedded = embeddedForced || ctx.databaseUrl === undefined;
      const t0 = performance.now();
      // The library's log lines, human-readable on stderr, errors only: the poison task
      // archived on purpose shows as one line, while at warn the flaky webhook's first
      // attempts would add dozens of retry lines. While the live view is drawn on a
      // terminal, lines wait and are printed above it, and the view is redrawn below them.
      const held: string[] = [];
      let live = false;
      const logger = ctx.logger('error', (text) => (live ? held.push(text) : ctx.io.err.write(text)));
      let embedded: EmbeddedDatabase | undefined;
      let conn: { embedded?: EmbeddedDatabase; connectionString?: string; schema: string; logger: typeof logger };
      if (useEmbedded) {
        out.write(`starting the embedded database${opts.dataDir ? ` in ${opts.dataDir}` : ' (in memory)'}…\n`);
        embedded = await createEmbeddedDatabase(opts.dataDir === undefined ? {} : { dataDir: opts.dataDir }).catch((err: unknown) => {
          // A ConfigError (bad usage, exit 2) from the library's point of view; here the command
          // line was right and the machine lacks a package: a failure (exit 1), with the fix.
          if (err instanceof ConfigError && err.field === 'embedded') {
            throw new Error(`the demo's embedded database ${err.rule}; or run the demo on PostgreSQL: DATABASE_URL=postgres://… npx pgasynq demo`, {
              cause: err,
            });
          }
          throw err;
        });
        conn = { embedded, schema: ctx.globals.schema, logger };
      } else {
        const explicit = program.getOptionValueSource('schema') !== 'default';
        conn = { connectionString: ctx.connection().connectionString, schema: explicit ? ctx.globals.schema : 'pgasynq_demo', logger };
      }
      const where = useEmbedded ? 'embedded database' : `schema "${conn.schema}"`;
      if (!useEmbedded) {
        const flag = conn.schema === 'pgasynq' ? '' : ` --schema ${conn.schema}`;
        out.write(
          `using schema "${conn.schema}" of the configured database${conn.schema === 'pgasynq_demo' ? ' (--schema to choose another)' : ''}: \`pgasynq${flag} stats\` shows it afterwards\n`,
        );
      }
      await migrate(conn);
      const client = new Client(conn);
      const inspector = new Inspector(conn);
      const counters: DemoCounters = { processed: 0, digests: 0, merged: 0, firstAt: null };
      const run = { [RUN_HEADER]: randomUUID() };
      const ours: Ours = (t) => t.headers[RUN_HEADER] === run[RUN_HEADER];
      const server = new Server({
        ...conn,
        queues: QUEUES,
        concurrency: opts.concurrency,
        retryDelay: (n) => 300 * (n + 1),
        groupAggregator: (group, members) =>
          new Task('digest:send', { group, events: members.length, ofThisRun: members.filter(ours).length }, { headers: run }),
        groupGracePeriod: 500,
        groupMaxSize: 10,
      });
      let stopping = false;
      const onSignal = () => (stopping = true);
      process.once('SIGINT', onSignal);
      process.once('SIGTERM', onSignal);
      try {
        const started = performance.now();
        await server.start(handlers(counters, started, ours));
        const mix = tasks(opts.tasks - 1, run);
        await client.enqueueMany(mix);
        await client.enqueue(new Task('import:parse', { file: 'customers.csv' }, { queue: 'low', headers: run }));
        const ceo = () => new Task('email:send', { to: 'ceo@example.com', template: 'daily-digest' }, { queue: 'critical', unique: 60_000, headers: run });
        await client.enqueue(ceo());
        const duplicate = await client.enqueue(ceo()).then(
          () => 'accepted (unexpected)',
          (err: unknown) => (err instanceof DuplicateTaskError ? 'refused: DuplicateTaskError' : String(err)),
        );
        out.write(`enqueued ${opts.tasks + 1} tasks on the ${where} (a second copy of a unique task was ${duplicate})\n`);

        let shown = 0;
        let lastPlain = 0;
        // Throughput is measured while a backlog exists: scheduled tasks and retry
        // delays keep the demo alive afterwards, doing nothing on purpose.
        let burst: { processed: number; seconds: number } | undefined;
        let rows = await snapshot(inspector);
        for (;;) {
          rows = await snapshot(inspector);
          const elapsed = performance.now() - started;
          if (burst === undefined && rows.every((r) => r.counts.pending === 0 && r.counts.active === 0)) {
            burst = { processed: counters.processed, seconds: elapsed / 1000 };
          }
          if (interactive) {
            live = true;
            if (held.length > 0) {
              // Up to the top of the view, clear to the end of the screen, print the lines there.
              if (shown) out.write(`\x1b[${shown}A\x1b[J`);
              ctx.io.err.write(held.splice(0).join(''));
              shown = 0;
            }
            const lines = render(rows, elapsed);
            out.write(`${shown ? `\x1b[${shown}A` : ''}${lines.map((l) => `\x1b[2K${l}`).join('\n')}\n`);
            shown = lines.length;
          } else if (elapsed - lastPlain >= 1000) {
            lastPlain = elapsed;
            out.write(
              `${(elapsed / 1000).toFixed(1)}s ${rows
                .map(
                  (r) =>
                    `${r.queue}: ${
                      STATES.filter((s) => r.counts[s] > 0)
                        .map((s) => `${s}=${r.counts[s]}`)
                        .join(' ') || 'idle'
                    }`,
                )
                .join(' | ')}\n`,
            );
          }
          if (unfinished(rows) === 0 || stopping || elapsed > opts.duration * 1000) break;
          await new Promise((r) => setTimeout(r, interactive ? 200 : 250));
        }
        live = false;
        ctx.io.err.write(held.splice(0).join(''));
        const elapsed = (performance.now() - started) / 1000;
        await server.shutdown();
        // This run's tasks, not the schema's: a rerun finds the earlier runs' archived tasks there.
        const left = await countOurs(inspector, ours, UNFINISHED);
        const archived = await countOurs(inspector, ours, ['archived']);
        const enqueued = opts.tasks + 1;
        const summary = {
          enqueued,
          processed: counters.processed,
          mergedIntoDigests: counters.merged,
          digests: counters.digests,
          archived,
          unfinished: left,
          seconds: Number(elapsed.toFixed(2)),
          tasksPerSecond: Math.round(burst && burst.seconds > 0 ? burst.processed / burst.seconds : counters.processed / elapsed),
          firstTaskMs: counters.firstAt === null ? null : Math.round(counters.firstAt + (started - t0)),
        };
        // Every enqueued task ends one way: its handler succeeded, the group aggregator merged
        // it into a digest (a new task, processed too), it was archived, or it is unfinished.
        const ownProcessed = counters.processed - counters.digests;
        ctx.emit(summary, () => [
          '',
          `${enqueued} tasks enqueued: ${ownProcessed} processed, ${counters.merged} merged by the group aggregator into ${counters.digests} digest tasks (processed too), ${archived} archived, ${left} unfinished`,
          `${summary.processed} handlers succeeded in ${summary.seconds} s (${summary.tasksPerSecond} tasks/s while a backlog waited); every webhook failed its first attempt and succeeded on retry`,
          `first task processed ${summary.firstTaskMs} ms after the demo started`,
          '',
          ...(useEmbedded
            ? [
                'This ran on an in-process database, gone now that the demo ended. To read the same state',
                'in SQL (psql, or any client), run the demo against PostgreSQL:',
                '  DATABASE_URL=postgres://user:password@host:5432/db npx pgasynq demo',
              ]
            : [
                'The same state in SQL (psql, or any client):',
                `  SELECT queue, state, count(*) FROM ${conn.schema}.tasks GROUP BY 1, 2 ORDER BY 1, 2;`,
                `  SELECT * FROM ${conn.schema}.queue_stats;`,
                `  SELECT queue, id, type, error_msg FROM ${conn.schema}.tasks WHERE state = 'archived';`,
                `  SELECT * FROM ${conn.schema}.daily_stats;`,
                `or: npx pgasynq${conn.schema === 'pgasynq' ? '' : ` --schema ${conn.schema}`} stats`,
              ]),
        ]);
        if (left > 0 && !stopping) throw new Error(`${left} tasks were still unfinished after --duration ${opts.duration} s`);
      } finally {
        live = false;
        if (held.length > 0) ctx.io.err.write(held.splice(0).join(''));
        process.off('SIGINT', onSignal);
        process.off('SIGTERM', onSignal);
        await server.shutdown();
        await inspector.close();
        await client.close();
        await embedded?.close();
      }
    });
}
