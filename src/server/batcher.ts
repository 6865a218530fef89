/**
 * Group commit: items added while a flush is in flight wait for it, then go
 * together in the next one. Under load that turns a statement per task into a
 * statement per batch; when idle an item is flushed on the next turn of the
 * event loop, so it adds no latency.
 */

/** The items of one flush and the promise its callers share (one per batch, not one per item: this runs for every task). */
interface Batch<T, R> {
  items: T[];
  done: Promise<R>;
  resolve: (r: R) => void;
  reject: (e: unknown) => void;
}

export class Batcher<T, R> {
  readonly #flush: (items: T[]) => Promise<R>;
  readonly #maxBatch: number;
  /** Waiting for a flush, in order; only the last one takes new items. */
  #pending: Batch<T, R>[] = [];
  #flushing = false;
  #scheduled = false;
  #idle: (() => void)[] = [];

  constructor(flush: (items: T[]) => Promise<R>, maxBatch = 1000) {
    this.#flush = flush;
    this.#maxBatch = maxBatch;
  }

  /** Resolves with the result of the flush that carried `item`. */
  add(item: T): Promise<R> {
    let batch = this.#pending.at(-1);
    if (batch === undefined || batch.items.length >= this.#maxBatch) {
      let resolve!: (r: R) => void;
      let reject!: (e: unknown) => void;
      const done = new Promise<R>((res, rej) => {
        resolve = res;
        reject = rej;
      });
      // A batch whose flush failed rejects every caller's await; none is left unhandled.
      done.catch(() => {});
      batch = { items: [], done, resolve, reject };
      this.#pending.push(batch);
    }
    batch.items.push(item);
    this.#schedule();
    return batch.done;
  }

  /** Resolves once every added item was flushed. */
  drained(): Promise<void> {
    if (!this.#flushing && this.#pending.length === 0) return Promise.resolve();
    return new Promise((resolve) => this.#idle.push(resolve));
  }

  #schedule(): void {
    if (this.#flushing || this.#scheduled) return;
    this.#scheduled = true;
    setImmediate(() => {
      this.#scheduled = false;
      void this.#run();
    });
  }

  async #run(): Promise<void> {
    if (this.#flushing) return;
    this.#flushing = true;
    for (let batch = this.#pending.shift(); batch !== undefined; batch = this.#pending.shift()) {
      try {
        batch.resolve(await this.#flush(batch.items));
      } catch (err) {
        batch.reject(err);
      }
    }
    this.#flushing = false;
    for (const fn of this.#idle.splice(0)) fn();
  }
}
