/**
 * The soak test's worker process (plan §5.5): one Server with the mixed
 * handlers of S1, writing the oracle tables of ../harness.ts.
 *
 * Task types (every execution writes h_exec 'start' with the lease token it
 * was given and the task type in `detail`; every success writes its effect
 * into h_effects inside ctx.transaction):
 *   q, s       quick: effect at once (s is the scheduled kind)
 *   f2         fails on its first two attempts, then succeeds
 *   fa         always fails (archived once its retries are spent)
 *   long       sleeps payload.ms (2–5 × the lease, heartbeated), then the effect
 *   cron:*     the Scheduler's tasks: quick
 *
 * env: DATABASE_URL, SCHEMA, WORKER, CONCURRENCY (24), PROFILE (JSON: the
 * Server's durations plus retryDelayMs).
 * stdout (JSON lines): ready, and metrics every second (done, failed, aborted,
 * server.metrics(), rss, heapUsed, fds, loopLagMaxMs).
 */
import { randomUUID } from 'node:crypto';
import { readdirSync } from 'node:fs';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { sql, type Transaction } from 'kysely';
import pg from 'pg';
import { pino } from 'pino';
import { LeaseExpiredError, Server, type Task, type TaskContext } from '../../../src/index.js';

const env = (k: string, d = ''): string => process.env[k] ?? d;
const schema = env('SCHEMA');
const worker = `${env('WORKER', 'w')}:${process.pid}`;
const profile = JSON.parse(env('PROFILE', '{}')) as Record<string, number>;
const concurrency = Number(env('CONCURRENCY', '24'));
const say = (o: object): void => void process.stdout.write(`${JSON.stringify(o)}\n`);
const q = (name: string): string => `"${schema}".${name}`;

process.on('unhandledRejection', (err) => {
  say({ event: 'unhandledRejection', message: String((err as Error)?.stack ?? err) });
  process.stderr.write(`unhandledRejection: ${String((err as Error)?.stack ?? err)}\n`);
  process.exit(70);
});
process.on('uncaughtException', (err) => {
  say({ event: 'uncaughtException', message: String(err?.stack ?? err) });
  process.stderr.write(`uncaughtException: ${String(err?.stack ?? err)}\n`);
  process.exit(71);
});

// The oracle's own connections: not `pgasynq:*`, so terminating the library's sessions spares them.
const oracle = new pg.Pool({ connectionString: env('DATABASE_URL'), application_name: `harness:oracle:${worker}`, max: 6 });
oracle.on('error', () => {});

const { retryDelayMs = 500, ...serverProfile } = profile;
const server = new Server({
  connectionString: env('DATABASE_URL'),
  schema,
  concurrency,
  ...serverProfile,
  retryDelay: () => retryDelayMs * (1 + Math.random()),
  logger: pino({ level: env('LOG_LEVEL', 'warn'), base: { worker } }, pino.destination(2)),
});

let done = 0;
let failed = 0;
let aborted = 0;

async function exec(ctx: TaskContext, attempt: string, phase: 'start' | 'abort' | 'fenced', detail: string | null): Promise<void> {
  await oracle.query(
    `INSERT INTO ${q('h_exec')} (task_id, lease_token, attempt, worker, phase, detail)
     SELECT $1, (SELECT lease_token FROM ${q('tasks')} WHERE queue = $2 AND id = $1 AND state = 'active' AND lease_owner = $3 AND $5 = 'start'),
            $4, $6, $5, $7`,
    [ctx.taskId, ctx.queue, server.id, attempt, phase, worker, detail],
  );
}
const tryExec = (ctx: TaskContext, attempt: string, phase: 'abort' | 'fenced', detail: string) => exec(ctx, attempt, phase, detail).catch(() => {});

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(signal.reason);
    const timer = setTimeout(resolve, ms);
    signal.addEventListener(
      'abort',
      () => {
        clearTimeout(timer);
        reject(signal.reason);
      },
      { once: true },
    );
  });
}

async function effect(ctx: TaskContext, attempt: string): Promise<void> {
  const lostBefore = ctx.signal.aborted && ctx.signal.reason instanceof LeaseExpiredError;
  try {
    await ctx.transaction(async (trx: Transaction<any>) => {
      const { rows } = await sql<{
        lease_token: string;
      }>`SELECT lease_token FROM ${sql.id(schema, 'tasks')} WHERE queue = ${ctx.queue} AND id = ${ctx.taskId}`.execute(trx);
      await sql`INSERT INTO ${sql.id(schema, 'h_effects')} (task_id, lease_token, attempt, worker)
                VALUES (${ctx.taskId}, ${rows[0]?.lease_token ?? null}, ${attempt}, ${worker})`.execute(trx);
    });
  } catch (err) {
    if (err instanceof LeaseExpiredError) await tryExec(ctx, attempt, 'fenced', lostBefore ? 'local' : 'db');
    throw err;
  }
}

class PlannedFailure extends Error {
  override name = 'PlannedFailure';
}

async function handler(task: Task, ctx: TaskContext): Promise<void> {
  const attempt = randomUUID();
  try {
    await exec(ctx, attempt, 'start', task.type);
    if (task.type === 'fa') throw new PlannedFailure('always fails');
    if (task.type === 'f2' && ctx.retryCount < 2) throw new PlannedFailure(`fails on attempt ${ctx.retryCount + 1}`);
    if (task.type === 'long') {
      try {
        await sleep((task.payload as { ms: number }).ms, ctx.signal);
      } catch (err) {
        aborted++;
        await tryExec(ctx, attempt, 'abort', (err as Error)?.name ?? String(err));
        throw err;
      }
    }
    await effect(ctx, attempt);
    done++;
  } catch (err) {
    failed++;
    throw err;
  }
}

const lag = monitorEventLoopDelay({ resolution: 20 });
lag.enable();
const fds = (): number => {
  try {
    return readdirSync('/proc/self/fd').length;
  } catch {
    return -1;
  }
};
const metrics = () => {
  const m = process.memoryUsage();
  const out = {
    event: 'metrics',
    worker,
    done,
    failed,
    aborted,
    ...server.metrics(),
    rss: m.rss,
    heapUsed: m.heapUsed,
    fds: fds(),
    loopLagMaxMs: Math.round(lag.max / 1e6),
  };
  lag.reset();
  return out;
};

await server.start(handler);
say({ event: 'ready', worker, serverId: server.id });
setInterval(() => say(metrics()), 1000).unref();

process.on('SIGTERM', () => {
  setTimeout(
    () => {
      say({ event: 'shutdownHang' });
      process.exit(3);
    },
    (profile.shutdownTimeout ?? 8000) + 10_000,
  ).unref();
  say({ event: 'sigterm' });
  void server.shutdown().then(async () => {
    say(metrics());
    await oracle.end().catch(() => {});
    say({ event: 'exit' });
    process.exit(0);
  });
});
