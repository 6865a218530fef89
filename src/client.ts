/**
 * Client: puts tasks in queues. No background work; one statement per call
 * (a call with dependencies or replacements: a transaction of a few).
 */
import { Db, type Transactional } from './broker/db.js';
import { CONNECTION_OPTION_KEYS, type ConnectionOptions } from './internal/connection.js';
import { insertWithDependencies } from './broker/dependencies.js';
import { insertOrReplace } from './broker/replace.js';
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

  constructor(opts: ClientOptions = {}) {
    // As the Server and the Scheduler: a misspelt option is an error, never ignored.
    v.knownKeys(v.plainObject(opts, 'options', ConfigError), CLIENT_OPTION_KEYS, 'options', ConfigError);
    this.#maxPayloadBytes = maxPayloadBytesOption(opts.maxPayloadBytes, ConfigError);
    const logger = resolveLogger(opts);
    this.#log = logger.child({ component: 'client' });
    // Enqueues are acknowledged on COMMIT: on a pool of its own, the Client's sessions commit
    // durably whatever the database's synchronous_commit default (see Db's durableCommit).
    this.#db = new Db(opts, 'pgasynq:client', { durableCommit: true, logger });
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

  /** Tasks with dependencies or to replace take a transaction of their own (or the caller's); the others one statement. */
  #insert(records: TaskRecord[], tx: Transactional | undefined): Promise<TaskInfo[]> {
    return records.some((r) => r.replace) ? insertOrReplace(this.#db, records, tx) : insertWithDependencies(this.#db, records, tx);
  }

  #checkOpen(): void {
    if (this.#db.closed) throw new ClientClosedError();
  }

  /** Ends the pool if the client created it. */
  close(): Promise<void> {
    return this.#db.close();
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
