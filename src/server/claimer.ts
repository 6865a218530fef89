/**
 * One server's claims: which queues to ask for how many tasks, and from
 * where. A round first claims from the queues with limits (claim_limited(),
 * which counts every server's tasks under a lock), each for its share, so the
 * others' backlog cannot starve them; then from the others with the plain
 * claim, from the cursor's floors (cursor.ts); then, if slots are still
 * free, whatever more the limits allow.
 *
 * The plain claim also says which of this server's queues have limits now,
 * so a limit set or cleared on a running server takes effect at its next
 * round.
 */
import { claimFrom, claimLimited, type ClaimedRow } from '../broker/claim.js';
import type { Db } from '../broker/db.js';
import { ClaimCursor, SWEEP_EVERY_MS } from './cursor.js';
import { claimShares, queueOrder } from './queues.js';

export interface ClaimerConfig {
  serverId: string;
  queues: Readonly<Record<string, number>>;
  strictPriority: boolean;
  leaseDuration: number;
}

/** A round's claimed rows; `retryLimitedIn`: a queue's limits held part of it back, and when to try again (ms). */
export interface ClaimRound {
  rows: ClaimedRow[];
  retryLimitedIn: number | undefined;
}

/**
 * How soon a queue that its concurrency limits held back is tried again: a
 * slot frees when any server's task of it ends, and nothing announces that.
 */
const LIMITED_POLL_MS = 100;

export class Claimer {
  readonly #db: Db;
  readonly #cfg: ClaimerConfig;
  readonly #cursor: ClaimCursor;
  /** This server's queues with limits, as the last plain claim found them. */
  #limited: readonly string[] = [];
  /** When the plain claim last said which queues have limits. */
  #limitsSeenAt = Number.NEGATIVE_INFINITY;

  constructor(db: Db, cfg: ClaimerConfig) {
    this.#db = db;
    this.#cfg = cfg;
    this.#cursor = new ClaimCursor(db.clock);
  }

  /** Tasks may have landed below the cursor's floors (a requeue), or limits changed: the next round looks again. */
  sweep(): void {
    this.#cursor.sweep();
    this.#limitsSeenAt = Number.NEGATIVE_INFINITY;
  }

  /** One round of claims for `free` slots. */
  async claim(free: number): Promise<ClaimRound> {
    const queues = queueOrder(this.#cfg.queues, this.#cfg.strictPriority);
    const shares = claimShares(this.#cfg.queues, queues, this.#cfg.strictPriority, free);
    const first = await this.#claimLimited(queues, shares, free);
    let rows = first.rows;
    let retryLimitedIn = first.retryIn;
    // While every queue had limits, the plain claim is skipped but for a look every
    // SWEEP_EVERY_MS (a change of limits wakes the servers with a sweep, which looks at once).
    if (this.#limited.length < queues.length || this.#db.clock.now() - this.#limitsSeenAt >= SWEEP_EVERY_MS) {
      const wanted = free - rows.length;
      const claimed = await claimFrom(this.#db, queues, this.#cursor.next(queues), shares, wanted, this.#cfg.serverId, this.#cfg.leaseDuration);
      // The scans ran out only if they locked fewer than wanted: a claim cut short by its
      // bytes (MAX_CLAIM_BYTES) left tasks pending above what it took.
      this.#cursor.claimed(claimed.mark, wanted, topPositions(claimed.rows), claimed.mark.locked, queues);
      rows = rows.concat(claimed.rows);
      this.#limited = claimed.mark.limited;
      this.#limitsSeenAt = this.#db.clock.now();
      if (rows.length < free && first.satisfied && this.#limited.length > 0) {
        const rest = free - rows.length;
        const more = await this.#claimLimited(
          queues,
          queues.map(() => rest),
          rest,
        );
        rows = rows.concat(more.rows);
        retryLimitedIn = more.retryIn;
      }
    }
    return { rows, retryLimitedIn };
  }

  /**
   * Claims from this server's limited queues (of `queues`, with their `shares`),
   * `total` at most. `satisfied`: they gave all they were asked; `retryIn`: a
   * limit held some back, and when to try again (its rate window's next start,
   * or a short poll for a slot another server's task frees).
   */
  async #claimLimited(
    queues: readonly string[],
    shares: readonly number[],
    total: number,
  ): Promise<{ rows: ClaimedRow[]; satisfied: boolean; retryIn: number | undefined }> {
    const names: string[] = [];
    const wanted: number[] = [];
    queues.forEach((q, i) => {
      if (this.#limited.includes(q)) {
        names.push(q);
        wanted.push(shares[i]!);
      }
    });
    if (names.length === 0 || total <= 0) return { rows: [], satisfied: true, retryIn: undefined };
    const { rows, heldBack } = await claimLimited(this.#db, names, wanted, total, this.#cfg.serverId, this.#cfg.leaseDuration);
    const retryIn = heldBack.length === 0 ? undefined : Math.min(...heldBack.map((h) => h.waitMs ?? LIMITED_POLL_MS));
    const asked = Math.min(
      total,
      wanted.reduce((a, b) => a + b, 0),
    );
    return { rows, satisfied: rows.length >= asked, retryIn };
  }
}

/** The highest position claimed in each queue, per priority. */
function topPositions(rows: readonly ClaimedRow[]): Map<string, Map<number, bigint>> {
  const top = new Map<string, Map<number, bigint>>();
  for (const r of rows) {
    const p = BigInt(r.pending_seq);
    const bands = top.get(r.queue) ?? new Map<number, bigint>();
    top.set(r.queue, bands);
    const t = bands.get(r.priority);
    if (t === undefined || p > t) bands.set(r.priority, p);
  }
  return top;
}
