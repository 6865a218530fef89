/**
 * ServeMux, which routes a task to the handler registered for the longest
 * prefix of its type (asynq's ServeMux), and middleware. Handler and
 * TaskContext are the processor's contract, declared in server/handler.ts and
 * re-exported here for the public API.
 */
import { HandlerNotFoundError, ValidationError } from './model/errors.js';
import type { Task } from './model/task.js';
import type { Handler, TaskContext } from './server/handler.js';

export type { Handler, TaskContext } from './server/handler.js';

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
