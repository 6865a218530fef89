/**
 * What the fault suite's child processes (this directory's and ../load/'s)
 * share: env and the stdout event lines the harness parses, the exit guards,
 * the oracle's own connections, the h_exec and h_effects writes of the
 * workers, a worker's ready / metrics / SIGTERM life, and a producer's ack
 * log and pacing. Each child stays its own program; this module only makes
 * them say and write the same things the same way.
 */
import { closeSync, fsyncSync, openSync, readdirSync, writeSync } from 'node:fs';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { sql, type Transaction } from 'kysely';
import pg from 'pg';
import { pino } from 'pino';
import { LeaseExpiredError, Server, type ServerConfig, type Task, type TaskContext } from '../../../src/index.js';

/** The environment variable `name`, or `fallback` when it is unset. */
export const env = (name: string, fallback = ''): string => process.env[name] ?? fallback;

/** One event: a JSON line on stdout. */
export const say = (event: object): void => void process.stdout.write(`${JSON.stringify(event)}\n`);

export const delay = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

// ---- process guards ----

/** If the harness dies without its teardown, don't linger: exit (99) when the parent is gone. */
export function exitWhenParentDies(): void {
  const parent = process.ppid;
  setInterval(() => {
    try {
      process.kill(parent, 0);
    } catch {
      process.exit(99);
    }
  }, 1000).unref();
}

/** An unhandled rejection is said (stdout and stderr) and exits 70, a code the harness flags. */
export function exitOnUnhandledRejection(): void {
  process.on('unhandledRejection', (err) => {
    say({ event: 'unhandledRejection', message: String((err as Error)?.stack ?? err) });
    process.stderr.write(`unhandledRejection: ${String((err as Error)?.stack ?? err)}\n`);
    process.exit(70);
  });
}

/** An uncaught exception is said (stdout and stderr) and exits 71. */
export function exitOnUncaughtException(): void {
  process.on('uncaughtException', (err) => {
    say({ event: 'uncaughtException', message: String(err?.stack ?? err) });
    process.stderr.write(`uncaughtException: ${String(err?.stack ?? err)}\n`);
    process.exit(71);
  });
}

// ---- the oracle ----

/**
 * The oracle's own connections, tagged `harness:oracle:${tag}` when a tag is
 * given: not `pgasynq:*`, so terminating the library's sessions spares them.
 * On ORACLE_DATABASE_URL when set (the library's DATABASE_URL may go through a
 * fault-injecting proxy that the oracle must not suffer), else DATABASE_URL.
 */
export function oraclePool(max: number, tag?: string): pg.Pool {
  const pool = new pg.Pool({
    connectionString: env('ORACLE_DATABASE_URL') || env('DATABASE_URL'),
    max,
    ...(tag === undefined ? {} : { application_name: `harness:oracle:${tag}` }),
  });
  pool.on('error', () => {});
  return pool;
}

/** Who writes a worker's oracle rows: the test's schema, the worker's tag, its Server (lease_owner is its id) and the oracle's pool. */
export interface OracleWriter {
  schema: string;
  worker: string;
  server: Server;
  oracle: pg.Pool;
}

export type ExecPhase = 'start' | 'end' | 'abort' | 'fenced';

/**
 * One h_exec row. At `start` it also records the lease token this attempt was
 * given, read from the row while this server holds it (lease_owner is the
 * server's id); null if the lease was already gone when the handler began.
 */
export async function recordExec(w: OracleWriter, ctx: TaskContext, attempt: string, phase: ExecPhase, detail: string | null = null): Promise<void> {
  const q = (name: string): string => `"${w.schema}".${name}`;
  await w.oracle.query(
    `INSERT INTO ${q('h_exec')} (task_id, lease_token, attempt, worker, phase, detail)
     SELECT $1, (SELECT lease_token FROM ${q('tasks')} WHERE queue = $2 AND id = $1 AND state = 'active' AND lease_owner = $3 AND $5 = 'start'),
            $4, $6, $5, $7`,
    [ctx.taskId, ctx.queue, w.server.id, attempt, phase, w.worker, detail],
  );
}

/** Best effort: the database may be the very thing that is down. */
export const tryRecordExec = (w: OracleWriter, ctx: TaskContext, attempt: string, phase: 'abort' | 'fenced', detail: string): Promise<void> =>
  recordExec(w, ctx, attempt, phase, detail).catch(() => {});

/**
 * The business effect, inside the completion's transaction (exactly once, or
 * the test fails): an h_effects row with the lease token the row is locked
 * under. A completion refused with LeaseExpiredError also gets a 'fenced'
 * h_exec row. `holdMs` keeps the transaction open that long after the insert;
 * `onHold` is called just before that hold (the effect is written, not committed).
 */
