/**
 * Following a task: the record of its attempts, the progress and the log
 * lines its handler reports, and the events a watcher receives. The bounds
 * here are also the SQL's (migration 0013: write_progress(),
 * append_task_logs(), record_attempts()), which enforce them against any
 * caller; test/following.test.ts holds the two to the same values.
 */
import { InvalidOptionError } from './errors.js';
import { encodePayload } from './payload.js';
import type { TaskProgress } from './task-info.js';
import { describeValue } from './validate.js';

export type { TaskProgress } from './task-info.js';

/** How an attempt ended; `running` while it runs. */
export type AttemptOutcome = 'running' | 'completed' | 'failed' | 'snoozed' | 'canceled' | 'timeout' | 'lost' | 'shutdown';

/**
 * One run of a task, oldest first (Inspector.listAttempts). `attempt` is the
 * attempt number the run had (ctx.attempt: retried + 1), so a snoozed run and
 * the run after it share one; the runs themselves are all listed.
 */
export interface AttemptInfo {
  attempt: number;
  /** The server that ran it; null when unknown. */
  serverId: string | null;
  startedAt: Date | null;
  /** Null while it runs. */
  finishedAt: Date | null;
  outcome: AttemptOutcome;
  /** The error's message (failed, timeout, canceled, lost); null otherwise. */
  error: string | null;
}

/** One line a handler kept with ctx.log(), oldest first (Inspector.getTaskLogs). */
export interface TaskLogLine {
  attempt: number;
  /** When it was logged, on the database's clock. */
  at: Date;
  message: string;
}

/** An event of Inspector.watch(). */
export interface TaskEvent {
  kind: 'started' | 'completed' | 'failed' | 'archived' | 'progress';
  queue: string;
  id: string;
  type: string;
  attempt: number;
  /** When it happened, on the database's clock. */
  at: Date;
  /** failed, archived: the error's message (its first 2,000 characters). */
  error?: string;
  progress?: TaskProgress;
}

/** The largest progress object, as JSON (UTF-8 bytes). */
export const MAX_PROGRESS_BYTES = 4096;
/** The longest log line (UTF-8 bytes); a longer one is cut. */
export const MAX_LOG_LINE_BYTES = 4096;
/** What a task keeps of its log, the oldest lines dropped first. */
export const MAX_LOG_LINES = 1000;
export const MAX_LOG_BYTES = 65_536;
/** How many ended runs a task keeps in its attempt history. */
export const MAX_ATTEMPTS_KEPT = 100;
/** How long a task someone waits for is kept once completed, at least (its retention if longer). */
export const AWAIT_KEEP_MS = 60_000;

/** Checks ctx.progress()'s value: a number in [0, 100] or a JSON object of at most MAX_PROGRESS_BYTES. Returns it as JSON text. */
export function progressJson(value: unknown): string {
  const rule = `must be a number in [0, 100] or a JSON object of at most ${MAX_PROGRESS_BYTES} bytes`;
  if (typeof value === 'number') {
    if (!Number.isFinite(value) || value < 0 || value > 100) throw new InvalidOptionError('progress', `${rule} (got ${describeValue(value)})`);
    return JSON.stringify(value);
  }
  if (typeof value !== 'object' || value === null || Array.isArray(value) || value instanceof Uint8Array) {
    throw new InvalidOptionError('progress', `${rule} (got ${describeValue(value)})`);
  }
  const json = encodePayload(value, 'progress').json!;
  const bytes = Buffer.byteLength(json);
  if (bytes > MAX_PROGRESS_BYTES) throw new InvalidOptionError('progress', `${rule} (got ${bytes} bytes)`);
  return json;
}

/** A log line as kept: a string (anything else is a ValidationError), cut to MAX_LOG_LINE_BYTES on a character boundary. */
export function logLine(message: unknown): string {
  if (typeof message !== 'string') throw new InvalidOptionError('message', `must be a string (got ${describeValue(message)})`);
  if (message.length <= MAX_LOG_LINE_BYTES / 4 || Buffer.byteLength(message) <= MAX_LOG_LINE_BYTES) return message;
  // Cut on a code point boundary: the bytes up to the limit, decoded, lose a split character at the end.
  const cut = Buffer.from(message).subarray(0, MAX_LOG_LINE_BYTES).toString();
  return cut.endsWith('\uFFFD') ? cut.slice(0, -1) : cut;
}
