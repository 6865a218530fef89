/**
 * pgasynq/testing's runTask(): one run of a handler with a TaskContext that
 * records what the handler did (results, progress, log lines, logger calls,
 * transactions) instead of writing it to a task row, and the outcome a server
 * would give the run: no server, no queue, no task row. The context checks
 * every value as a server's does, so a bad value fails here as it would in
 * production.
 */
import type { Kysely, Transaction } from 'kysely';
import type { Logger } from '../internal/logger.js';
import { ConfigError, coerceError, InvalidOptionError, isRevokeTask, TaskCanceledError, TaskTimeoutError } from '../model/errors.js';
import { logLine, progressJson } from '../model/following.js';
import { encodePayload } from '../model/payload.js';
import { snoozeOf } from '../model/snooze.js';
import { DEFAULT_MAX_RETRY, MAX_RETRY_LIMIT, Task } from '../model/task.js';
import * as v from '../model/validate.js';
import type { Handler, TaskContext } from '../server/handler.js';
import { archivesTask, failureOutcome } from '../server/outcomes.js';
import { writeInTransaction } from '../server/task-context.js';

export interface RunTaskOptions {
  /** ctx.taskId. @defaultValue 'test-task' */
  taskId?: string;
  /** ctx.queue. @defaultValue 'default' */
  queue?: string;
  /** ctx.retryCount: the retries before this run. @defaultValue 0 */
  retryCount?: number;
  /** ctx.maxRetry. @defaultValue the task's maxRetry option, else 25 */
  maxRetry?: number;
  /** What ctx.dependencyResults() returns, keyed `queue/id`. @defaultValue none */
  dependencyResults?: Map<string, unknown> | Record<string, unknown>;
  /**
   * The database ctx.transaction(fn) runs `fn` on, in a transaction of its
   * own that commits (there is no task row to complete with it). Without it,
   * ctx.transaction rejects with ConfigError naming `db`.
   */
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  db?: Kysely<any>;
  /** Aborts ctx.signal with TaskTimeoutError after this many ms, and ends the run as a server would. @defaultValue the task's timeout option, else none */
  timeout?: number;
  /** Aborting it aborts ctx.signal with TaskCanceledError (an Inspector's cancelProcessing) and ends the run. */
  signal?: AbortSignal;
}

/** One run, as runTask() saw it. */
export interface TaskRun {
  /**
   * How the run ended, as a server would record it (AttemptInfo.outcome):
   * 'completed' (RevokeTask too: completed, not kept), 'failed', 'snoozed',
   * 'timeout' or 'canceled'.
   */
  outcome: 'completed' | 'failed' | 'snoozed' | 'timeout' | 'canceled';
  /**
   * Where a server would put the task next: 'completed' (kept for its retention, or deleted),
   * 'revoked' (RevokeTask: deleted), 'retry', 'archived' (SkipRetry, or retries spent), or
   * 'scheduled' (snoozed).
   */
  next: 'completed' | 'revoked' | 'retry' | 'archived' | 'scheduled';
  /** What the handler threw, or the reason the run was aborted. */
  error?: Error;
  /** A Snooze's delay, in ms. */
  snoozeMs?: number;
  /** The last value ctx.writeResult() stored, as a reader would get it back (bytes as a Buffer); undefined if none. */
  result?: unknown;
  /** Every ctx.progress() value, in order. */
  progress: (number | Record<string, unknown>)[];
  /** Every ctx.log() line, in order, cut as a server cuts them. */
  logs: string[];
  /** What the handler wrote with ctx.logger, in order. */
  logged: { level: 'debug' | 'info' | 'warn' | 'error'; fields: Record<string, unknown>; msg?: string }[];
  /** How many ctx.transaction() calls committed. */
  transactions: number;
}

/**
 * Runs `handler` once on `task` with a recording TaskContext and resolves
 * with the run: its outcome, where a server would put the task next, and what
 * the handler wrote. Never rejects for what the handler does; ValidationError
 * (ConfigError) for bad options.
 *
 * @example
 * const run = await runTask(sendWelcome, new Task('email:welcome', { userId: 1 }));
 * assert.equal(run.outcome, 'completed');
 */
