/**
 * The lines a handler logged with ctx.log() that no write has carried yet.
 * They go with the lease's next write (the heartbeat, writeResult, progress,
 * the outcome), each with its age on the lease's clock, so the database dates
 * it by its own clock. The buffer keeps at most what a task keeps (its
 * newest MAX_LOG_LINES lines within MAX_LOG_BYTES), so a handler that logs
 * in a loop holds bounded memory between two writes.
 */
import type { LogLines } from '../broker/leases.js';
import type { DatabaseClock } from '../internal/clock.js';
import { MAX_LOG_BYTES, MAX_LOG_LINES } from '../model/following.js';

/** A line as logged: attempt, when (the clock's now()), message, its UTF-8 bytes. */
type Entry = [attempt: number, at: number, message: string, bytes: number];

export class LogBuffer {
  readonly #clock: DatabaseClock;
  #entries: Entry[] = [];
  #bytes = 0;

  constructor(clock: DatabaseClock) {
    this.#clock = clock;
  }

  /** Keeps a line (already checked and cut by model/following.ts logLine()). */
  add(attempt: number, message: string): void {
    this.#push([attempt, this.#clock.now(), message, Buffer.byteLength(message)]);
  }

  /** The lines to send with a write, aged now, and the buffer emptied; undefined when there are none. */
  take(): LogLines | undefined {
    if (this.#entries.length === 0) return undefined;
    const now = this.#clock.now();
    const lines = this.#entries.map(([attempt, at, message]) => [attempt, Math.max(0, now - at), message] as const);
    this.#entries = [];
    this.#bytes = 0;
    return lines;
  }

  /** Lines a write took but did not deliver (it failed): back in front of the ones logged since. */
  putBack(lines: LogLines | undefined): void {
    if (lines === undefined) return;
    const now = this.#clock.now();
    const later = this.#entries;
    this.#entries = [];
    this.#bytes = 0;
    for (const [attempt, age, message] of lines) this.#push([attempt, now - age, message, Buffer.byteLength(message)]);
    for (const e of later) this.#push(e);
  }

  #push(entry: Entry): void {
    this.#entries.push(entry);
    this.#bytes += entry[3];
    while (this.#entries.length > MAX_LOG_LINES || this.#bytes > MAX_LOG_BYTES) this.#bytes -= this.#entries.shift()![3];
  }
}
