/**
 * Task, its enqueue options and their validation, and the TaskInfo that every
 * read of a task returns.
 */
import { createHash } from 'node:crypto';
import { InvalidOptionError, InvalidTaskTypeError, PayloadTooLargeError } from './errors.js';
import { MAX_HEADERS_BYTES, checkHeadersSize, validateHeaders } from './headers.js';
import { MAX_PAYLOAD_BYTES, MAX_PAYLOAD_BYTES_LIMIT, checkPayloadSize, encodePayload, encodedSize, type EncodedPayload } from './payload.js';
import { timeOrderedUuid } from './task-id.js';
import type { TaskRef } from './task-info.js';

export { TASK_STATES, type TaskInfo, type TaskRef, type TaskState } from './task-info.js';
import * as v from './validate.js';

/** What to do with a task when one of its dependencies fails (is archived or deleted). */
export type DependencyFailurePolicy = 'archive' | 'run';

/** Per-task options; each mirrors an asynq option. Durations are milliseconds. */
export interface EnqueueOptions {
  /** Queue to put the task in. @defaultValue 'default' */
  queue?: string;
  /** How many times a failed task is retried before it is archived (so at most maxRetry + 1 runs). @defaultValue 25 */
  maxRetry?: number;
  /** Task id, unique per queue. @defaultValue a random UUID */
  taskId?: string;
  /**
   * Time limit of one attempt, from its start. 0: not set. With neither timeout nor deadline: 30 min.
   * @defaultValue 30 min without a deadline; not set with one
   */
  timeout?: number;
  /** Time limit across all attempts; in years 0001–9999 UTC. @defaultValue none */
  deadline?: Date;
  /**
   * Hold a uniqueness lock on (queue, type, payload) for this long; 1000 ms to MAX_DURATION_MS (1000 years).
   * @defaultValue none (no lock)
   */
  unique?: number;
  /** Process no earlier than this instant; in years 0001–9999 UTC. @defaultValue none (due at once) */
  processAt?: Date;
  /** Process no earlier than this long from now (database time). @defaultValue none (due at once) */
  processIn?: number;
  /** Keep the task as `completed` this long after success; at most MAX_DURATION_MS (1000 years). @defaultValue 0 (deleted at once) */
  retention?: number;
  /** Aggregate with the other tasks of this group in the queue. @defaultValue none */
  group?: string;
  /**
   * Free-form metadata carried with the task; not part of uniqueness. Strings
   * to strings, at most MAX_HEADER_KEYS (1,000) keys and MAX_HEADERS_BYTES
   * (64 KiB) as stored (UTF-8 JSON text), the Task's and the enqueue's merged:
   * a cap of their own, not a share of maxPayloadBytes.
   * @defaultValue none: the Task's own headers
   */
  headers?: Record<string, string>;
  /**
   * Tasks that must complete first: ids in this task's queue, or `{ queue, id }`
   * anywhere. Each must exist, or be enqueued in the same enqueueMany call.
   * Until the last one completes the task is `waiting`.
   * @defaultValue none
   */
  dependsOn?: (string | TaskRef)[];
  /**
   * When a dependency fails (archived, or deleted before it completed):
   * `'archive'` archives this task too; `'run'` counts the dependency as done.
   * @defaultValue 'archive'
   */
  onDependencyFailure?: DependencyFailurePolicy;
  /**
   * With a taskId: if that task is waiting to run (pending, scheduled, retry
   * or waiting), replace its payload, options and due time in place instead
   * of refusing the id (debounce: the last enqueue wins, one execution). An
   * active or finished task with the id is still a TaskIdConflictError.
   * @defaultValue false
   */
  replace?: boolean;
  /**
   * Higher runs first within the queue, FIFO within a priority; an integer in
   * [−100, 100]. Queue weights still choose between queues.
   * @defaultValue 0
   */
  priority?: number;
  /**
   * What the queue's `keyConcurrency` limit counts by (a tenant, a customer,
   * an API key): at most that many of the queue's tasks with one key are
   * active at once, across all servers. No effect in a queue without it.
   * @defaultValue none
   */
  concurrencyKey?: string;
}

/** The most dependencies one task may have. */
export const MAX_DEPENDENCIES = 10_000;

