/**
 * What a reader of a task sees: its states, how a task is named, and the
 * TaskInfo every read returns. Types alone (and the list of states), so that
 * every file of model/ may name them, errors.ts among them.
 */

export type TaskState = 'pending' | 'active' | 'scheduled' | 'retry' | 'archived' | 'completed' | 'aggregating' | 'waiting';
export const TASK_STATES: readonly TaskState[] = ['pending', 'active', 'scheduled', 'retry', 'archived', 'completed', 'aggregating', 'waiting'];

/** A task named by its queue and id. */
export interface TaskRef {
  queue: string;
  id: string;
}

/** Everything a reader of the task sees (Inspector, enqueue results). */
export interface TaskInfo {
  id: string;
  queue: string;
  type: string;
  payload: unknown;
  state: TaskState;
  maxRetry: number;
  /**
   * Retries used so far (asynq's Retried): the failures that counted, not the
   * one that archived the task. Attempt retried + 1 (1-based, at most
   * maxRetry + 1) is the one an active task runs, the next one of a task still
   * to run, and the last one of a completed or archived task.
   */
  retried: number;
  lastError: string | null;
  lastFailedAt: Date | null;
  /** ms; 0 when only a deadline limits the task. */
  timeout: number;
  deadline: Date | null;
  group: string | null;
  /** scheduled and retry: when due; pending: now; otherwise null. */
  nextProcessAt: Date | null;
  /** An active task whose lease has expired and which no recoverer has taken yet. */
  isOrphaned: boolean;
  /** ms */
  retention: number;
  completedAt: Date | null;
  result: unknown;
  headers: Record<string, string>;
  /** When the task was enqueued. */
  enqueuedAt: Date;
  /** When its latest attempt started; null before the first. */
  startedAt: Date | null;
  /** An active task's lease: the server holding it and until when (database clock). */
  leaseOwner: string | null;
  leaseExpiresAt: Date | null;
  /** The tasks it depends on (empty for most tasks). */
  dependsOn: TaskRef[];
  /** How many of them have not finished yet; a `waiting` task runs once this is 0. */
  waitingFor: number;
  /** Higher runs first within the queue. */
  priority: number;
  /** What the queue's keyConcurrency limit counts it by; null without one. */
  concurrencyKey: string | null;
  /** The last value its handler reported with ctx.progress(); null before any. */
  progress: TaskProgress | null;
}

/** What ctx.progress() takes, and TaskInfo.progress holds: a percentage, or a JSON object (counts, a stage). */
export type TaskProgress = number | Record<string, unknown>;
