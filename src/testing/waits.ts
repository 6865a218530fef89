/**
 * pgasynq/testing's waits: drain() runs a server until no task is left to
 * run, waitForTask() resolves once one task has finished, completed or
 * archived. Both wake at the database's notifications and read what the
 * database says, with a slow poll behind the notifications.
 */
import { Client } from '../client.js';
import type { ConnectionOptions } from '../internal/connection.js';
import { Inspector } from '../inspector.js';
import { runnableTasks } from '../inspector-internal.js';
import { DrainTimeoutError, InvalidOptionError, TaskCanceledError, TaskFailedError } from '../model/errors.js';
import type { TaskInfo } from '../model/task.js';
import * as v from '../model/validate.js';
import type { ServeMux } from '../mux.js';
import { Server, type ServerConfig } from '../server.js';
import type { Handler } from '../server/handler.js';

/** How often drain() reads the queues when no event came: events wake it sooner. */
const POLL_MS = 250;

/** A test database from createTestDatabase(), or options that name a database and schema. */
export type TestConnection = { readonly connection: ConnectionOptions } | ConnectionOptions;

export interface DrainOptions {
  /** The queues to serve and drain. @defaultValue every queue known when drain() starts */
  queues?: string[];
  /** Rejects with DrainTimeoutError after this many ms. @defaultValue 30,000 */
  timeout?: number;
  /**
   * The drain's server's settings (concurrency, retryDelay, …). A retry due
   * later than now is not work left: give `retryDelay: () => 0` to drain
   * retries too.
   */
  server?: Omit<ServerConfig, 'queues' | keyof ConnectionOptions>;
}

/** What drain() ran. */
export interface DrainResult {
  /** Handler runs. */
  runs: number;
  /** Runs whose handler threw (a Snooze included). */
  errors: number;
}

/**
 * Starts a server with `handler` on `queues`, waits until none of them holds
 * a task that could run now (pending, active, or scheduled or retrying and
 * due), shuts the server down and resolves with what ran. Tasks the handlers
 * enqueue into the same queues are drained too. Rejects with
 * DrainTimeoutError after `timeout`.
 *
 * @example
 * await client.enqueue(new Task('email:welcome', { userId: 1 }));
 * const { runs } = await drain(testDb, mux);
 */
export async function drain(db: TestConnection, handler: ServeMux | Handler, opts: DrainOptions = {}): Promise<DrainResult> {
  const connection = connectionOf(db);
  const o = v.plainObject(opts, 'options');
  v.knownKeys(o, ['queues', 'timeout', 'server'], 'options');
  const timeoutMs = o.timeout === undefined ? 30_000 : v.duration(o.timeout, 'timeout');
  const given = o.queues === undefined ? undefined : queueList(o.queues);
  const serverConfig = o.server === undefined ? {} : v.plainObject(o.server, 'server');
  const run = handlerOf(handler);

  const inspector = new Inspector({ ...connection, logger: false });
  const result: DrainResult = { runs: 0, errors: 0 };
  const stop = new AbortController();
  try {
    const queues = given ?? (await inspector.queues());
    if (queues.length === 0) return result;
    let wake = () => {};
    // Events are hints: each wakes the loop, which reads the queues from the database.
    const events = (async () => {
      for await (const _ of inspector.watch({ signal: stop.signal })) wake();
    })().catch(() => {});
    const server = new Server({ logger: false, ...serverConfig, ...connection, queues: Object.fromEntries(queues.map((q) => [q, 1])) });
    await server.start(async (task, ctx) => {
      result.runs++;
      try {
        await run(task, ctx);
      } catch (err) {
        result.errors++;
        throw err;
      }
    });
    try {
      const deadline = performance.now() + timeoutMs;
      for (;;) {
        const woken = new Promise<void>((resolve) => (wake = resolve));
        const left = await runnableTasks(inspector, queues);
        if (left === 0) break;
        const wait = deadline - performance.now();
        if (wait <= 0) throw new DrainTimeoutError(left, timeoutMs);
        let timer: NodeJS.Timeout | undefined;
        await Promise.race([woken, new Promise<void>((resolve) => (timer = setTimeout(resolve, Math.min(POLL_MS, wait))))]);
        clearTimeout(timer);
      }
    } finally {
      await server.shutdown();
      stop.abort();
      await events;
    }
    return result;
  } finally {
    stop.abort();
    await inspector.close();
  }
}

/**
 * Resolves with the task's TaskInfo once it has finished: completed, or
 * archived (retries spent, SkipRetry, cancelled). A completed task without a
 * retention is kept at least 60 s once waited for, so it can be read. Rejects
 * with TaskNotFoundError for a task that does not exist (or was deleted),
 * QueueNotFoundError, and WaitTimeoutError after `timeout` (30,000 ms unless
 * given).
 */
export async function waitForTask(db: TestConnection, queue: string, id: string, opts: { timeout?: number } = {}): Promise<TaskInfo> {
  const connection = connectionOf(db);
  const o = v.plainObject(opts, 'options');
  v.knownKeys(o, ['timeout'], 'options');
  const timeout = o.timeout === undefined ? 30_000 : v.duration(o.timeout, 'timeout');
  const client = new Client({ ...connection, logger: false });
  try {
    return await client.waitFor(queue, id, { timeout });
  } catch (err) {
    if (err instanceof TaskFailedError) return err.task;
    if (!(err instanceof TaskCanceledError)) throw err;
    const inspector = new Inspector({ ...connection, logger: false });
    try {
      return await inspector.getTaskInfo(queue, id);
    } finally {
      await inspector.close();
    }
  } finally {
    await client.close();
  }
}

/** The connection options of a test database, or the options themselves. */
export function connectionOf(db: TestConnection): ConnectionOptions {
  const o = v.plainObject(db, 'db');
  return 'connection' in o ? (o.connection as ConnectionOptions) : o;
}

function queueList(value: unknown): string[] {
  if (!Array.isArray(value) || value.length === 0)
    throw new InvalidOptionError('queues', `must be a non-empty array of queue names (got ${v.describeValue(value)})`);
  return value.map((q, i) => v.queueName(q, `queues[${i}]`));
}

function handlerOf(handler: unknown): Handler {
  if (typeof handler === 'function') return handler as Handler;
  const mux = handler as ServeMux | null;
  if (typeof mux?.processTask === 'function') return (task, ctx) => mux.processTask(task, ctx);
  throw new InvalidOptionError('handler', `must be a handler function or a ServeMux (got ${v.describeValue(handler)})`);
}
