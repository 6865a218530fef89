/**
 * Server: processes tasks. It owns the configuration and the components, and
 * starts and stops them in an order that matters:
 *
 *   start:    schema check → unserved-queue lookup → notifier (LISTEN, awaited) → heartbeater (registers
 *             the server) → recoverer → forwarder → processor → janitor →
 *             aggregator → healthchecker and horizon watch → stats timer
 *   shutdown: stats timer → forwarder → processor (stops claiming, gives back
 *             held tasks, waits up to shutdownTimeout, then aborts and requeues)
 *             → its batched writes flushed → recoverer, janitor, aggregator,
 *             healthchecker and horizon watch together → notifier → stats flush → heartbeater
 *             (last, so leases are extended while handlers finish) → server row
 *             → pool
 *
 * Modes: new → active (start) → stopped (stop: no new claims) → closed (shutdown).
 */
import { randomUUID } from 'node:crypto';
import { runUntilTerminated } from './internal/signals.js';
import { hostname } from 'node:os';
import { performance } from 'node:perf_hooks';
import { Db } from './broker/db.js';
import { isTransientConnectionError } from './internal/db-errors.js';
import { loadTracing } from './internal/otel.js';
import { createNotifier } from './broker/notifier.js';
import { missingMigrations } from './broker/migrations.js';
import { deleteServer, ensureQueues, unservedQueues, type UnservedQueue } from './broker/servers.js';
import { DatabaseUnavailableError, FailedPreconditionError, ServerClosedError, ValidationError } from './model/errors.js';
import { FailureRun, type Logger } from './internal/logger.js';
import { ServeMux, type Handler } from './mux.js';
import { Forwarder } from './server/forwarder.js';
import { Healthchecker } from './server/healthcheck.js';
import { HorizonWatch } from './server/horizon-watch.js';
import { Heartbeater } from './server/heartbeater.js';
import { Janitor } from './server/janitor.js';
import { Aggregator } from './server/aggregator.js';
import { Processor } from './server/processor.js';
import { LeaseTable, type LeaseCounters } from './server/lease-table.js';
import { Recoverer } from './server/recoverer.js';
import { StatsCollector } from './server/stats.js';
import { resolveServerConfig, type ResolvedServerConfig, type ServerConfig } from './server/config.js';

export type { ServerConfig } from './server/config.js';

export type ServerStatus = 'new' | 'active' | 'stopped' | 'closed';

/** How often servers flush their processed/failed counts: the daily counts the Inspector reads lag by about this much. */
const STATS_FLUSH_MS = 2000;
/** The unserved-queue warning at start counts pending tasks up to this many per queue. */
const UNSERVED_COUNT_CAP = 10_000;

/**
 * @example
 * const server = new Server({ queues: { critical: 6, default: 3, low: 1 }, concurrency: 20 });
 * await server.run(new ServeMux().handle('email:', sendEmail));
 */
export class Server {
  readonly id = randomUUID();
  readonly #cfg: ResolvedServerConfig;
  readonly #db: Db;
  /** The server's own lines (start, stop, unserved queues); components log through their own children. */
  readonly #log: Logger;
  #status: ServerStatus = 'new';
  #startedAt = 0;
  #parts: ReturnType<Server['wire']> | undefined;
  #statsTimer: NodeJS.Timeout | undefined;
  #shutdown: Promise<void> | undefined;

  constructor(config: ServerConfig = {}) {
    this.#cfg = resolveServerConfig(config);
    this.#log = this.#cfg.logger.child({ component: 'server' });
    this.#db = new Db(config, `pgasynq:server:${process.pid}`, { asyncCommit: true, logger: this.#cfg.logger, health: true });
  }

  get status(): ServerStatus {
    return this.#status;
  }

  /** Counters of this server since it started: claims, fenced writes, lost leases, recoveries. */
  metrics(): LeaseCounters & { recovered: number; archivedByRecoverer: number } {
    const p = this.#parts;
    return {
      ...(p?.leases.counters ?? { claimed: 0, fencedWrites: 0, leasesLost: 0 }),
      recovered: p?.recoverer.counters.retried ?? 0,
      archivedByRecoverer: p?.recoverer.counters.archived ?? 0,
    };
  }

