/**
 * The leases this server holds (claimed tasks, held or running), by seq, and
 * the counters of what became of them. The processor adds a lease at the
 * claim and removes it once its outcome is written (or given back); the
 * heartbeater reads the leases to extend them and counts the ones it found
 * lost; the outcome writer counts fenced writes and lost leases. One owner
 * for both, handed to each at construction.
 */
import type { Lease } from './lease.js';

/** Counters a test or a metrics endpoint may read. */
export interface LeaseCounters {
  claimed: number;
  /** Writes about a task that matched no row: the lease was gone (fencing). */
  fencedWrites: number;
  leasesLost: number;
}

export class LeaseTable {
  readonly #bySeq = new Map<string, Lease>();
  readonly counters: LeaseCounters = { claimed: 0, fencedWrites: 0, leasesLost: 0 };
  /** Waiters for the table to empty (a drain). */
  #onEmpty: (() => void)[] = [];

  get size(): number {
    return this.#bySeq.size;
  }

  /** The leases held now, in claim order. */
  all(): Lease[] {
    return [...this.#bySeq.values()];
  }

  add(lease: Lease): void {
    this.#bySeq.set(lease.seq, lease);
  }

  /** Removes `lease`; a newer lease of the same task (claimed again after this one was lost) stays. */
  delete(lease: Lease): void {
    if (this.#bySeq.get(lease.seq) === lease) this.#bySeq.delete(lease.seq);
    if (this.#bySeq.size === 0) for (const fn of this.#onEmpty.splice(0)) fn();
  }

  /** Calls `fn` once the table is next empty (at once if it is); returns a function that cancels the wait. */
  whenEmpty(fn: () => void): () => void {
    if (this.#bySeq.size === 0) {
      fn();
      return () => {};
    }
    this.#onEmpty.push(fn);
    return () => {
      this.#onEmpty = this.#onEmpty.filter((f) => f !== fn);
    };
  }
}
