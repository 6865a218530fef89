/**
 * The heartbeater: every `heartbeatInterval`, counted from the start of the
 * previous beat, it extends in one statement the lease of every task this
 * server still runs, and beside it (on another connection, so a lease never
 * waits for it) refreshes the server's row. A lease missing from the answer was lost (recovered, or claimed again
 * elsewhere): its handler is aborted with LeaseExpiredError. A cancellation
 * mark seen here aborts the handler too, in case its NOTIFY was lost.
 */
import { performance } from 'node:perf_hooks';
import { extendLeases } from '../broker/leases.js';
import { upsertServer, type ServerRecord } from '../broker/servers.js';
import type { Db } from '../broker/db.js';
import { TaskCanceledError } from '../model/errors.js';
import type { Logger } from '../internal/logger.js';
import type { Processor } from './processor.js';
import { Ticker } from '../internal/ticker.js';

export class Heartbeater {
  readonly #db: Db;
  readonly #logger: Logger;
  readonly #processor: Processor;
  readonly #server: () => ServerRecord;
  readonly #leaseDuration: number;
  readonly #interval: number;
  readonly #ticker: Ticker;

  constructor(db: Db, logger: Logger, processor: Processor, server: () => ServerRecord, opts: { heartbeatInterval: number; leaseDuration: number }) {
    this.#db = db;
    this.#logger = logger;
    this.#processor = processor;
    this.#server = server;
    this.#leaseDuration = opts.leaseDuration;
    this.#interval = opts.heartbeatInterval;
    this.#ticker = new Ticker(logger, () => this.runOnce(), { interval: () => this.#interval, immediate: true, fromStart: true });
  }

  start(): void {
    this.#ticker.start();
  }

  stop(): Promise<void> {
    return this.#ticker.stop();
  }

  /** Beats now (or right after the running beat), then every interval from then. */
  wake(): void {
    this.#ticker.wake();
  }

  /** One beat: extend leases and refresh the server row, side by side. */
  async runOnce(): Promise<void> {
    const results = await Promise.allSettled([this.#extendLeases(), upsertServer(this.#db, this.#server(), this.#interval * 3)]);
    for (const r of results) if (r.status === 'rejected') throw r.reason;
  }

  async #extendLeases(): Promise<void> {
    // A lease inside ctx.transaction is locked by that transaction, which no one else can take from it.
    const held = [...this.#processor.leases.values()].filter((l) => l.heartbeats);
    if (held.length > 0) {
      const sentAt = performance.now();
      const extended = await extendLeases(this.#db, held, this.#leaseDuration);
      const found = new Map(extended.map((e) => [e.lease, e.cancelRequested]));
      let lost = 0;
      for (const lease of held) {
        const cancelRequested = found.get(lease);
        if (cancelRequested === undefined) {
          if (lease.missed()) lost++;
          continue;
        }
        lease.extended(sentAt);
        if (cancelRequested) lease.abort(new TaskCanceledError());
      }
      if (lost > 0) {
        // Each missing row is a fenced heartbeat write: counted like any other.
        this.#processor.counters.fencedWrites += lost;
        this.#logger.warn({ lost }, 'fenced heartbeat: leases lost');
      }
    }
  }
}