  private wire(handler: Handler) {
    const cfg = this.#cfg;
    const log = cfg.logger;
    const stats = new StatsCollector(this.#db);
    const leases = new LeaseTable();
    const notifier = createNotifier(this.#db, log.child({ component: 'notifier' }), {
      listenConnectionString: cfg.listenConnectionString,
      pollInterval: cfg.taskCheckInterval,
    });
    const forwarder = new Forwarder(this.#db, log.child({ component: 'forwarder' }), cfg);
    const heartbeater = new Heartbeater(
      this.#db,
      log.child({ component: 'heartbeater' }),
      leases,
      () => ({
        id: this.id,
        host: hostname(),
        pid: process.pid,
        concurrency: cfg.concurrency,
        queues: { ...cfg.queues },
        strictPriority: cfg.strictPriority,
        status: this.#status,
      }),
      cfg,
    );
    const processor = new Processor(this.#db, log.child({ component: 'processor' }), { ...cfg, serverId: this.id }, handler, stats, leases, () =>
      heartbeater.wake(),
    );
    const recoverer = new Recoverer(this.#db, log.child({ component: 'recoverer' }), cfg, stats);
    const janitor = new Janitor(this.#db, log.child({ component: 'janitor' }), cfg);
    // Groups: only with an aggregator, and only the server's own queues.
    const aggregator =
      cfg.groupAggregator &&
      new Aggregator(this.#db, log.child({ component: 'aggregator' }), { ...cfg, groupAggregator: cfg.groupAggregator, queues: Object.keys(cfg.queues) });
    const healthchecker = cfg.healthCheck && new Healthchecker(this.#db, log.child({ component: 'healthcheck' }), cfg.healthCheck, cfg.healthCheckInterval);
    notifier.on(this.#db.channels.tasks, (queue) => processor.notify(queue));
    notifier.on(this.#db.channels.delayed, () => forwarder.wake());
    // Anyone who can connect may NOTIFY: the heartbeater aborts only what the database marks canceled.
    notifier.on(this.#db.channels.cancel, (id) => heartbeater.cancelHint(id));
    notifier.on(this.#db.channels.sweep, (queue) => (queue in cfg.queues ? processor.sweep() : undefined));
    // After every (re)connect, sweep: notifications sent while disconnected are lost.
    notifier.onConnected(() => {
      processor.sweep();
      forwarder.wake();
    });
    const horizonWatch = new HorizonWatch(this.#db, log.child({ component: 'horizon' }), cfg.healthCheckInterval);
    return { stats, leases, processor, notifier, forwarder, heartbeater, recoverer, janitor, aggregator, healthchecker, horizonWatch };
  }

  /**
   * Starts processing with `handler` (a ServeMux or a function).
   *
   * Rejects with FailedPreconditionError when the schema lacks migrations, and
   * with DatabaseUnavailableError when the database cannot be used for a
   * reason waiting will not fix (unknown database, role or host, failed
   * authentication). A database that is only unreachable does not make it
   * reject: the server starts, logs a warning, and its components retry in
   * the background until the database answers.
   */
  async start<P = unknown>(handler: ServeMux | Handler<P>): Promise<void> {
    if (this.#status === 'closed') throw new ServerClosedError();
    if (this.#status !== 'new') throw new ValidationError('server', `cannot start: it is ${this.#status}`);
    const fn: Handler = handler instanceof ServeMux ? (task, ctx) => handler.processTask(task, ctx) : (handler as Handler);
    if (typeof fn !== 'function') throw new ValidationError('handler', 'must be a ServeMux or a function');
    const [reachable] = await Promise.all([this.#checkSchema(), loadTracing()]);
    // Looked up before the components start, so start() resolves right after them, as
    // before: run() listens for signals from then on, and a handler may already be running.
    if (reachable) await this.#registerQueues();
    const unserved = reachable ? await this.#unservedQueues() : [];
    this.#status = 'active';
    const p = (this.#parts = this.wire(fn));
    await p.notifier.start();
    p.heartbeater.start();
    p.recoverer.start();
    p.forwarder.start();
    p.processor.start();
    p.janitor.start();
    p.aggregator?.start();
    p.healthchecker?.start();
    p.horizonWatch.start();
    const flushErrors = new FailureRun(this.#log, 'stats flush failed', 'stats flush succeeded again');
    this.#statsTimer = setInterval(
      () =>
        void p.stats.flush().then(
          () => flushErrors.succeeded(),
          // A lost database is reported once for all components, by the Db's health log.
          (err: unknown) => (isTransientConnectionError(err) ? this.#log.debug({ err }, 'stats flush failed: database unreachable') : flushErrors.failed(err)),
        ),
      STATS_FLUSH_MS,
    );
    this.#startedAt = performance.now();
    const cfg = this.#cfg;
    this.#log.info(
      {
        serverId: this.id,
        schema: this.#db.schema,
        database: this.#db.target,
        queues: { ...cfg.queues },
        strictPriority: cfg.strictPriority,
        concurrency: cfg.concurrency,
        prefetch: cfg.prefetch,
      },
      'server started',
    );
    for (const u of unserved) {
      this.#log.warn({ queue: u.queue, pending: u.pending, servedQueues: u.served }, 'queue has pending tasks but no running server serves it');
    }
  }

  /**
   * Refuses to start on a schema that lacks migrations this version needs
   * (its statements would fail on every claim instead), and on a database
   * that cannot be used (DatabaseUnavailableError). Resolves to false when
   * the database is only unreachable: the Db's health log has said so, and
   * the components retry until it answers.
   */
  async #checkSchema(): Promise<boolean> {
    let missing: string[];
    try {
      missing = await missingMigrations(this.#db);
    } catch (err) {
      if (err instanceof DatabaseUnavailableError) throw err;
      if (isTransientConnectionError(err)) return false;
      // Not fatal (a role that may not read the migrations table): the claims will tell.
      this.#log.warn({ err }, 'could not check the schema version; starting anyway');
      return true;
    }
    if (missing.length > 0) {
      throw new FailedPreconditionError(
        `schema "${this.#db.schema}" lacks migration${missing.length > 1 ? 's' : ''} ${missing.join(', ')}: run \`pgasynq migrate\` (or migrate()) before starting servers`,
      );
    }
    return true;
  }

  /**
   * Makes the queues this server serves known, so that `queue ls`, the
   * dashboard and the Inspector see them before their first task. A failure
   * costs only that (the first enqueue makes a queue known too): it is logged.
   */
  async #registerQueues(): Promise<void> {
    try {
      await ensureQueues(this.#db, Object.keys(this.#cfg.queues));
    } catch (err) {
      this.#log.warn({ err }, 'could not register the queues this server serves');
    }
  }

  /**
   * Queues that hold pending tasks that no running server (this one
   * included) serves, for one warning each at start: a typo in `queues`, or a
   * queue nobody started a server for, shows at once instead of as tasks
   * that never run. A failed lookup only costs the warnings.
   */
  async #unservedQueues(): Promise<UnservedQueue[]> {
    try {
      return await unservedQueues(this.#db, Object.keys(this.#cfg.queues), UNSERVED_COUNT_CAP);
    } catch (err) {
      this.#log.debug({ err }, 'could not look for unserved queues');
      return [];
    }
  }

  /** Starts, then shuts down gracefully on SIGTERM or SIGINT; resolves after the shutdown. */
  async run<P = unknown>(handler: ServeMux | Handler<P>): Promise<void> {
    await runUntilTerminated(
      () => this.start(handler),
      () => this.shutdown(),
    );
  }

  /** Stops claiming new tasks; running tasks go on. */
  async stop(): Promise<void> {
    if (this.#status !== 'active') return;
    this.#status = 'stopped';
    await this.#parts?.processor.stopClaiming();
  }

  /**
   * Stops claiming, lets running handlers finish for up to shutdownTimeout
   * (their leases still extended), then aborts the rest with ServerClosedError
   * and puts their tasks back at the front of their queues with their retry
   * count unchanged. Resolves within shutdownTimeout plus about a second.
   */
  shutdown(): Promise<void> {
    this.#shutdown ??= this.#doShutdown();
    return this.#shutdown;
  }

  async #doShutdown(): Promise<void> {
    const p = this.#parts;
    this.#status = 'closed';
    if (!p) return this.#db.close();
    clearInterval(this.#statsTimer);
    const dbg = (phase: string) => this.#log.debug({ phase }, 'shutdown');
    dbg('forwarder');
    await p.forwarder.stop();
    dbg('drain');
    await p.processor.drain(this.#cfg.shutdownTimeout);
    dbg('flushed');
    await p.processor.flushed();
    dbg('maint');
    await Promise.all([p.recoverer.stop(), p.janitor.stop(), p.aggregator?.stop(), p.healthchecker?.stop(), p.horizonWatch.stop()]);
    dbg('notifier');
    await p.notifier.stop();
    dbg('stats');
    await p.stats.flush().catch((err: unknown) => this.#log.warn({ err }, 'final stats flush failed'));
    dbg('heartbeater');
    await p.heartbeater.stop();
    dbg('delete');
    await deleteServer(this.#db, this.id).catch((err: unknown) => this.#log.warn({ err }, 'could not remove the server row'));
    dbg('close');
    await this.#db.close();
    this.#log.info({ serverId: this.id, claimed: p.leases.counters.claimed, uptimeMs: Math.round(performance.now() - this.#startedAt) }, 'server stopped');
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.shutdown();
  }
}