export const DEFAULT_QUEUE = 'default';
export const DEFAULT_MAX_RETRY = 25;
export const DEFAULT_TIMEOUT_MS = 30 * 60_000;
export const MAX_RETRY_LIMIT = 1000;
export const MIN_PRIORITY = -100;
export const MAX_PRIORITY = 100;

/**
 * Each option's rule, the one place it is checked: the value as given in, the
 * value kept out (or a ValidationError naming the option). The compiler holds
 * this table to EnqueueOptions: an option without its rule does not build,
 * and the known keys are the table's.
 */
const OPTION_RULES: { readonly [K in keyof EnqueueOptions]-?: (value: unknown) => NonNullable<EnqueueOptions[K]> } = {
  queue: (x) => v.queueName(x),
  maxRetry: (x) => v.integer(x, 'maxRetry', 0, MAX_RETRY_LIMIT),
  taskId: (x) => v.taskId(x),
  timeout: (x) => v.duration(x, 'timeout'),
  deadline: (x) => v.date(x, 'deadline'),
  unique: (x) => v.duration(x, 'unique', 1000, v.MAX_DURATION_MS),
  processAt: (x) => v.date(x, 'processAt'),
  processIn: (x) => v.duration(x, 'processIn'),
  retention: (x) => v.duration(x, 'retention', 0, v.MAX_DURATION_MS),
  group: (x) => v.groupName(x),
  headers: (x) => validateHeaders(x),
  dependsOn: (x) => validateDependsOn(x),
  onDependencyFailure: (x) => {
    if (x !== 'archive' && x !== 'run') throw new InvalidOptionError('onDependencyFailure', `must be 'archive' or 'run' (got ${v.describeValue(x)})`);
    return x;
  },
  replace: (x) => v.boolean(x, 'replace'),
  priority: (x) => v.integer(x, 'priority', MIN_PRIORITY, MAX_PRIORITY),
  concurrencyKey: (x) => v.concurrencyKey(x),
};

const OPTION_KEYS = Object.keys(OPTION_RULES);

/** Checks an options object: unknown keys, wrong types and out-of-range values are ValidationErrors. */
export function validateOptions(input: unknown, what = 'options'): EnqueueOptions {
  if (input === undefined) return {};
  const o = v.plainObject(input, what);
  v.knownKeys(o, OPTION_KEYS, what);
  const out: Record<string, unknown> = {};
  // In the table's order, so that of two bad options the same one is named whatever the caller's order.
  for (const key of OPTION_KEYS) {
    if (o[key] !== undefined) out[key] = OPTION_RULES[key as keyof EnqueueOptions](o[key]);
  }
  return out;
}

function validateDependsOn(input: unknown): (string | TaskRef)[] {
  if (!Array.isArray(input)) throw new InvalidOptionError('dependsOn', `must be an array of task ids or { queue, id } (got ${v.describeValue(input)})`);
  if (input.length > MAX_DEPENDENCIES) throw new InvalidOptionError('dependsOn', `may name at most ${MAX_DEPENDENCIES} tasks (got ${input.length})`);
  return input.map((d: unknown, i) => {
    if (typeof d === 'string') return v.taskId(d, `dependsOn[${i}]`);
    const ref = v.plainObject(d, `dependsOn[${i}]`);
    v.knownKeys(ref, ['queue', 'id'], `dependsOn[${i}]`);
    return { queue: v.queueName(ref.queue, `dependsOn[${i}].queue`), id: v.taskId(ref.id, `dependsOn[${i}].id`) };
  });
}

/**
 * A unit of work: a type that selects the handler, a payload, and default
 * options that enqueue-time options override.
 *
 * @example new Task('email:welcome', { userId: 42 }, { queue: 'critical', maxRetry: 5 })
 */
export class Task<P = unknown> {
  readonly type: string;
  readonly payload: P;
  readonly options: Readonly<EnqueueOptions>;
  readonly headers: Readonly<Record<string, string>>;
  /** @internal the payload as stored, checked once at construction */
  readonly encoded: EncodedPayload;

