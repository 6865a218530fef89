/**
 * What a handler is and what it receives: the contract between the processor,
 * which builds a TaskContext for each run, and the user's code. mux.ts
 * re-exports both, beside ServeMux, for the public API.
 */
import type { Transaction } from 'kysely';
import type { Logger } from '../internal/logger.js';
import type { Task } from '../model/task.js';

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
   * Reports how far the task is: a number in [0, 100] or a JSON object of at
   * most 4 KiB (`{ done: 40, total: 200 }`). Stored as the task's progress
   * (TaskInfo.progress, the dashboard's bar), with the lines ctx.log() kept
   * since the last write, and sent to Inspector.watch(). Fenced by the lease:
   * after a lost lease it rejects with LeaseExpiredError and writes nothing; a
   * bad value is a ValidationError naming `progress`.
   */
  progress(value: number | Record<string, unknown>): Promise<void>;
  /**
   * Keeps a line with the task (attempt, time, text), shown by
   * Inspector.getTaskLogs(), `pgasynq task logs` and the dashboard. Lines go
   * with the task's next write (the heartbeat, writeResult, progress, the
   * outcome), so this never waits for the database. A line over 4 KiB is cut;
   * a task keeps its last 1,000 lines within 64 KiB. Throws a ValidationError
   * for a non-string, and LeaseExpiredError once the lease is lost. The lines
   * of a task deleted at completion (no retention) go with it.
   */
  log(message: string): void;
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
