/**
 * Client: puts tasks in queues, and waits for them. No background work but
 * while a wait runs; one statement per enqueue (a call with dependencies or
 * replacements: a transaction of a few).
 */
import { Db, type Transactional } from './broker/db.js';
import { CONNECTION_OPTION_KEYS, type ConnectionOptions } from './internal/connection.js';
import { insertWithDependencies } from './broker/dependencies.js';
import { awaitTasks } from './broker/following.js';
import { insertOrReplace } from './broker/replace.js';
import { transaction } from './broker/transaction.js';
import { TaskWaits } from './task-waits.js';
import type { TaskRecord } from './model/task.js';
import { ClientClosedError, ConfigError, InvalidOptionError } from './model/errors.js';
import { resolveLogger, type Logger } from './internal/logger.js';
import { traceSend } from './internal/otel.js';
import { maxPayloadBytesOption } from './model/payload.js';
import * as v from './model/validate.js';
import { checkCallSize, toRecord, validateOptions, type EnqueueOptions, type Task, type TaskInfo } from './model/task.js';

/** Enqueue options, plus the caller's open transaction to enqueue in. */
export type EnqueueCallOptions = EnqueueOptions & {
  /**
   * A transaction you hold open (a Kysely Transaction, or a pg client after BEGIN).
   * The task is enqueued if the transaction commits, is gone if it rolls back,
   * and is not visible to workers until the commit.
   * @defaultValue none: the enqueue commits on its own
   */
  tx?: Transactional;
};

function splitTx(opts: EnqueueCallOptions | undefined): [EnqueueOptions, Transactional | undefined] {
  if (opts === undefined) return [{}, undefined];
  // null, a string or an array is refused as "options must be an object", not destructured.
  if (typeof opts !== 'object' || opts === null || Array.isArray(opts)) return [validateOptions(opts), undefined];
  const { tx, ...rest } = opts;
  // A Kysely Transaction has getExecutor(), a pg client query(): anything else would fail later as "tx.query is not a function".
  if (tx !== undefined && !isTransactional(tx)) {
    throw new InvalidOptionError('tx', `must be a Kysely Transaction or a pg client inside BEGIN (got ${describeTx(tx)})`);
  }
  return [validateOptions(rest), tx];
}

function isTransactional(tx: unknown): tx is Transactional {
  const t = tx as { query?: unknown; getExecutor?: unknown } | null;
  return typeof t === 'object' && t !== null && (typeof t.getExecutor === 'function' || typeof t.query === 'function');
}

const describeTx = (tx: unknown) => (typeof tx === 'object' && tx !== null ? 'an object with neither query() nor getExecutor()' : v.describeValue(tx));

/** Client options: the connection, and the payload size cap. */
export interface ClientOptions extends ConnectionOptions {
  /**
   * Largest payload accepted, in bytes of its stored form (UTF-8 JSON text,
   * or the bytes); a larger one is a PayloadTooLargeError before anything is
   * sent. At most 268,435,455 (PostgreSQL's jsonb limit). Headers are not
   * counted: they have a cap of their own (MAX_HEADERS_BYTES). @defaultValue 1,048,576 (1 MiB)
   */
  maxPayloadBytes?: number;
}

/** How long waitFor() waits, and what can end the wait early. */
export interface WaitOptions {
  /** Give up after this many ms with WaitTimeoutError. @defaultValue no limit */
  timeout?: number;
  /** Aborting it rejects the wait with the signal's reason (the task goes on). @defaultValue none */
  signal?: AbortSignal;
}

/** enqueueAndWait()'s options: the enqueue's (not `tx`: the task runs only after your commit) and the wait's. */
export type EnqueueAndWaitOptions = EnqueueOptions & {
  tx?: never;
  /** waitFor()'s `timeout`. @defaultValue no limit */
  waitTimeout?: number;
  /** waitFor()'s `signal`: aborting it rejects the wait with its reason (the task goes on). @defaultValue none */
  signal?: AbortSignal;
};

/** The wait's part of waitFor()'s and enqueueAndWait()'s options, checked. */
function waitOptions(timeout: unknown, signal: unknown, field: string): [number | undefined, AbortSignal | undefined] {
  const ms = timeout === undefined ? undefined : v.duration(timeout, field, 0, v.MAX_TIMER_MS);
  if (signal !== undefined && !(signal instanceof AbortSignal))
    throw new InvalidOptionError('signal', `must be an AbortSignal (got ${v.describeValue(signal)})`);
  return [ms, signal];
}

const CLIENT_OPTION_KEYS = [...CONNECTION_OPTION_KEYS, 'maxPayloadBytes'] as const satisfies readonly (keyof ClientOptions)[];

/**
 * @example
 * const client = new Client({ connectionString: process.env.DATABASE_URL });
 * await client.enqueue(new Task('email:welcome', { userId: 42 }), { queue: 'critical' });
 */
export class Client {
  readonly #db: Db;
  readonly #log: Logger;
  readonly #maxPayloadBytes: number;
  readonly #waits: TaskWaits;

