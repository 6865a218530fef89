/**
 * How long a failed task waits before its next attempt.
 */

/**
 * asynq's default (Sidekiq's formula): n⁴ + 15 + rand[0, 30)·(n + 1) seconds,
 * where n is the number of retries so far. n = 0 waits 15–44 s, n = 5 about 11–14 min.
 * `random` is injectable for tests.
 */
export function defaultRetryDelay(retried: number, random: () => number = Math.random): number {
  const n = retried;
  return (n ** 4 + 15 + Math.floor(random() * 30) * (n + 1)) * 1000;
}

/** A user's retryDelay result, or the default when it is not a finite number ≥ 0. */
export function safeRetryDelay(
  retryDelay: (() => number) | undefined,
  retried: number,
  onInvalid: (value: unknown) => void,
): number {
  if (retryDelay === undefined) return defaultRetryDelay(retried);
  let value: unknown;
  try {
    value = retryDelay();
  } catch (err) {
    value = err;
  }
  if (typeof value === 'number' && Number.isFinite(value) && value >= 0) return value;
  onInvalid(value);
  return defaultRetryDelay(retried);
}