export async function commitEffect(w: OracleWriter, ctx: TaskContext, attempt: string, holdMs = 0, onHold?: () => void): Promise<void> {
  const lostBefore = ctx.signal.aborted && ctx.signal.reason instanceof LeaseExpiredError;
  try {
    await ctx.transaction(async (trx: Transaction<any>) => {
      // The library has locked the row with this lease's token: the token read here
      // is the one the completion is fenced by (I5 compares it with h_exec's start).
      const { rows } = await sql<{
        lease_token: string;
      }>`SELECT lease_token FROM ${sql.id(w.schema, 'tasks')} WHERE queue = ${ctx.queue} AND id = ${ctx.taskId}`.execute(trx);
      await sql`INSERT INTO ${sql.id(w.schema, 'h_effects')} (task_id, lease_token, attempt, worker)
                VALUES (${ctx.taskId}, ${rows[0]?.lease_token ?? null}, ${attempt}, ${w.worker})`.execute(trx);
      // holdMs: the handler works on inside its transaction before the library completes and commits it.
      if (holdMs > 0) {
        onHold?.();
        await delay(holdMs);
      }
    });
  } catch (err) {
    // 'local': the worker knew its lease was gone and wrote nothing (R5);
    // 'db': the database refused the token (R2).
    if (err instanceof LeaseExpiredError) await tryRecordExec(w, ctx, attempt, 'fenced', lostBefore ? 'local' : 'db');
    throw err;
  }
}

// ---- a worker's handlers and life ----

/**
 * Resolves after `ms`, or rejects with the signal's reason when it aborts
 * first (no signal: just a sleep). A signal that has already aborted rejects
 * at once, unless `onlyLaterAborts`: then only an abort during the sleep counts.
 */
export function abortableSleep(ms: number, signal?: AbortSignal, { onlyLaterAborts = false } = {}): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted && !onlyLaterAborts) return reject(signal.reason);
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener(
      'abort',
      () => {
        clearTimeout(timer);
        reject(signal.reason);
      },
      { once: true },
    );
  });
}

/** `${WORKER}:${pid}`: the tag a worker's rows carry in h_exec / h_effects. */
export const workerTag = (): string => `${env('WORKER', 'w')}:${process.pid}`;

/** PROFILE: JSON of the Server's durations (and, for some workers, retryDelayMs). */
export const profileFromEnv = (): Record<string, number> => JSON.parse(env('PROFILE', '{}')) as Record<string, number>;

/** A Server on DATABASE_URL with `config`, logging warnings and errors (LOG_LEVEL) to stderr tagged with the worker. */
export function workerServer(worker: string, retryDelayMs: number, config: ServerConfig): Server {
  return new Server({
    connectionString: env('DATABASE_URL'),
    ...config,
    // Jittered like asynq's default, so that tasks rescued together do not come back together.
    retryDelay: () => retryDelayMs * (1 + Math.random()),
    logger: pino({ level: env('LOG_LEVEL', 'warn'), base: { worker } }, pino.destination(2)),
  });
}

/** Starts the server, says ready (with the server id the harness matches lease_owner against), then `metrics()` every `everyMs`. */
export async function startAndReport(
  server: Server,
  handler: (task: Task, ctx: TaskContext) => Promise<void>,
  worker: string,
  metrics: () => object,
  everyMs: number,
) {
  await server.start(handler);
  // hostNow: the host clock as this process sees it (a test may skew it).
  say({ event: 'ready', worker, serverId: server.id, hostNow: Date.now() });
  setInterval(() => say(metrics()), everyMs).unref();
}

export interface WorkerProcess {
  schema: string;
  /** Its tag, `${WORKER}:${pid}`. */
  worker: string;
  /** PROFILE as given (with retryDelayMs, if it has one). */
  profile: Record<string, number>;
  concurrency: number;
  server: Server;
  /** The oracle's pool and writer; absent when the worker writes no oracle rows. */
  oracle: pg.Pool | undefined;
  w: OracleWriter | undefined;
}

/**
 * A worker process's start: the exit guards; SCHEMA, its tag, PROFILE and CONCURRENCY (`concurrency`
 * when unset); an oracle pool of `oracle(concurrency)` connections (none for 0); and its Server on
 * DATABASE_URL with `config(profile)` (PROFILE without retryDelayMs), whose retries wait
 * retryDelayMs (PROFILE's, else `retryDelayMs`) to twice that.
 */
