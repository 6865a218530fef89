/**
 * A worker process of the fault suite: one Server on the fast profile (or
 * whatever PROFILE says), with handlers that write the oracle tables of
 * harness.ts. The harness kills, freezes and terminates it.
 *
 * env:
 *   DATABASE_URL, SCHEMA   the owned cluster and the test's schema
 *   WORKER                 a name; rows are tagged `${WORKER}:${pid}`
 *   PROFILE                JSON: leaseDuration, heartbeatInterval, recoverCutoff, recoverInterval,
 *                          taskCheckInterval, delayedTaskCheckInterval, shutdownTimeout,
 *                          retryDelayMs (a retry waits retryDelayMs to 2·retryDelayMs)
 *   CONCURRENCY            slots (4)
 *   SLEEP_MIN, SLEEP_MAX   a `tx` task sleeps this long (ms) unless its payload says `ms`
 *   IGNORE_ABORT=1         the handler does not stop at ctx.signal (a zombie that carries on)
 *
 * Task types:
 *   tx      h_exec(start), sleep, h_exec(end), then ctx.transaction inserting h_effects
 *   poison  h_exec(start), then process.exit(42): an execution that kills its process
 *   block   like tx, but on its first attempt a synchronous busy loop of payload.blockMs
 *
 * stdout: one JSON line per event: {"event":"ready","serverId":…}, {"event":"metrics",…}
 * every 500 ms and at exit; stderr: the server's warnings and errors (pino).
 */
import { randomUUID } from 'node:crypto';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { sql, type Transaction } from 'kysely';
import pg from 'pg';
import { pino } from 'pino';
import { LeaseExpiredError, Server, type Task, type TaskContext } from '../../../src/index.js';

const env = (k: string, d = ''): string => process.env[k] ?? d;
const schema = env('SCHEMA');
const worker = `${env('WORKER', 'w')}:${process.pid}`;
const profile = JSON.parse(env('PROFILE', '{}')) as Record<string, number>;
const concurrency = Number(env('CONCURRENCY', '4'));
const sleepMin = Number(env('SLEEP_MIN', '200'));
const sleepMax = Number(env('SLEEP_MAX', '800'));
const ignoreAbort = env('IGNORE_ABORT') === '1';
const say = (o: object): void => void process.stdout.write(`${JSON.stringify(o)}\n`);
const q = (name: string): string => `"${schema}".${name}`;

// If the harness dies without its teardown, don't linger: exit when the parent is gone.
const parent = process.ppid;
setInterval(() => {
  try {
    process.kill(parent, 0);
  } catch {
    process.exit(99);
  }
}, 1000).unref();

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
const oracle = new pg.Pool({ connectionString: env('DATABASE_URL'), application_name: `harness:oracle:${worker}`, max: concurrency + 2 });
oracle.on('error', () => {});

const { retryDelayMs = 500, ...serverProfile } = profile;
const server = new Server({
  connectionString: env('DATABASE_URL'),
  schema,
  concurrency,
  delayedTaskCheckInterval: 500,
  ...serverProfile,
  // Jittered like asynq's default, so that tasks rescued together do not come back together.
  retryDelay: () => retryDelayMs * (1 + Math.random()),
  logger: pino({ level: env('LOG_LEVEL', 'warn'), base: { worker } }, pino.destination(2)),
});

/**
 * One h_exec row. At `start` it also records the lease token this attempt was
 * given, read from the row while this server holds it (lease_owner is the
 * server's id); null if the lease was already gone when the handler began.
 */
async function exec(ctx: TaskContext, attempt: string, phase: 'start' | 'end' | 'abort' | 'fenced', detail: string | null = null): Promise<void> {
  await oracle.query(
    `INSERT INTO ${q('h_exec')} (task_id, lease_token, attempt, worker, phase, detail)
     SELECT $1, (SELECT lease_token FROM ${q('tasks')} WHERE queue = $2 AND id = $1 AND state = 'active' AND lease_owner = $3 AND $5 = 'start'),
            $4, $6, $5, $7`,
    [ctx.taskId, ctx.queue, server.id, attempt, phase, worker, detail],
  );
}

/** Best effort: the database may be the very thing that is down. */
const tryExec = (ctx: TaskContext, attempt: string, phase: 'abort' | 'fenced', detail: string) => exec(ctx, attempt, phase, detail).catch(() => {});

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(resolve, ms);
    if (ignoreAbort) return;
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

/** The business effect, inside the completion's transaction (exactly once, or the test fails). */
async function commitEffect(ctx: TaskContext, attempt: string): Promise<void> {
  const lostBefore = ctx.signal.aborted && ctx.signal.reason instanceof LeaseExpiredError;
  try {
    await ctx.transaction(async (trx: Transaction<any>) => {
      // The library has locked the row with this lease's token: the token read here
      // is the one the completion is fenced by (I5 compares it with h_exec's start).
      const { rows } = await sql<{
        lease_token: string;
      }>`SELECT lease_token FROM ${sql.id(schema, 'tasks')} WHERE queue = ${ctx.queue} AND id = ${ctx.taskId}`.execute(trx);
      await sql`INSERT INTO ${sql.id(schema, 'h_effects')} (task_id, lease_token, attempt, worker)
                VALUES (${ctx.taskId}, ${rows[0]?.lease_token ?? null}, ${attempt}, ${worker})`.execute(trx);
    });
  } catch (err) {
    // 'local': the worker knew its lease was gone and wrote nothing (R5);
    // 'db': the database refused the token (R2).
    if (err instanceof LeaseExpiredError) await tryExec(ctx, attempt, 'fenced', lostBefore ? 'local' : 'db');
    throw err;
  }
}

async function handler(task: Task, ctx: TaskContext): Promise<void> {
  const attempt = randomUUID();
  const payload = (task.payload ?? {}) as { ms?: number; blockMs?: number };
  await exec(ctx, attempt, 'start');
  if (task.type === 'poison') process.exit(42);
  try {
    if (task.type === 'block' && ctx.retryCount === 0) {
      // No await for blockMs: no timer runs in this process, heartbeats included.
      const until = performance.now() + (payload.blockMs ?? 6000);
      while (performance.now() < until);
    } else {
      await sleep(payload.ms ?? sleepMin + Math.random() * (sleepMax - sleepMin), ctx.signal);
    }
  } catch (err) {
    await tryExec(ctx, attempt, 'abort', (err as Error)?.name ?? String(err));
    throw err;
  }
  await exec(ctx, attempt, 'end');
  await commitEffect(ctx, attempt);
}

const lag = monitorEventLoopDelay({ resolution: 20 });
lag.enable();
const metrics = () => ({ event: 'metrics', worker, ...server.metrics(), loopLagMaxMs: Math.round(lag.max / 1e6) });

await server.start(handler);
say({ event: 'ready', worker, serverId: server.id });
setInterval(() => say(metrics()), 500).unref();

process.on('SIGTERM', () => {
  // A shutdown that hangs is a bug: say so and exit with a code the harness flags.
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
