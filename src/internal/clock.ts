/**
 * The database's time as pgasynq's statements see it: PostgreSQL's now(),
 * moved forward by an offset that only tests set. Leases, due times, the
 * recoverer's cutoff, retention, group grace periods and cron ticks are all
 * decided on the database's clock, so a test that advances this clock sees
 * them come due without sleeping. The process's own timers (heartbeat
 * interval, lease trust, task timeouts) keep real time: a test that needs a
 * heartbeat waits for one.
 */
export class DatabaseClock {
  #offsetMs = 0;

  /** How far ahead of PostgreSQL's now() the statements' now() is, in ms. */
  get offsetMs(): number {
    return this.#offsetMs;
  }

  /** Moves the statements' now() forward by `ms`. */
  advance(ms: number): void {
    if (!Number.isFinite(ms) || ms < 0) throw new RangeError(`advance takes a finite number of ms ≥ 0 (got ${ms})`);
    this.#offsetMs += ms;
  }
}
