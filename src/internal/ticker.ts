/**
 * The loop every maintenance component runs on: call `tick`, sleep, repeat,
 * until stop(). A tick may ask for a shorter sleep (work is due sooner), and
 * wake() cuts a sleep short. stop() resolves once the running tick is done.
 *
 * Modes: idle → running (start) → stopping (stop) → idle. start() while running
 * and stop() while idle are no-ops; stop() twice returns the same promise.
 */
import { performance } from 'node:perf_hooks';
import { isTransientConnectionError } from './db-errors.js';
import { FailureRun, type Logger } from './logger.js';
import { backoffMs } from './backoff.js';
import { Sleeper } from './sleeper.js';

export interface TickerOptions {
  /** Sleep between ticks, in ms. */
  interval: () => number;
  /** Run the first tick at start rather than after one interval. */
  immediate?: boolean;
  /**
   * Count the interval from each tick's start rather than its end, so that a
   * slow tick does not stretch the period (heartbeats: a lease's trust runs
   * from when its last extension was sent).
   */
  fromStart?: boolean;
}

export class Ticker {
  readonly #tick: () => Promise<number | void>;
  readonly #opts: TickerOptions;
  readonly #logger: Logger;
  #running = false;
  #loop: Promise<void> | undefined;
  readonly #sleeper = new Sleeper();
  #failures = 0;
  /** Failures other than a lost database (the Db's health log reports those): logged rate-limited, at error. */
  readonly #errors: FailureRun;

  /** `tick` returns nothing, or the ms to sleep before the next tick when sooner than the interval. */
  constructor(logger: Logger, tick: () => Promise<number | void>, opts: TickerOptions) {
    this.#logger = logger;
    this.#errors = new FailureRun(logger, 'tick failed', 'tick succeeded again', 'error');
    this.#tick = tick;
    this.#opts = opts;
  }

  start(): void {
    if (this.#running) return;
    this.#running = true;
    this.#loop = this.#run();
  }

  /** Ends the current sleep now. */
  wake(): void {
    this.#sleeper.wake();
  }

  stop(): Promise<void> {
    this.#running = false;
    this.wake();
    return this.#loop ?? Promise.resolve();
  }

  async #run(): Promise<void> {
    let delay = this.#opts.immediate ? 0 : this.#opts.interval();
    while (this.#running) {
      await this.#sleeper.sleep(delay);
      if (!this.#running) break;
      const startedAt = performance.now();
      try {
        const requested = await this.#tick();
        this.#failures = 0;
        this.#errors.succeeded();
        const interval = this.#opts.fromStart ? Math.max(0, this.#opts.interval() - (performance.now() - startedAt)) : this.#opts.interval();
        delay = Math.min(interval, typeof requested === 'number' ? Math.max(0, requested) : Number.POSITIVE_INFINITY);
      } catch (err) {
        // A lost database is retried with backoff; the server keeps running and says so
        // (once for all components, in the Db's health log).
        this.#failures++;
        if (isTransientConnectionError(err)) this.#logger.debug({ err, failures: this.#failures }, 'tick failed: database unreachable');
        else this.#errors.failed(err);
        delay = backoffMs(this.#failures, 100, this.#opts.interval());
      }
    }
  }
}