  constructor(opts: ClientOptions = {}) {
    // As the Server and the Scheduler: a misspelt option is an error, never ignored.
    v.knownKeys(v.plainObject(opts, 'options', ConfigError), CLIENT_OPTION_KEYS, 'options', ConfigError);
    this.#maxPayloadBytes = maxPayloadBytesOption(opts.maxPayloadBytes, ConfigError);
    const logger = resolveLogger(opts);
    this.#log = logger.child({ component: 'client' });
    // Enqueues are acknowledged on COMMIT: on a pool of its own, the Client's sessions commit
    // durably whatever the database's synchronous_commit default (see Db's durableCommit).
    this.#db = new Db(opts, 'pgasynq:client', { durableCommit: true, logger });
    this.#waits = new TaskWaits(this.#db, this.#log);
  }

  /** Enqueues one task. Options given here override those of the Task. */
  async enqueue(task: Task, opts?: EnqueueCallOptions): Promise<TaskInfo> {
    const [overrides, tx] = splitTx(opts);
    const record = toRecord(task, overrides, undefined, this.#maxPayloadBytes);
    checkCallSize([record], 'task');
    this.#checkOpen();
    const [info] = (await traceSend([record], () => this.#insert([record], tx))) as [TaskInfo];
    this.#log.debug({ task: { id: info.id, type: info.type, queue: info.queue }, state: info.state }, 'task enqueued');
    return info;
  }

  /**
   * Enqueues many tasks in one statement: all of them, or none when any is
   * invalid or conflicts. Results match the tasks index by index.
   */
  async enqueueMany(tasks: Task[], opts?: EnqueueCallOptions): Promise<TaskInfo[]> {
    if (!Array.isArray(tasks)) throw new InvalidOptionError('tasks', 'must be an array of Task');
    const [overrides, tx] = splitTx(opts);
    const records = tasks.map((task, i) => toRecord(task, overrides, i, this.#maxPayloadBytes));
    checkCallSize(records, 'tasks');
    this.#checkOpen();
    if (records.length === 0) return [];
    const infos = await traceSend(records, () => this.#insert(records, tx), true);
    this.#log.debug({ tasks: infos.length }, 'tasks enqueued');
    return infos;
  }

  /**
   * Waits for a task to finish, from any process: resolves with its TaskInfo
   * once it completed (`state` 'completed'; `result` what the handler wrote).
   * Rejects with TaskFailedError when it is archived (`task.lastError` says
   * why), TaskCanceledError when it was cancelled and archived,
   * TaskNotFoundError when there is no such task (never was, or deleted: a
   * task completed without retention before anyone waited for it is gone),
   * QueueNotFoundError for an unknown queue, WaitTimeoutError after
   * `timeout`, and the signal's reason when aborted. From the first call the
   * task is marked awaited: it is then kept at least 60 s once completed (its
   * retention if longer), so the outcome can be read. Wakes at the task's
   * notification, and reads the task's state every 2 s behind it.
   */
  async waitFor(queue: string, id: string, opts: WaitOptions = {}): Promise<TaskInfo> {
    const o = v.plainObject(opts, 'options');
    v.knownKeys(o, ['timeout', 'signal'], 'options');
    const [timeoutMs, signal] = waitOptions(o.timeout, o.signal, 'timeout');
    const [q, taskId] = [v.queueName(queue), v.taskId(id)];
    this.#checkOpen();
    return this.#waits.wait(q, taskId, timeoutMs, signal);
  }

  /**
   * Enqueues a task and waits for it (waitFor()): one call for a request
   * that needs the result. The task is marked awaited as it is inserted, so
   * even a task completed at once is kept (at least 60 s, its retention if
   * longer) for the wait to read. Takes no `tx`: a task in your open
   * transaction could not run before you commit.
   */
  async enqueueAndWait(task: Task, opts: EnqueueAndWaitOptions = {}): Promise<TaskInfo> {
    const { waitTimeout, signal, ...rest } = v.plainObject(opts, 'options') as EnqueueAndWaitOptions;
    if ('tx' in rest) throw new InvalidOptionError('tx', 'cannot be used with enqueueAndWait: the task could not run before your transaction commits');
    const [timeoutMs, s] = waitOptions(waitTimeout, signal, 'waitTimeout');
    const record: TaskRecord = { ...toRecord(task, validateOptions(rest), undefined, this.#maxPayloadBytes), awaited: true };
    checkCallSize([record], 'task');
    this.#checkOpen();
    // One statement; a replace (which may update a task already there, not insert it) marks it in the same transaction.
    const insert: () => Promise<unknown> = record.replace
      ? () => transaction(this.#db, async (trx) => awaitTasks(this.#db, await insertOrReplace(this.#db, [record], trx), trx))
      : () => insertWithDependencies(this.#db, [record]);
    return this.#waits.wait(record.queue, record.id, timeoutMs, s, () => traceSend([record], insert));
  }

  /** Tasks with dependencies or to replace take a transaction of their own (or the caller's); the others one statement. */
  #insert(records: TaskRecord[], tx: Transactional | undefined): Promise<TaskInfo[]> {
    return records.some((r) => r.replace) ? insertOrReplace(this.#db, records, tx) : insertWithDependencies(this.#db, records, tx);
  }

  #checkOpen(): void {
    if (this.#db.closed) throw new ClientClosedError();
  }

  /** Ends the waits (ClientClosedError) and the pool if the client created it. */
  async close(): Promise<void> {
    await this.#waits.close();
    await this.#db.close();
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