  /**
   * Checks the type, the payload's shape and the options at once. The size
   * cap (`maxPayloadBytes` of the Client, 1 MiB by default) is applied when
   * the task is enqueued, so a Client with a larger cap can take it.
   */
  constructor(type: string, payload?: P, options?: EnqueueOptions) {
    this.type = v.taskType(type);
    this.encoded = encodePayload(payload, 'payload', MAX_PAYLOAD_BYTES_LIMIT);
    this.payload = payload as P;
    this.options = Object.freeze(validateOptions(options));
    this.headers = Object.freeze({ ...this.options.headers });
  }

  /** @internal A task read back from a row: it was validated when it was enqueued. */
  static restore(type: string, payload: unknown, headers: Record<string, string>, options: EnqueueOptions = {}): Task {
    const task = Object.create(Task.prototype) as Task;
    const encoded: EncodedPayload =
      payload instanceof Uint8Array ? { json: null, bytes: Buffer.from(payload) } : { json: payload == null ? null : JSON.stringify(payload), bytes: null };
    Object.assign(task, { type, payload, options: Object.freeze(options), headers: Object.freeze({ ...headers }), encoded });
    return task;
  }
}

/** What the broker inserts for one task: options merged, defaults applied, payload encoded (not exported by the package). */
export interface TaskRecord {
  id: string;
  /** The id was given (taskId), so it may collide with another enqueue's; a generated one cannot. */
  idGiven: boolean;
  queue: string;
  type: string;
  payload: EncodedPayload;
  headers: Record<string, string>;
  maxRetry: number;
  timeoutMs: number;
  deadline: Date | null;
  /** asynq's unique key: type and a digest of the payload bytes; null when not unique. */
  uniqueKey: string | null;
  uniqueTtlMs: number;
  group: string | null;
  retentionMs: number;
  processAt: Date | null;
  processInMs: number | null;
  /** Resolved to queue and id, each once. */
  dependsOn: TaskRef[];
  onDependencyFailure: DependencyFailurePolicy;
  /** Replace a task with this id that has not started (see EnqueueOptions.replace). */
  replace: boolean;
  priority: number;
  concurrencyKey: string | null;
  /** Enqueued by enqueueAndWait(): marked awaited as it is inserted, so that its outcome is kept for the wait. */
  awaited: boolean;
}

/**
 * @internal Merges a task's options with enqueue-time ones (which win) and
 * applies asynq's defaults; refuses a payload over `maxPayloadBytes`.
 */
export function toRecord(task: unknown, overrides: EnqueueOptions, index?: number, maxPayloadBytes = MAX_PAYLOAD_BYTES): TaskRecord {
  if (!(task instanceof Task)) {
    throw new InvalidTaskTypeError(index === undefined ? 'task' : `tasks[${index}]`, 'must be a Task (new Task(type, payload, options))');
  }
  checkPayloadSize(task.encoded, index === undefined ? 'payload' : `tasks[${index}].payload`, maxPayloadBytes);
  const o: EnqueueOptions = { ...task.options, ...overrides };
  if (o.processAt !== undefined && o.processIn !== undefined) {
    throw new InvalidOptionError('processAt', 'and processIn cannot both be set (pick one)');
  }
  // Validation, not scheduling: the host clock is good enough to refuse a deadline already gone.
  if (o.deadline !== undefined && o.deadline.getTime() <= Date.now()) {
    throw new InvalidOptionError('deadline', `is in the past (${o.deadline.toISOString()})`);
  }
  const timeoutMs = o.timeout ?? 0;
  const queue = o.queue ?? DEFAULT_QUEUE;
  const id = o.taskId ?? timeOrderedUuid();
  const dependsOn = resolveDependencies(o.dependsOn ?? [], queue, id);
  if (dependsOn.length > 0 && o.group !== undefined) {
    throw new InvalidOptionError('dependsOn', 'cannot be combined with group: grouped tasks are merged into one, which has no dependencies');
  }
  if (o.replace === true) checkReplace(o);
  return {
    id,
    idGiven: o.taskId !== undefined,
    queue,
    type: task.type,
    payload: task.encoded,
    // Each part was checked alone; merged, the two could pass the cap together.
    headers: overrides.headers === undefined ? { ...task.headers } : checkHeadersSize({ ...task.headers, ...overrides.headers }),
    maxRetry: o.maxRetry ?? DEFAULT_MAX_RETRY,
    timeoutMs: timeoutMs === 0 && o.deadline === undefined ? DEFAULT_TIMEOUT_MS : timeoutMs,
    deadline: o.deadline ?? null,
    uniqueKey: o.unique === undefined ? null : uniqueKey(task),
    uniqueTtlMs: o.unique ?? 0,
    group: o.group ?? null,
    retentionMs: o.retention ?? 0,
    processAt: o.processAt ?? null,
    processInMs: o.processIn ?? null,
    dependsOn,
    onDependencyFailure: o.onDependencyFailure ?? 'archive',
    replace: o.replace === true,
    priority: o.priority ?? 0,
    concurrencyKey: o.concurrencyKey ?? null,
    awaited: false,
  };
}

