/**
 * Handlers, the context they receive, and ServeMux, which routes a task to the
 * handler registered for the longest prefix of its type (asynq's ServeMux).
 */
import type { Transaction } from 'kysely';
import { HandlerNotFoundError, ValidationError } from './model/errors.js';
import type { Logger } from './internal/logger.js';
import type { Task } from './model/task.js';

export interface TaskContext {
  readonly taskId: string;
  readonly queue: string;
  /** Retries so far, asynq's GetRetryCount: 0 on the first attempt. */
  readonly retryCount: number;
  readonly maxRetry: number;
  /**
   * This run's attempt number, from 1: retryCount + 1, at most maxRetry + 1.
   * The same number as `attempt` in ctx.logger's lines and the worker's
   * failure line for this run.
   */
  readonly attempt: number;
  /**
   * Aborted on timeout or deadline (TaskTimeoutError), cancellation
   * (TaskCanceledError), lease loss (LeaseExpiredError) and shutdown
   * (ServerClosedError); `signal.reason` says which.
   */
  readonly signal: AbortSignal;
  readonly logger: Logger;
  /** Stores a JSON value or bytes as the task's result (fenced by the lease). */
  writeResult(data: unknown): Promise<void>;
  /**
   * What each of the task's completed dependencies wrote with writeResult,
   * keyed `queue/id` (null for one that wrote nothing), kept until this task
   * is gone whatever the dependencies' retention. A dependency that failed
   * (onDependencyFailure 'run') is not in it. Empty without dependencies.
   */
  dependencyResults(): Promise<Map<string, unknown>>;
  /**
   * Runs `fn` in a PostgreSQL transaction that also completes the task, fenced
   * by the lease: your writes and the completion commit together, or, if the
   * lease was lost, nothing commits and it rejects with LeaseExpiredError.
   */
  // Kysely's any-tables transaction: annotate trx with Transaction<YourDatabase> to type it.
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  transaction<T>(fn: (trx: Transaction<any>) => Promise<T>): Promise<T>;
}

/**
 * Handles one task. `P` is the payload type the handler expects: pgasynq does
 * not check it at run time (a payload is whatever JSON was enqueued), so a
 * handler that may see old or foreign payloads should validate them.
 */
export type Handler<P = unknown> = (task: Task<P>, ctx: TaskContext) => Promise<void> | void;
export type Middleware = (next: Handler) => Handler;

export class ServeMux {
  readonly #routes = new Map<string, Handler>();
  readonly #middleware: Middleware[] = [];
  #sorted: [string, Handler][] = [];

  /**
   * Routes tasks whose type starts with `pattern` (the longest matching pattern wins).
   * @example mux.handle('email:', async (task: Task<WelcomeEmail>, ctx) => send(task.payload.address))
   */
  handle<P = unknown>(pattern: string, handler: Handler<P>): this {
    if (typeof pattern !== 'string' || pattern.trim() === '') throw new ValidationError('pattern', 'must be a non-empty string');
    if (typeof handler !== 'function') throw new ValidationError('handler', 'must be a function');
    if (this.#routes.has(pattern)) throw new ValidationError('pattern', `"${pattern}" is already registered`);
    // The payload type is the handler's promise to itself: tasks are stored untyped.
    this.#routes.set(pattern, handler as Handler);
    this.#sorted = [...this.#routes].sort((a, b) => b[0].length - a[0].length);
    return this;
  }

  /** Adds middleware; the first added is the outermost. */
  use(...middleware: Middleware[]): this {
    for (const m of middleware) if (typeof m !== 'function') throw new ValidationError('middleware', 'must be a function');
    this.#middleware.push(...middleware);
    return this;
  }

  /** The handler for a type, wrapped in the middleware; a not-found handler fails the task. */
  handler(type: string): Handler {
    const route = this.#sorted.find(([pattern]) => type.startsWith(pattern));
    const base: Handler = route?.[1] ?? (() => Promise.reject(new HandlerNotFoundError(type)));
    return this.#middleware.reduceRight((next, m) => m(next), base);
  }

  /** Dispatches a task to its handler. */
  processTask(task: Task, ctx: TaskContext): Promise<void> | void {
    return this.handler(task.type)(task, ctx);
  }
}
