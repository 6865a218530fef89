/** Exponential backoff: `baseMs` doubled per earlier attempt (0 first), at most `maxMs`. */
export function backoffMs(attempt: number, baseMs: number, maxMs: number): number {
  return Math.min(maxMs, baseMs * 2 ** Math.min(Math.max(attempt, 0), 30));
}
