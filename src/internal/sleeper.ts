/**
 * A sleep that the rest of a component can cut short: a loop sleeps between
 * passes, and a notification, a freed slot or a stop wakes it. A wake() while
 * nothing sleeps is kept, so the next sleep returns at once: work announced
 * while the loop was busy is not slept through.
 */
export class Sleeper {
  #wake: (() => void) | undefined;
  #woken = false;

  /** Sleeps up to `ms`. With `ignoreEarlierWake`, a wake() from before this call does not end it. */
  sleep(ms: number, ignoreEarlierWake = false): Promise<void> {
    const woken = this.#woken;
    this.#woken = false;
    if (woken && !ignoreEarlierWake) return Promise.resolve();
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        this.#wake = undefined;
        resolve();
      };
      const timer = setTimeout(done, ms);
      this.#wake = done;
    });
  }

  wake(): void {
    if (this.#wake) this.#wake();
    else this.#woken = true;
  }

  /** Forgets a wake() that no sleep has used yet (the caller is about to look for work anyway). */
  clear(): void {
    this.#woken = false;
  }
}
