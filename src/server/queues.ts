/**
 * The order in which a claim takes the server's queues (asynq's processor.go).
 */

const gcd = (a: number, b: number): number => (b === 0 ? a : gcd(b, a % b));

/**
 * Strict: highest priority first, every claim. Weighted: each queue repeated
 * priority/gcd times, shuffled, duplicates dropped, so the first queue is
 * `critical` with probability 6/10 for { critical: 6, default: 3, low: 1 }.
 */
export function queueOrder(queues: Readonly<Record<string, number>>, strict: boolean, random: () => number = Math.random): string[] {
  const names = Object.keys(queues);
  if (names.length <= 1) return names;
  if (strict) return names.sort((a, b) => (queues[b] as number) - (queues[a] as number));
  const g = names.reduce((acc, n) => gcd(acc, queues[n] as number), 0);
  const pool: string[] = [];
  for (const n of names) for (let i = 0; i < (queues[n] as number) / g; i++) pool.push(n);
  for (let i = pool.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [pool[i], pool[j]] = [pool[j] as string, pool[i] as string];
  }
  return [...new Set(pool)];
}

/**
 * How many of a claim's `limit` tasks each queue of `order` (queueOrder's)
 * is asked for. Weighted: in proportion to the weights, the remainder one
 * each to the queues first in the order, so a claim of one task goes to the
 * first queue, as asynq's per-slot choice does, and a claim of many keeps the
 * weights' proportions within itself. Strict: the first queue is asked for
 * all. What a queue cannot give, the claim takes from the others in order.
 */
export function claimShares(queues: Readonly<Record<string, number>>, order: readonly string[], strict: boolean, limit: number): number[] {
  if (strict || order.length <= 1) return order.map((_, i) => (i === 0 ? limit : 0));
  const total = order.reduce((sum, n) => sum + (queues[n] as number), 0);
  const shares = order.map((n) => Math.floor((limit * (queues[n] as number)) / total));
  let rest = limit - shares.reduce((a, b) => a + b, 0);
  for (let i = 0; rest > 0; i = (i + 1) % shares.length, rest--) shares[i]!++;
  return shares;
}
