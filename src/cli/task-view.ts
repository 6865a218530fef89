/**
 * One task as `pgasynq task inspect` and `task wait` print it: every field
 * of its TaskInfo (its progress among them), then its attempts, one row per
 * run; and a log line as `task logs` prints it. Text from the database
 * (errors, messages, progress objects) reaches the terminal escaped, as
 * format.ts escapes every cell and line.
 */
import { attemptText, lastFailedText } from '../model/attempt.js';
import type { AttemptInfo, TaskLogLine, TaskProgress } from '../model/following.js';
import type { TaskInfo } from '../model/task.js';
import { duration, fields, instant, jsonText, table, truncate, when, type Style } from './format.js';

/** A task's dependencies as `queue/id, …`. */
export const refs = (t: TaskInfo) => t.dependsOn.map((d) => `${d.queue}/${d.id}`).join(', ');

/** When the task last failed, and which attempt that was when it can be told. */
function lastFailed(t: TaskInfo, now: number): string {
  const attempt = lastFailedText(t);
  return attempt === null ? when(t.lastFailedAt, now) : `${when(t.lastFailedAt, now)}, ${attempt}`;
}

/**
 * ctx.progress()'s last value: a percentage as `40%` (cut, not rounded, to
 * one decimal: 99.96 is not yet 100%), an object as compact JSON; "-" before any.
 */
export function progressText(p: TaskProgress | null): string {
  if (p === null) return '-';
  if (typeof p === 'number') return `${Math.floor(p * 10) / 10}%`;
  return jsonText(p);
}

/** The longest error an attempts row shows; --json has it whole. */
const ATTEMPT_ERROR_CHARS = 100;

/** The attempts as a table: number, server, start, end ("running"), outcome, error (one line, cut). */
export function attemptsTable(attempts: readonly AttemptInfo[]): string[] {
  return table(
    ['attempt', 'server', 'started', 'finished', 'outcome', 'error'],
    attempts.map((a) => [
      String(a.attempt),
      a.serverId ?? '-',
      instant(a.startedAt),
      a.finishedAt === null ? 'running' : instant(a.finishedAt),
      a.outcome,
      a.error === null ? '-' : truncate(a.error, ATTEMPT_ERROR_CHARS),
    ]),
    { right: [0] },
  );
}

export function taskFields(t: TaskInfo): string[] {
  const now = Date.now();
  return fields([
    ['id', t.id],
    ['queue', t.queue],
    ['type', t.type],
    ['state', t.state],
    ['enqueued at', when(t.enqueuedAt, now)],
    ['started at', when(t.startedAt, now)],
    ['payload', jsonText(t.payload)],
    ['headers', Object.keys(t.headers).length === 0 ? '-' : JSON.stringify(t.headers)],
    ['retried', `${t.retried} of ${t.maxRetry}`],
    ['attempt', attemptText(t)],
    ['progress', progressText(t.progress)],
    ['last error', t.lastError ?? '-'],
    ['last failed at', lastFailed(t, now)],
    ['next process at', when(t.nextProcessAt, now)],
    ['timeout', t.timeout === 0 ? '-' : duration(t.timeout)],
    ['deadline', when(t.deadline, now)],
    ['group', t.group ?? '-'],
    ['priority', String(t.priority)],
    ['concurrency key', t.concurrencyKey ?? '-'],
    ['retention', duration(t.retention)],
    ['completed at', when(t.completedAt, now)],
    ['result', jsonText(t.result)],
    ...(t.dependsOn.length > 0 ? [['depends on', refs(t)] as const, ['waiting for', `${t.waitingFor} of ${t.dependsOn.length} dependencies`] as const] : []),
    ...(t.state === 'active' ? [['orphaned', t.isOrphaned ? 'yes (lease expired, not yet recovered)' : 'no'] as const] : []),
  ]);
}

/** `task inspect`'s human output: the fields, then the attempts under a heading (oldest first, the running one last). */
export function taskView(t: TaskInfo, attempts: readonly AttemptInfo[], s: Style): string[] {
  const lines = taskFields(t);
  if (attempts.length === 0) return [...lines, '', s.bold('attempts: none yet')];
  return [...lines, '', s.bold(`attempts: ${attempts.length} run${attempts.length === 1 ? '' : 's'}`), ...attemptsTable(attempts)];
}

/** `task logs`' line: `time  attempt N  message`, the message escaped where it is printed (emit). */
export function logText(l: TaskLogLine): string {
  return `${instant(l.at)}  attempt ${l.attempt}  ${l.message}`;
}

/** What --json prints for `task inspect`: the TaskInfo, every key as getTaskInfo returns it, and `attempts` (listAttempts). */
export function inspectJson(t: TaskInfo, attempts: readonly AttemptInfo[]): TaskInfo & { attempts: readonly AttemptInfo[] } {
  return { ...t, attempts };
}
