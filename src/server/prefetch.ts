/**
 * How many tasks a server holds claimed ahead of its free slots.
 *
 * A number configured is used as it is (0: none). Left unset, the count
 * adapts to what this server starts during two claim round trips: each slot
 * starts about roundTrip / handlerTime tasks in one, so the next claim lands
 * before the held tasks run out, while a server whose tasks take longer than
 * a round trip holds none (a held task would wait for a slot here while an
 * idle server could run it). Both times are moving averages.
 */

/** Weight of the newest sample in the moving averages. */
const NEWEST = 0.1;
/** Round trips' worth of starts held. */
const ROUND_TRIPS = 2;

export class Prefetch {
  readonly #fixed: number | null;
  readonly #max: number;
  readonly #slots: number;
  /** A handler's run, in ms; unknown until one finished. */
  #handlerMs: number | undefined;
  /** A claim's round trip, in ms. */
  #roundTripMs: number | undefined;

  /** `fixed` null: adaptive, at most `max`. */
  constructor(fixed: number | null, slots: number, max: number) {
    this.#fixed = fixed;
    this.#slots = slots;
    this.#max = max;
  }

  /** A handler ran for `ms`. */
  ran(ms: number): void {
    this.#handlerMs = average(this.#handlerMs, ms);
  }

  /** A claim came back after `ms`. */
  claimed(ms: number): void {
    this.#roundTripMs = average(this.#roundTripMs, ms);
  }

  /** Tasks to hold beyond the free slots now. */
  get count(): number {
    if (this.#fixed !== null) return this.#fixed;
    if (this.#handlerMs === undefined || this.#roundTripMs === undefined) return 0;
    const startsPerRoundTrip = (this.#slots * this.#roundTripMs) / Math.max(this.#handlerMs, 0.01);
    return Math.min(this.#max, Math.floor(ROUND_TRIPS * startsPerRoundTrip));
  }
}

const average = (prev: number | undefined, sample: number) => (prev === undefined ? sample : prev + NEWEST * (sample - prev));
