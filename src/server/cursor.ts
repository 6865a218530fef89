/**
 * Where this server's claims start in each queue's pending order.
 *
 * Every claim leaves dead index entries behind it at the low end of the
 * pending order (the rows it took). Vacuum removes them, unless a snapshot
 * older than them is held (a report, a pg_dump, a forgotten BEGIN): then a
 * claim that starts from the head of the queue steps over every one of them,
 * and claims slow down by the minute. So each queue has a floor: claims look
 * only above it, and it rises behind them.
 *
 * A floor may rise to a position only once no task can still appear below it.
 * Positions come from one sequence, and every statement that draws one has a
 * transaction id before it draws (broker/enqueue.ts and the other callers of
 * task_seq). Each claim reads how far the sequence has drawn and then takes
 * its own transaction id: any transaction that drew up to that mark has a
 * smaller id. Once no transaction older than that id is running, every task
 * up to the mark is committed (or gone), and a claim that sees those commits
 * may raise the floor up to the mark, and up to the last position it took
 * (rows it skipped as locked are being claimed by another server).
 *
 * Two ways to know that: a later claim's snapshot shows no older transaction
 * running (cheap, and true at once on a quiet cluster); or, when that fails
 * because a long transaction somewhere in the cluster holds the snapshots'
 * xmin back, a claim asks who still holds task_seq (a transaction that drew
 * holds its lock to the end). That answer is live, not of the snapshot, so
 * the claim after it is the first that may use it.
 *
 * Within a queue, claims go by priority, and FIFO only within one: so each
 * priority band of a queue has its own floor, and the cursor knows the bands
 * it has claimed from. (Positions come from the one sequence whatever the
 * priority, so the same mark serves every band.)
 *
 * What can still land below a floor — a task given back at shutdown (requeued
 * to the front), a claim that rolled back — is found by a sweep: a claim from
 * the head, every SWEEP_EVERY_MS, at start, after a reconnect and when a
 * server requeues (the sweep channel). A sweep that ran out of tasks to take
 * found everything below the floors: the claims after it start from those
 * floors again. (Behind a held snapshot, each claim from the head steps over
 * every dead entry since: one per sweep, not the three or four more that a
 * floor risen anew from the head took.)
 */
import type { DatabaseClock } from '../internal/clock.js';
import { HEAD, type Band, type ClaimMark, type ClaimStart } from '../broker/claim.js';

/** How often claims start from the head of every queue regardless of the floors. */
export const SWEEP_EVERY_MS = 10_000;

export class ClaimCursor {
  readonly #clock: Pick<DatabaseClock, 'now'>;
  /** Per queue, per priority: the floor of that band. */
  readonly #floors = new Map<string, Map<number, bigint>>();
  /** A mark of an earlier claim, waiting for every transaction older than its id to end. */
  #pending: { drawn: bigint; xid: bigint } | undefined;
  /** A claim's snapshot failed to clear the pending mark: the next claim asks task_seq's lock holders. */
  #askHolders = false;
  /** A mark cleared by the lock holders: safe for the next claim. */
  #cleared: bigint | undefined;
  #lastSweep = Number.NEGATIVE_INFINITY;
  /** While a sweep's claim is out: the floors it started below, per queue and priority. */
  #sweptFloors: Map<string, Map<number, bigint>> | undefined;

  /** `clock`: the server's, whose now() paces the sweeps. */
  constructor(clock: Pick<DatabaseClock, 'now'>) {
    this.#clock = clock;
  }

  /** Where the next claim starts: the known bands of each queue with their floors, all at the head when a sweep is due. */
  next(queues: readonly string[]): ClaimStart {
    const sweep = this.#clock.now() - this.#lastSweep >= SWEEP_EVERY_MS;
    if (sweep) this.#lastSweep = this.#clock.now();
    this.#sweptFloors = sweep ? new Map([...this.#floors].map(([queue, floors]) => [queue, new Map(floors)])) : undefined;
    const bands: Band[] = [];
    for (const queue of queues) {
      const floors = this.#floors.get(queue);
      if (floors === undefined) continue;
      for (const [priority, floor] of floors) {
        // A sweep keeps the bands (no probe needed to find them again) but drops their floors.
        if (sweep) floors.set(priority, BigInt(HEAD));
        bands.push({ queue, priority, floor: sweep ? HEAD : floor.toString() });
      }
    }
    return { bands, olderThan: this.#askHolders && this.#pending ? this.#pending.xid.toString() : null };
  }

  /** Start the next claim from the head of every queue. */
  sweep(): void {
    this.#lastSweep = Number.NEGATIVE_INFINITY;
  }

  /**
   * After a claim asked for `limit` tasks: `mark` is what it read of the
   * sequence and the transactions, `taken` the highest position it took per
   * queue and priority, `count` how many it took in all.
   */
  claimed(mark: ClaimMark, limit: number, taken: ReadonlyMap<string, ReadonlyMap<number, bigint>>, count: number, queues: readonly string[]): void {
    // Fewer than asked: every band's scan ran out (a sweep's from the head).
    const exhausted = count < limit;
    const swept = this.#sweptFloors;
    this.#sweptFloors = undefined;
    if (swept !== undefined && exhausted) this.#restore(swept, mark, queues);
    let safe = this.#cleared;
    this.#cleared = undefined;
    if (this.#pending !== undefined) {
      if (mark.xmin > this.#pending.xid) {
        safe = this.#pending.drawn;
        this.#pending = undefined;
      } else if (mark.drawersGone === true) {
        this.#cleared = this.#pending.drawn;
        this.#pending = undefined;
      } else {
        this.#askHolders = true;
      }
    }
    if (this.#pending === undefined) {
      this.#pending = { drawn: mark.drawn, xid: mark.xid };
      this.#askHolders = false;
    }
    // A band claimed from is known from now on, even before its floor may rise.
    for (const [queue, bands] of taken) {
      const floors = this.#floors.get(queue) ?? new Map<number, bigint>();
      this.#floors.set(queue, floors);
      for (const priority of bands.keys()) if (!floors.has(priority)) floors.set(priority, BigInt(HEAD));
    }
    if (safe === undefined) return;
    // Exhausted, every band's scan ran out above its floor. Otherwise only the bands
    // that gave tasks are known to hold nothing unclaimed below what they gave.
    for (const queue of queues) {
      // A paused or limited queue was not scanned: nothing is known of it.
      if (mark.paused.includes(queue) || mark.limited.includes(queue)) continue;
      const floors = this.#floors.get(queue);
      if (floors === undefined) continue;
      const tops = taken.get(queue);
      for (const [priority, floor] of floors) {
        const top = tops?.get(priority);
        const candidate = exhausted ? safe : top === undefined ? undefined : top < safe ? top : safe;
        if (candidate !== undefined && candidate > floor) floors.set(priority, candidate);
      }
    }
  }

  /**
   * A sweep took every task it could lock from the head of each band: what was below the
   * floors it started under is claimed, so those floors hold again. (Anything that lands
   * below them later comes with a sweep of its own, as before.)
   */
  #restore(swept: ReadonlyMap<string, ReadonlyMap<number, bigint>>, mark: ClaimMark, queues: readonly string[]): void {
    for (const queue of queues) {
      // A paused or limited queue was not scanned: nothing is known of it.
      if (mark.paused.includes(queue) || mark.limited.includes(queue)) continue;
      const floors = this.#floors.get(queue);
      const before = swept.get(queue);
      if (floors === undefined || before === undefined) continue;
      for (const [priority, floor] of before) if (floor > (floors.get(priority) ?? floor)) floors.set(priority, floor);
    }
  }
}
