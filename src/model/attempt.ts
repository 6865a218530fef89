/**
 * Attempt numbers, in one place for every surface that prints one (the
 * handler's ctx.attempt and ctx.logger, the worker's failure and archive
 * lines, `pgasynq task inspect`, the dashboard's task page).
 *
 * Attempt n is the n-th run of a task, counted from 1. `retried` keeps
 * asynq's meaning, the failures that used up a retry, so a task runs as
 * attempt retried + 1 and may run at most maxRetry + 1 attempts. A snooze, a
 * run given back at shutdown, and an error that `isFailure` does not count
 * use up no attempt: the next run has the same number.
 */
import type { TaskInfo } from './task.js';

/** The attempt a task with `retried` retries spent is running, or runs next: retried + 1. */
export const attemptOf = (retried: number): number => retried + 1;

/** How many attempts a task may run: maxRetry + 1. */
export const maxAttemptsOf = (maxRetry: number): number => maxRetry + 1;

/**
 * The attempt whose failure `lastFailedAt` records. An archived task's last
 * failure archived it without using a retry (asynq does not count it), so it
 * was attempt retried + 1; any other failure that used a retry was attempt
 * retried. Null when it cannot be told: no failure, or one that used no retry
 * before any that did (retried 0 in a state other than archived).
 */
export function lastFailedAttempt(t: Pick<TaskInfo, 'state' | 'retried' | 'lastFailedAt'>): number | null {
  if (t.lastFailedAt === null) return null;
  if (t.state === 'archived') return attemptOf(t.retried);
  return t.retried > 0 ? t.retried : null;
}

/** The attempt that failed last, as the CLI and the dashboard print it: `attempt 3 of 3`; null when it cannot be told. */
export function lastFailedText(t: Pick<TaskInfo, 'state' | 'retried' | 'maxRetry' | 'lastFailedAt'>): string | null {
  const n = lastFailedAttempt(t);
  return n === null ? null : `attempt ${n} of ${maxAttemptsOf(t.maxRetry)}`;
}

/**
 * A task's attempt as a reader sees it: `2 of 26, running` for an active
 * task, `3 of 3, the last` for a finished one (completed or archived), `1 of
 * 26, next` for one still to run.
 */
export function attemptText(t: Pick<TaskInfo, 'state' | 'retried' | 'maxRetry'>): string {
  const when = t.state === 'active' ? 'running' : t.state === 'completed' || t.state === 'archived' ? 'the last' : 'next';
  return `${attemptOf(t.retried)} of ${maxAttemptsOf(t.maxRetry)}, ${when}`;
}
