/**
 * Group commit: items added while a flush is in flight wait for it, then go
 * together in the next one. Under load that turns a statement per task into a
 * statement per batch; when idle an item is flushed on the next turn of the
 * event loop, so it adds no latency.
 */
export class Batcher<T, R> {
  readonly #flush: (items: T[]) => Promise<R>;
  readonly #maxBatch: number;
  #pending: { item: T; resolve: (r: R) => void; reject: (e: unknown) => void }[] = [];
  #flushing = false;
  #scheduled = false;
  #idle: (() => void)[] = [];

  constructor(flush: (items: T[]) => Promise<R>, maxBatch = 1000) {
    this.#flush = flush;
    this.#maxBatch = maxBatch;
  }

  /** Resolves with the result of the flush that carried `item`. */
  add(item: T): Promise<R> {
    return new Promise<R>((resolve, reject) => {
      this.#pending.push({ item, resolve, reject });
      this.#schedule();
    });
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
    while (this.#pending.length > 0) {
      const batch = this.#pending.splice(0, this.#maxBatch);
      try {
        const result = await this.#flush(batch.map((b) => b.item));
        for (const b of batch) b.resolve(result);
      } catch (err) {
        for (const b of batch) b.reject(err);
      }
    }
    this.#flushing = false;
    for (const fn of this.#idle.splice(0)) fn();
  }
}