export function workerProcess(o: {
  concurrency: number;
  oracle: (concurrency: number) => number;
  retryDelayMs: number;
  config: (profile: Record<string, number>, concurrency: number) => Omit<ServerConfig, 'schema' | 'concurrency'>;
}): WorkerProcess {
  exitOnUnhandledRejection();
  exitOnUncaughtException();
  const schema = env('SCHEMA');
  const worker = workerTag();
  const profile = profileFromEnv();
  const concurrency = Number(env('CONCURRENCY', String(o.concurrency)));
  const max = o.oracle(concurrency);
  const oracle = max > 0 ? oraclePool(max, worker) : undefined;
  const { retryDelayMs = o.retryDelayMs, ...serverProfile } = profile;
  const server = workerServer(worker, retryDelayMs, { schema, concurrency, ...o.config(serverProfile, concurrency) });
  return { schema, worker, profile, concurrency, server, oracle, w: oracle && { schema, worker, server, oracle } };
}

/** Starts the worker's Server with `handler`, says ready and `metrics()` every `everyMs`; on SIGTERM, shuts down, says the last metrics and closes the oracle's pool. */
export async function runWorker(
  p: WorkerProcess,
  handler: (task: Task, ctx: TaskContext) => Promise<void>,
  metrics: () => object,
  everyMs: number,
): Promise<void> {
  await startAndReport(p.server, handler, p.worker, metrics, everyMs);
  shutdownOnSigterm(p.server, p.profile.shutdownTimeout, async () => {
    say(metrics());
    await p.oracle?.end().catch(() => {});
  });
}

/** On SIGTERM: says sigterm, shuts the server down, runs `cleanup` (final metrics, the oracle's end), says exit and exits 0. */
export function shutdownOnSigterm(server: Server, shutdownTimeoutMs: number | undefined, cleanup: () => Promise<void>): void {
  process.on('SIGTERM', () => {
    // A shutdown that hangs is a bug: say so and exit with a code the harness flags.
    setTimeout(
      () => {
        say({ event: 'shutdownHang' });
        process.exit(3);
      },
      (shutdownTimeoutMs ?? 8000) + 10_000,
    ).unref();
    say({ event: 'sigterm' });
    void server.shutdown().then(async () => {
      await cleanup();
      say({ event: 'exit' });
      process.exit(0);
    });
  });
}

/** The event loop's longest delay (ms) since it was watched or reset, and its 99th percentile. */
export function watchLoopLag(): { maxMs(): number; p99Ms(): number; reset(): void } {
  const lag = monitorEventLoopDelay({ resolution: 20 });
  lag.enable();
  return { maxMs: () => Math.round(lag.max / 1e6), p99Ms: () => Math.round(lag.percentile(99) / 1e6), reset: () => lag.reset() };
}

/** This process's open file descriptors (-1 without /proc). */
export function openFdCount(): number {
  try {
    return readdirSync('/proc/self/fd').length;
  } catch {
    return -1;
  }
}

// ---- a producer's ---

/** Returns whether SIGTERM has arrived: a producer then starts nothing new, finishes what is in flight and says done. */
export function stopOnSigterm(): () => boolean {
  let stopping = false;
  process.on('SIGTERM', () => {
    stopping = true;
  });
  return () => stopping;
}

/**
 * The acknowledgement log, kept OUTSIDE the database: lines are appended only
 * after their enqueue's COMMIT returned. A database that loses acknowledged
 * enqueues cannot hide it by losing the log as well.
 */
export class AckLog {
  readonly #fd: number;
  constructor(path: string) {
    this.#fd = openSync(path, 'a');
  }
  append(lines: string[]): void {
    writeSync(this.#fd, `${lines.join('\n')}\n`);
  }
  sync(): void {
    fsyncSync(this.#fd);
  }
  close(): void {
    fsyncSync(this.#fd);
    closeSync(this.#fd);
  }
}

/**
 * Calls `one()` `count` times, the i-th not before i/rate seconds after `t0`
 * (rate 0: no pacing), at most `inflight` at once; starts none once `stopped()`.
 * Resolves when every call has settled.
 */
export async function runPaced(
  { count, rate, inflight, t0, stopped }: { count: number; rate: number; inflight: number; t0: number; stopped: () => boolean },
  one: () => Promise<void>,
): Promise<void> {
  const running = new Set<Promise<void>>();
  for (let i = 0; i < count && !stopped(); i++) {
    if (rate > 0) {
      const wait = t0 + (i * 1000) / rate - performance.now();
      if (wait > 0) await delay(wait);
    }
    while (running.size >= inflight) await Promise.race(running);
    const p = one().finally(() => running.delete(p));
    running.add(p);
  }
  await Promise.all(running);
}

/** An error's code (null if none) and its message cut to `max` characters, for an {"event":"error"} line. */
export function errorFields(err: unknown, max: number): { code: string | null; message: string } {
  const e = err as { code?: string; message?: string };
  return { code: e.code ?? null, message: String(e.message ?? err).slice(0, max) };
}
