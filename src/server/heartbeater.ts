/**
 * The heartbeater: every `heartbeatInterval`, counted from the start of the
 * previous beat, it extends in one statement the lease of every task this
 * server still runs, and beside it (on another connection, so a lease never
 * waits for it) refreshes the server's row. A lease missing from the answer was lost (recovered, or claimed again
 * elsewhere): its handler is aborted with LeaseExpiredError. A cancellation
 * mark seen here aborts the handler too, in case its NOTIFY was lost.
 *
 * A cancel NOTIFY is only a hint (any login may send one): it makes the
 * heartbeater look the mark up for this server's leases of that task at once,
 * rather than at the next beat, and abort those the database marks. Hints
 * share lookups: one runs at a time, at most one every CANCEL_LOOKUP_GAP_MS,
 * and a hint naming no task this server runs costs none.
 */
import { setImmediate as nextTurn } from 'node:timers/promises';
import { cancelRequested, extendLeases } from '../broker/leases.js';
import { upsertServer, type ServerRecord } from '../broker/servers.js';
import type { Db } from '../broker/db.js';
import { TaskCanceledError } from '../model/errors.js';
import type { Logger } from '../internal/logger.js';
import type { LeaseTable } from './lease-table.js';
import { leaseKey } from './lease.js';
import { Ticker } from '../internal/ticker.js';

/** The least time between two lookups of cancel hints: what a flood of forged NOTIFYs can cost. */
const CANCEL_LOOKUP_GAP_MS = 100;
/** Distinct task ids kept between lookups; past this many, the next lookup takes every lease. */
const MAX_HINTED_IDS = 1000;

export class Heartbeater {
  readonly #db: Db;
  readonly #logger: Logger;
  readonly #leases: LeaseTable;
  readonly #server: () => ServerRecord;
  readonly #leaseDuration: number;
  readonly #interval: number;
  readonly #ticker: Ticker;
  /** Task ids heard on the cancel channel since the last lookup; 'all' once there were too many. */
  #hinted: Set<string> | 'all' = new Set();
  /** The running round of cancel lookups, while there is one. */
  #lookups: Promise<void> | undefined;

  constructor(db: Db, logger: Logger, leases: LeaseTable, server: () => ServerRecord, opts: { heartbeatInterval: number; leaseDuration: number }) {
    this.#db = db;
    this.#logger = logger;
    this.#leases = leases;
    this.#server = server;
    this.#leaseDuration = opts.leaseDuration;
    this.#interval = opts.heartbeatInterval;
    this.#ticker = new Ticker(logger, () => this.runOnce(), { interval: () => this.#interval, immediate: true, fromStart: true });
  }

  start(): void {
    this.#ticker.start();
  }

  async stop(): Promise<void> {
    await this.#ticker.stop();
    await this.#lookups;
  }

  /**
   * A cancel notification named task `id`. Aborts this server's leases of
   * that task only if the database marks them cancel-requested (the lookup is
   * shared with the other hints heard meanwhile); a lookup that fails is
   * left to the next beat, which reads the mark too.
   */
  cancelHint(id: string): void {
    if (this.#hinted !== 'all') {
      if (this.#hinted.size >= MAX_HINTED_IDS) this.#hinted = 'all';
      else this.#hinted.add(id);
    }
    this.#lookups ??= this.#lookUpCancels();
  }

  /** Lookups until no hint is left, one at a time and CANCEL_LOOKUP_GAP_MS apart. */
  async #lookUpCancels(): Promise<void> {
    try {
      for (;;) {
        // Notifications that came in one read from the socket share the first lookup.
        await nextTurn();
        const hinted = this.#hinted;
        this.#hinted = new Set();
        const leases = this.#leases.all().filter((l) => !l.abortReason && (hinted === 'all' || hinted.has(l.id)));
        if (leases.length === 0) return;
        const startedAt = this.#db.clock.now();
        try {
          for (const lease of await cancelRequested(this.#db, leases, this.#server().id)) lease.abort(new TaskCanceledError());
        } catch (err) {
          this.#logger.debug({ err }, 'cancel lookup failed; the next heartbeat reads the mark');
        }
        // Hints heard from now on wait for the gap, then share the next lookup.
        await this.#db.clock.sleep(Math.max(0, startedAt + CANCEL_LOOKUP_GAP_MS - this.#db.clock.now()));
      }
    } finally {
      // Here, not in a .finally() callback: a hint heard right after the last look at #hinted starts a new round.
      this.#lookups = undefined;
    }
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
    const held = this.#leases.all().filter((l) => l.heartbeats);
    if (held.length > 0) {
      const sentAt = this.#db.clock.now();
      // Each lease's log lines ride along; a beat that fails puts them back for the next write.
      const items = held.map((lease) => ({ ...leaseKey(lease), lines: lease.takeLogs(), lease }));
      let extended: { lease: (typeof items)[number]; cancelRequested: boolean | null }[];
      const write = extendLeases(this.#db, items, this.#leaseDuration);
      for (const item of items) if (item.lines !== undefined) item.lease.carriesLogs(write);
      try {
        extended = await write;
      } catch (err) {
        for (const item of items) item.lease.putBackLogs(item.lines);
        throw err;
      }
      const found = new Map(extended.map((e) => [e.lease.lease, e.cancelRequested]));
      let lost = 0;
      for (const lease of held) {
        const cancelRequested = found.get(lease);
        if (cancelRequested === undefined) {
          if (lease.missed()) lost++;
          continue;
        }
        // Its row is locked by another transaction: neither extended nor lost; its trust keeps running.
        if (cancelRequested === null) continue;
        lease.extended(sentAt);
        if (cancelRequested) lease.abort(new TaskCanceledError());
      }
      if (lost > 0) {
        // Each missing row is a fenced heartbeat write: counted like any other.
        this.#leases.counters.fencedWrites += lost;
        this.#logger.warn({ lost }, 'fenced heartbeat: leases lost');
      }
    }
  }
}
