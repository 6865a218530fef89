/**
 * How many tasks a server holds claimed ahead of its free slots.
 *
 * A number configured is used as it is (0: none). Left unset, the count
 * adapts: about what this server starts during two claim round trips, so the
 * next claim lands before the held tasks run out, while a server whose tasks
 * take longer than a round trip holds none (a held task would wait for a slot
 * here while an idle server could run it). Both rates are moving averages,
 * measured at each claim.
 */
import { performance } from 'node:perf_hooks';

/** Weight of the newest sample in the moving averages. */
const NEWEST = 0.3;
/** Round trips' worth of starts held. */
const ROUND_TRIPS = 2;

export class Prefetch {
  readonly #fixed: number | null;
  readonly #max: number;
  /** Starts per ms. */
  #rate = 0;
  /** A claim's round trip, in ms. */
  #roundTrip = 0;
  #starts = 0;
  #since = performance.now();

  /** `fixed` null: adaptive, at most `max`. */
  constructor(fixed: number | null, max: number) {
    this.#fixed = fixed;
    this.#max = max;
  }

  /** A held or claimed task started in a slot. */
  started(): void {
    this.#starts++;
  }

  /** A claim came back after `roundTripMs`. */
  claimed(roundTripMs: number): void {
    const now = performance.now();
    const elapsed = now - this.#since;
    if (elapsed > 0) this.#rate += NEWEST * (this.#starts / elapsed - this.#rate);
    this.#starts = 0;
    this.#since = now;
    this.#roundTrip += NEWEST * (roundTripMs - this.#roundTrip);
  }

  /** Tasks to hold beyond the free slots now. */
  get count(): number {
    if (this.#fixed !== null) return this.#fixed;
    return Math.min(this.#max, Math.round(ROUND_TRIPS * this.#rate * this.#roundTrip));
  }
}
