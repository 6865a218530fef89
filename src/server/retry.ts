/**
 * What happens to a failed attempt: how long the task waits before its next
 * one, and the text stored as its last error.
 */
import { redact } from '../internal/redact.js';
import { coerceError } from '../model/errors.js';
import type { Logger } from '../internal/logger.js';
import type { Task } from '../model/task.js';

/**
 * asynq's default (Sidekiq's formula): n⁴ + 15 + rand[0, 30)·(n + 1) seconds,
 * where n is the number of retries so far. n = 0 waits 15–44 s, n = 5 about 11–14 min.
 * `random` is injectable for tests.
 */
export function defaultRetryDelay(retried: number, random: () => number = Math.random): number {
  const n = retried;
  return (n ** 4 + 15 + Math.floor(random() * 30) * (n + 1)) * 1000;
}

/**
 * The longest retry delay: 1000 years (of 365.25 days), in ms. A run_at this far
 * ahead is still far inside what both a PostgreSQL timestamp (year 294276) and
 * a JavaScript Date (year 275760) hold, where 1e300 ms made the retry write fail
 * "interval out of range" and left the task active.
 */
export const MAX_RETRY_DELAY_MS = 31_557_600_000_000;

/**
 * How long a failed task waits before its next attempt: the server's
 * `retryDelay`, clamped to MAX_RETRY_DELAY_MS, or asynq's default when there
 * is none or it throws or gives anything but a finite number ≥ 0 (warned once
 * per task type, a clamp too). The processor's failures and the recoverer's
 * expired leases both come through here.
 */
export function retryDelayFor(
  retryDelay: ((retried: number, err: Error, task: Task) => number) | undefined,
  retried: number,
  err: Error,
  task: Task,
  logger: Logger,
): number {
  if (retryDelay === undefined) return defaultRetryDelay(retried);
  let value: unknown;
  try {
    value = retryDelay(retried, err, task);
  } catch (thrown) {
    value = thrown;
  }
  if (typeof value === 'number' && Number.isFinite(value) && value >= 0) {
    if (value <= MAX_RETRY_DELAY_MS) return value;
    warnInvalidRetryDelay(logger, task.type, value, 'waiting 1000 years, the longest delay');
    return MAX_RETRY_DELAY_MS;
  }
  warnInvalidRetryDelay(logger, task.type, value, 'using the default backoff');
  return defaultRetryDelay(retried);
}

/** Task types each logger has already warned about (one warning per type, per server). */
const warnedTypes = new WeakMap<object, Set<string>>();

/**
 * Warns once per task type ("retryDelay returned NaN; using the default
 * backoff"), then stays quiet, so a broken retryDelay cannot flood the log at
 * the rate tasks fail.
 */
function warnInvalidRetryDelay(logger: Logger, type: string, value: unknown, instead: string): void {
  let seen = warnedTypes.get(logger);
  if (seen === undefined) warnedTypes.set(logger, (seen = new Set()));
  if (seen.has(type)) return;
  seen.add(type);
  const what = value instanceof Error ? `threw ${value.name}` : `returned ${typeof value === 'number' ? String(value) : typeof value}`;
  logger.warn({ type, value: value instanceof Error ? value.message : String(value) }, `retryDelay ${what}; ${instead} (warned once per task type)`);
}

/** The most a stored last error takes, in UTF-8 bytes: asynq keeps the whole text; we keep 4 KiB. */
export const MAX_LAST_ERROR_BYTES = 4096;
const TRUNCATED = '… [truncated]';

/**
 * The text stored as a task's last error (`TaskInfo.lastError`) for whatever
 * a handler threw:
 *
 * - an Error gives its message (its name when the message is empty); any other
 *   value gives `non-Error thrown: "boom"` (see coerceError);
 * - passwords in it are masked (redact(): URLs, password= and sslpassword=);
 * - NUL characters, which a PostgreSQL text column cannot hold, become U+FFFD;
 * - it is cut to MAX_LAST_ERROR_BYTES bytes of UTF-8 (never inside a
 *   character), ending in "… [truncated]".
 */
export function lastErrorText(thrown: unknown, maxBytes = MAX_LAST_ERROR_BYTES): string {
  const err = coerceError(thrown);
  return storableText(typeof err.message === 'string' && err.message !== '' ? err.message : String(err.name || 'Error'), maxBytes);
}

/** Text made safe to store or log: passwords masked, NULs replaced, well-formed, cut to `maxBytes` of UTF-8. */
function storableText(input: string, maxBytes = MAX_LAST_ERROR_BYTES): string {
  let text = redact(input);
  text = text.replaceAll('\0', '\uFFFD');
  if (!text.isWellFormed()) text = text.toWellFormed();
  if (Buffer.byteLength(text) <= maxBytes) return text;
  const room = Math.max(0, maxBytes - Buffer.byteLength(TRUNCATED));
  // Streaming decode holds back a character cut in the middle instead of writing U+FFFD for it.
  const cut = new TextDecoder().decode(Buffer.from(text).subarray(0, room), { stream: true });
  return `${cut}${TRUNCATED}`;
}

/**
 * What a log line shows of an error a handler threw, under `err`: its class
 * (pino's `type`), its message as stored in last_error (passwords masked,
 * bounded) and its stack (the same). Never its other properties: an HTTP
 * client's error may carry the request it sent, payload and credentials
 * included. The result inherits from the error's own prototype only so that
 * pino's error serializer names its class.
 */
export function errorSummary(thrown: unknown): Error {
  const err = coerceError(thrown);
  const summary = Object.create(Object.getPrototypeOf(err) as object) as Error;
  const own = (key: string, value: string) => Object.defineProperty(summary, key, { value, enumerable: true, writable: true, configurable: true });
  own('message', lastErrorText(err));
  if (typeof err.stack === 'string') own('stack', storableText(err.stack));
  return summary;
}