/**
 * The most one enqueue call may send. Its tasks go to PostgreSQL as one JSON
 * text, which V8 cannot build past 2^29 − 24 characters (a RangeError, after
 * all the work), nor PostgreSQL take past 1 GiB: 512 MiB less 1 MiB for the
 * rest of the statement keeps below both, counted in UTF-8 bytes.
 */
export const MAX_CALL_BYTES = 2 ** 29 - 2 ** 20;
/** A task's fields but its payload and headers, as sent, at most: ids, names, types and keys are all bounded. */
const MAX_RECORD_OVERHEAD = 2048;

/**
 * Refuses a call whose tasks, as sent, would pass MAX_CALL_BYTES, before the
 * text is built: payloads as stored (bytes go as hex, twice their size) and
 * headers, summed. Headers are measured only when their cap could matter.
 */
export function checkCallSize(records: readonly TaskRecord[], field: string): void {
  const payloads = (r: TaskRecord) => (r.payload.bytes !== null ? 2 * r.payload.bytes.byteLength : encodedSize(r.payload)) + MAX_RECORD_OVERHEAD;
  const hasHeaders = (r: TaskRecord) => Object.keys(r.headers).length > 0;
  let bound = 0;
  for (const r of records) bound += payloads(r) + (hasHeaders(r) ? MAX_HEADERS_BYTES : 0);
  if (bound <= MAX_CALL_BYTES) return;
  let size = 0;
  for (const r of records) size += payloads(r) + (hasHeaders(r) ? Buffer.byteLength(JSON.stringify(r.headers)) : 0);
  if (size > MAX_CALL_BYTES) {
    throw new PayloadTooLargeError(
      field,
      `take up to ${size} bytes as sent (payloads, bytes as hex, and headers); one call may send at most ${MAX_CALL_BYTES}${records.length > 1 ? ': split them into several calls' : ''}`,
    );
  }
}

/**
 * A replace names the task it replaces, and keeps to what can change in
 * place: not a unique lock (its key is the payload's), a group (grouped
 * tasks are merged) or dependencies (a waiting task keeps its own).
 */
function checkReplace(o: EnqueueOptions): void {
  if (o.taskId === undefined) throw new InvalidOptionError('replace', 'needs a taskId: the id of the task to replace');
  for (const other of ['unique', 'group', 'dependsOn'] as const) {
    if (o[other] !== undefined) throw new InvalidOptionError('replace', `cannot be combined with ${other}`);
  }
}

/** `queue/id`: how a task is named in messages and in dependencyResults(). */
export const taskName = (t: TaskRef): string => `${t.queue}/${t.id}`;

/** Bare ids in the task's own queue, each dependency once; the task itself refused. */
function resolveDependencies(given: readonly (string | TaskRef)[], queue: string, id: string): TaskRef[] {
  const out = new Map<string, TaskRef>();
  for (const d of given) {
    const ref = typeof d === 'string' ? { queue, id: d } : { queue: d.queue, id: d.id };
    if (ref.queue === queue && ref.id === id) throw new InvalidOptionError('dependsOn', `names the task itself (${taskName(ref)})`);
    out.set(taskName(ref), ref);
  }
  return [...out.values()];
}

/** asynq's key: the type and the md5 of the payload bytes (headers and options are not part of it). */
function uniqueKey(task: Task): string {
  const bytes = task.encoded.bytes ?? Buffer.from(task.encoded.json ?? '');
  return `${task.type}:${createHash('md5').update(bytes).digest('hex')}`;
}
