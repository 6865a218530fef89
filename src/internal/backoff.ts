/**
 * Exponential backoff with jitter: a delay drawn from [½, 1] of `baseMs`
 * doubled per earlier attempt (0 first), that ceiling at most `maxMs`. The
 * draw keeps processes that failed together (a database restart, a full
 * max_connections) from all retrying at the same instant.
 */
export function backoffMs(attempt: number, baseMs: number, maxMs: number, random: () => number = Math.random): number {
  const ceiling = Math.min(maxMs, baseMs * 2 ** Math.min(Math.max(attempt, 0), 30));
  return ceiling / 2 + random() * (ceiling / 2);
}