export async function runTask<P>(handler: Handler<P>, task: Task<P>, opts: RunTaskOptions = {}): Promise<TaskRun> {
  v.func(handler, 'handler');
  if (!(task instanceof Task)) throw new InvalidOptionError('task', `must be a Task (got ${v.describeValue(task)})`);
  const o = v.plainObject(opts, 'options');
  v.knownKeys(o, ['taskId', 'queue', 'retryCount', 'maxRetry', 'dependencyResults', 'timeout', 'signal', 'db'], 'options');
  const retryCount = o.retryCount === undefined ? 0 : v.integer(o.retryCount, 'retryCount', 0, MAX_RETRY_LIMIT);
  const maxRetry = o.maxRetry === undefined ? (task.options.maxRetry ?? DEFAULT_MAX_RETRY) : v.integer(o.maxRetry, 'maxRetry', 0, MAX_RETRY_LIMIT);
  const timeoutMs = o.timeout === undefined ? task.options.timeout : v.duration(o.timeout, 'timeout');
  const signal = o.signal === undefined ? undefined : abortSignal(o.signal);
  const db = o.db as RunTaskOptions['db'];
  if (db !== undefined && typeof (db as { transaction?: unknown } | null)?.transaction !== 'function')
    throw new InvalidOptionError('db', 'must be a Kysely instance');
  const dependencyResults = new Map(
    o.dependencyResults instanceof Map
      ? o.dependencyResults
      : Object.entries(o.dependencyResults === undefined ? {} : v.plainObject(o.dependencyResults, 'dependencyResults')),
  );

  const run: TaskRun = { outcome: 'completed', next: 'completed', progress: [], logs: [], logged: [], transactions: 0 };
  let inTransaction = false;
  const aborter = new AbortController();
  const abort = (reason: Error) => aborter.abort(reason);
  const ctx: TaskContext = {
    taskId: o.taskId === undefined ? 'test-task' : v.taskId(o.taskId),
    queue: o.queue === undefined ? 'default' : v.queueName(o.queue),
    retryCount,
    maxRetry,
    attempt: retryCount + 1,
    signal: aborter.signal,
    logger: recordingLogger(run.logged),
    writeResult: (data) =>
      promised(() => {
        checkRunning(aborter.signal);
        if (inTransaction) throw writeInTransaction('writeResult');
        const encoded = encodePayload(data, 'result');
        run.result = encoded.bytes ?? (encoded.json === null ? null : JSON.parse(encoded.json));
      }),
    progress: (value) =>
      promised(() => {
        checkRunning(aborter.signal);
        if (inTransaction) throw writeInTransaction('progress');
        run.progress.push(JSON.parse(progressJson(value)) as number | Record<string, unknown>);
      }),
    log: (message) => {
      checkRunning(aborter.signal);
      run.logs.push(logLine(message));
    },
    dependencyResults: () => Promise.resolve(new Map(dependencyResults)),
    transaction: async (fn) => {
      checkRunning(aborter.signal);
      if (db === undefined) throw new ConfigError('db', 'runTask needs a Kysely instance in options.db for ctx.transaction');
      inTransaction = true;
      try {
        // eslint-disable-next-line @typescript-eslint/no-explicit-any
        const value = await db.transaction().execute((trx: Transaction<any>) => fn(trx));
        run.transactions++;
        return value;
      } finally {
        inTransaction = false;
      }
    },
  };

  const timer = timeoutMs === undefined ? undefined : setTimeout(() => abort(new TaskTimeoutError()), timeoutMs);
  const onCancel = () => abort(new TaskCanceledError());
  if (signal?.aborted) onCancel();
  signal?.addEventListener('abort', onCancel);
  let error: Error | undefined;
  try {
    // As a server does: an abort ends the run at once, whether or not the handler heeds it.
    error = await new Promise<Error | undefined>((resolve) => {
      aborter.signal.addEventListener('abort', () => resolve(aborter.signal.reason as Error));
      if (aborter.signal.aborted) return resolve(aborter.signal.reason as Error);
      try {
        Promise.resolve(handler(task, ctx)).then(
          () => resolve(undefined),
          (thrown: unknown) => resolve(coerceError(thrown)),
        );
      } catch (thrown) {
        resolve(coerceError(thrown));
      }
    });
  } finally {
    clearTimeout(timer);
    signal?.removeEventListener('abort', onCancel);
  }
  return { ...run, ...outcomeOf(error, retryCount, maxRetry) };
}

/** The outcome and next state a server gives a run that ended with `error` (none: completed). */
function outcomeOf(error: Error | undefined, retryCount: number, maxRetry: number): Pick<TaskRun, 'outcome' | 'next' | 'error' | 'snoozeMs'> {
  if (error === undefined) return { outcome: 'completed', next: 'completed' };
  if (isRevokeTask(error)) return { outcome: 'completed', next: 'revoked', error };
  const snooze = snoozeOf(error);
  if (snooze) return { outcome: 'snoozed', next: 'scheduled', error, snoozeMs: snooze.delayMs };
  // The server's own rules (server/outcomes.ts), so that a run here ends as it would there.
  return { outcome: failureOutcome(error), next: archivesTask(error, retryCount, maxRetry) ? 'archived' : 'retry', error };
}

/** `fn`'s value, or its throw as a rejection: the context's writes reject as a server's do. */
function promised<T>(fn: () => T): Promise<T> {
  return new Promise((resolve) => resolve(fn()));
}

/** As a server's context does once the run was aborted: nothing more is written. */
function checkRunning(signal: AbortSignal): void {
  if (signal.aborted) throw signal.reason;
}

function abortSignal(value: unknown): AbortSignal {
  if (!(value instanceof AbortSignal)) throw new InvalidOptionError('signal', `must be an AbortSignal (got ${v.describeValue(value)})`);
  return value;
}

/** A pino-shaped logger that keeps each call in `into`. */
function recordingLogger(into: TaskRun['logged'], bound: Record<string, unknown> = {}): Logger {
  const at =
    (level: TaskRun['logged'][number]['level']) =>
    (fieldsOrMsg?: unknown, msg?: string): void => {
      const fields = typeof fieldsOrMsg === 'object' && fieldsOrMsg !== null ? (fieldsOrMsg as Record<string, unknown>) : {};
      const text = typeof fieldsOrMsg === 'string' ? fieldsOrMsg : msg;
      into.push({ level, fields: { ...bound, ...fields }, ...(text === undefined ? {} : { msg: text }) });
    };
  return {
    debug: at('debug'),
    info: at('info'),
    warn: at('warn'),
    error: at('error'),
    child: (more: Record<string, unknown>) => recordingLogger(into, { ...bound, ...more }),
  };
}
