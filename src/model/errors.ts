/**
 * Every error pgasynq throws. Each class carries a stable `code`, so code that
 * cannot rely on `instanceof` (two copies of the package in one process) can
 * use the `is…` helpers at the bottom instead.
 */

import type { TaskInfo } from './task-info.js';

export abstract class PgasynqError extends Error {
  abstract readonly code: string;
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/**
 * A bad argument or option, raised before anything is sent to the database.
 * `field` names it and `rule` says what it broke; the message is both:
 * "maxRetry must be an integer in [0, 1000] (got -1)".
 */
export class ValidationError extends PgasynqError {
  readonly code: string = 'ERR_VALIDATION';
  constructor(
    readonly field: string,
    readonly rule: string,
  ) {
    super(`${field} ${rule}`);
  }
}

// The subclasses below say which kind of input was refused; all are ValidationErrors.

/** A queue name that is empty, too long, or holds characters a queue name may not. */
export class InvalidQueueNameError extends ValidationError {}
/** A task type that is empty, too long, or holds characters a type may not. */
export class InvalidTaskTypeError extends ValidationError {}
/** A task id (`taskId`) that is empty, too long, or holds characters an id may not. */
export class InvalidTaskIdError extends ValidationError {}
/** A `schema` option that is not a lower-case identifier (`^[a-z_][a-z0-9_]*$`) of at most 55 characters, or starts with `pg_`. */
export class InvalidSchemaNameError extends ValidationError {}
/** An option of a task, an enqueue or a configuration that breaks its rule (the message names both). */
export class InvalidOptionError extends ValidationError {}
/** A payload, result, progress or header value that is not JSON (a cycle, a BigInt, a lone surrogate, …). */
export class PayloadSerializationError extends ValidationError {}
/** A payload (or a batch of them) larger than the client's `maxPayloadBytes`, or headers past their caps. */
export class PayloadTooLargeError extends ValidationError {}
/** A bad Server, Client or Scheduler configuration value. */
export class ConfigError extends ValidationError {}

/** A call on a Client, Inspector or Scheduler after its close(). */
export class ClientClosedError extends PgasynqError {
  readonly code = 'ERR_CLIENT_CLOSED';
  constructor(what = 'client') {
    super(`${what} is closed`);
  }
}

/** The unique lock of the task is held by another task (asynq's ErrDuplicateTask). */
export class DuplicateTaskError extends PgasynqError {
  readonly code = 'ERR_DUPLICATE_TASK';
  constructor(
    readonly queue: string,
    readonly uniqueKey: string,
  ) {
    super(`task already exists: a task with the same type and payload holds the unique lock in queue "${queue}"`);
  }
}

/** A task with this id already exists in the queue, whatever its state (asynq's ErrTaskIDConflict). */
export class TaskIdConflictError extends PgasynqError {
  readonly code = 'ERR_TASK_ID_CONFLICT';
  constructor(
    readonly queue: string,
    readonly taskId: string,
  ) {
    super(`task ID conflicts with another task: id=${taskId} in queue "${queue}"`);
  }
}

/** The queue does not exist in this schema. */
export class QueueNotFoundError extends PgasynqError {
  readonly code = 'ERR_QUEUE_NOT_FOUND';
  constructor(readonly queue: string) {
    super(`queue "${queue}" does not exist`);
  }
}

/** No task with this id in the queue (never enqueued, deleted, or completed without retention). */
export class TaskNotFoundError extends PgasynqError {
  readonly code = 'ERR_TASK_NOT_FOUND';
  constructor(
    readonly queue: string,
    readonly taskId: string,
  ) {
    super(`cannot find task with id=${taskId} in queue "${queue}"`);
  }
}

/** `Inspector.deleteQueue` without `force` on a queue that still holds tasks. */
export class QueueNotEmptyError extends PgasynqError {
  readonly code = 'ERR_QUEUE_NOT_EMPTY';
  constructor(readonly queue: string) {
    super(`queue "${queue}" is not empty`);
  }
}

/**
 * The state of things forbids the call: the task's state forbids the action
 * (deleting an active task, running a pending one), or the schema is not
 * migrated (the message says to run `pgasynq migrate`).
 */
export class FailedPreconditionError extends PgasynqError {
  readonly code = 'ERR_FAILED_PRECONDITION';
}

/** Why the database cannot be used, when waiting will not change it. */
export type DatabaseUnavailableReason = 'database-not-found' | 'authentication-failed' | 'host-not-found';

/**
 * The database refused us for a reason that waiting will not fix: the
 * database does not exist (SQLSTATE 3D000), the role does not exist or its
 * authentication failed (28000, 28P01, or no password for a server that asks
 * for one), or the host name does not resolve (ENOTFOUND). Server.start() and
 * Scheduler.start() reject with it instead of retrying forever; any other
 * call rejects with it too. The message names the cause and the server
 * (never a password); `cause` is the driver's error. A database that is only
 * unreachable (refused connection, timeout, restart) is not this error: it
 * is retried.
 */
export class DatabaseUnavailableError extends PgasynqError {
  readonly code = 'ERR_DATABASE_UNAVAILABLE';
  constructor(
    readonly reason: DatabaseUnavailableReason,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

/** The server is shutting down or closed; also the abort reason handlers see at shutdown. */
export class ServerClosedError extends PgasynqError {
  readonly code = 'ERR_SERVER_CLOSED';
  constructor(message = 'pgasynq: server closed') {
    super(message);
  }
}

/** The worker no longer holds the task's lease: whatever it writes about the task is dropped. */
export class LeaseExpiredError extends PgasynqError {
  readonly code = 'ERR_LEASE_EXPIRED';
  /** `cause`: the error that ended the work, when the lost lease explains it (a session PostgreSQL ended). */
  constructor(options?: { cause?: unknown }) {
    super('task lease expired', options);
  }
}

/** The task ran past its timeout or deadline. */
export class TaskTimeoutError extends PgasynqError {
  readonly code = 'ERR_TASK_TIMEOUT';
  constructor(message = 'task deadline exceeded') {
    super(message);
  }
}

/** The task was cancelled through `Inspector.cancelProcessing`. */
export class TaskCanceledError extends PgasynqError {
  readonly code = 'ERR_TASK_CANCELED';
  constructor() {
    super('task canceled');
  }
}

/** Client.waitFor: the task was archived (its retries spent, SkipRetry, a dependency failed); `task.lastError` says why. */
export class TaskFailedError extends PgasynqError {
  readonly code = 'ERR_TASK_FAILED';
  constructor(readonly task: TaskInfo) {
    super(`task ${task.queue}/${task.id} failed: ${task.lastError ?? 'archived'}`);
  }
}

/** pgasynq/testing's drain(): tasks were still to run when its timeout passed. */
export class DrainTimeoutError extends PgasynqError {
  readonly code = 'ERR_DRAIN_TIMEOUT';
  constructor(
    /** Tasks pending, active, or due in scheduled or retry when it gave up. */
    readonly remaining: number,
    readonly timeoutMs: number,
  ) {
    super(`${remaining} task${remaining === 1 ? ' was' : 's were'} still to run after ${timeoutMs} ms`);
  }
}

/** Client.waitFor: the task did not finish within the timeout. */
export class WaitTimeoutError extends PgasynqError {
  readonly code = 'ERR_WAIT_TIMEOUT';
  constructor(
    readonly queue: string,
    readonly taskId: string,
    readonly timeoutMs: number,
  ) {
    super(`task ${queue}/${taskId} did not finish within ${timeoutMs} ms`);
  }
}

/** No handler matches the task's type (asynq's ErrHandlerNotFound); retried like any failure. */
export class HandlerNotFoundError extends PgasynqError {
  readonly code = 'ERR_HANDLER_NOT_FOUND';
  constructor(readonly type: string) {
    super(`handler not found for task "${type}"`);
  }
}

/** Thrown by a handler: archive the task now, without the remaining retries. */
export class SkipRetry extends PgasynqError {
  readonly code = 'ERR_SKIP_RETRY';
  constructor(message = 'skip retry for the task', options?: { cause?: unknown }) {
    super(message, options);
  }
}

/** Thrown by a handler: drop the task, neither retried nor archived. */
export class RevokeTask extends PgasynqError {
  readonly code = 'ERR_REVOKE_TASK';
  constructor(message = 'revoke task', options?: { cause?: unknown }) {
    super(message, options);
  }
}

function hasCode(err: unknown, code: string): boolean {
  return typeof err === 'object' && err !== null && (err as { code?: unknown }).code === code;
}

/** `err`, or the first error on its `cause` chain, that carries `code`. */
export function onCauseChain(err: unknown, code: string): unknown {
  const seen = new Set<unknown>();
  for (let e = err; typeof e === 'object' && e !== null && !seen.has(e); e = (e as { cause?: unknown }).cause) {
    if (hasCode(e, code)) return e;
    seen.add(e);
  }
  return undefined;
}

const causeChainHas = (err: unknown, code: string): boolean => onCauseChain(err, code) !== undefined;

export const isValidationError = (err: unknown): err is ValidationError => hasCode(err, 'ERR_VALIDATION');
export const isDuplicateTask = (err: unknown): err is DuplicateTaskError => hasCode(err, 'ERR_DUPLICATE_TASK');
export const isTaskIdConflict = (err: unknown): err is TaskIdConflictError => hasCode(err, 'ERR_TASK_ID_CONFLICT');
export const isQueueNotFound = (err: unknown): err is QueueNotFoundError => hasCode(err, 'ERR_QUEUE_NOT_FOUND');
export const isTaskNotFound = (err: unknown): err is TaskNotFoundError => hasCode(err, 'ERR_TASK_NOT_FOUND');
export const isLeaseExpired = (err: unknown): err is LeaseExpiredError => hasCode(err, 'ERR_LEASE_EXPIRED');
export const isTaskFailed = (err: unknown): err is TaskFailedError => hasCode(err, 'ERR_TASK_FAILED');
export const isWaitTimeout = (err: unknown): err is WaitTimeoutError => hasCode(err, 'ERR_WAIT_TIMEOUT');
export const isServerClosed = (err: unknown): err is ServerClosedError => hasCode(err, 'ERR_SERVER_CLOSED');
export const isDatabaseUnavailable = (err: unknown): err is DatabaseUnavailableError => hasCode(err, 'ERR_DATABASE_UNAVAILABLE');
/** SkipRetry anywhere on the cause chain. */
export const isSkipRetry = (err: unknown): boolean => causeChainHas(err, 'ERR_SKIP_RETRY');
/** RevokeTask anywhere on the cause chain. */
export const isRevokeTask = (err: unknown): boolean => causeChainHas(err, 'ERR_REVOKE_TASK');

/** How much of a thrown non-Error value its description keeps. */
const MAX_THROWN_TEXT = 200;

/** A short, safe description of any thrown value: `"boom"`, `undefined`, `42`, `{"code":7}`. */
function describeThrown(thrown: unknown): string {
  let text: string;
  try {
    if (typeof thrown === 'string') text = JSON.stringify(thrown.length > MAX_THROWN_TEXT ? thrown.slice(0, MAX_THROWN_TEXT) : thrown);
    else if (typeof thrown === 'bigint') text = `${thrown}n`;
    else if (typeof thrown === 'function') text = 'a function';
    else if (typeof thrown === 'object' && thrown !== null) text = JSON.stringify(thrown) ?? Object.prototype.toString.call(thrown);
    else text = String(thrown);
  } catch {
    // A cycle, a BigInt inside, a throwing toJSON or getter: the tag is enough.
    text = Object.prototype.toString.call(thrown);
  }
  return text.length > MAX_THROWN_TEXT ? `${text.slice(0, MAX_THROWN_TEXT)}…` : text;
}

/**
 * Turns anything thrown into an Error, once, at the boundary where user code
 * returns. An Error is returned as it is; anything else (`throw "boom"`,
 * `throw undefined`) becomes an Error whose message says so,
 * `non-Error thrown: "boom"`, with the value as its `cause`.
 */
export function coerceError(thrown: unknown): Error {
  if (thrown instanceof Error) return thrown;
  return new Error(`non-Error thrown: ${describeThrown(thrown)}`, { cause: thrown });
}
