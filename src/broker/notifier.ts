/**
 * Wake-ups over LISTEN/NOTIFY, on one dedicated connection through pg-listen.
 * A notification is only ever a hint: every component also polls, and after
 * each (re)connect the subscribers are told to sweep for work they may have
 * missed while the connection was down.
 */
import { randomUUID } from 'node:crypto';
import net from 'node:net';
import pg from 'pg';
import * as pgListen from 'pg-listen';
import type { Options as ListenOptions, Subscriber } from 'pg-listen';
import { backoffMs } from '../internal/backoff.js';
import { FailureRun, type Logger } from '../internal/logger.js';
import type { Db } from './db.js';

type Listener = (payload: string) => void;

// pg-listen is CommonJS with `exports.default`; under NodeNext its default import is the module object.
type CreateSubscriber = (config: pg.ClientConfig, options: ListenOptions) => Subscriber;
const listenModule = pgListen as unknown as { default: CreateSubscriber | { default: CreateSubscriber } };
const createSubscriber: CreateSubscriber = typeof listenModule.default === 'function' ? listenModule.default : listenModule.default.default;

/** Wake-ups for the server: one implementation per backend. */
export interface Notifier {
  /** Calls `fn` with the payload of every notification on `channel`; before start(). */
  on(channel: string, fn: Listener): void;
  /** Calls `fn` after every (re)connect, once LISTEN is in place. */
  onConnected(fn: () => void): void;
  start(): Promise<void>;
  stop(): Promise<void>;
}

/** How the server hears of work. */
export interface NotifierOptions {
  /**
   * A connection string for LISTEN only, when the pool's connections cannot
   * LISTEN (a transaction-pooling proxy): a direct or session-pooled one.
   */
  listenConnectionString?: string | undefined;
  /** How often the server polls for work without notifications (for the warning). */
  pollInterval?: number | undefined;
  /** How long the startup probe waits for its own notification. @defaultValue 2 s */
  probeTimeout?: number | undefined;
}

/** The notifier for the database behind `db`. */
export function createNotifier(db: Db, logger: Logger, opts: NotifierOptions = {}): Notifier {
  return db.embedded ? new EmbeddedNotifier(db, logger) : new PgNotifier(db, logger, opts);
}

/** Why a connection cannot be used for LISTEN, or null when it can. */
export type ListenProbeResult = null | 'not-listening' | 'no-notification';

/**
 * Checks, on a connection made with `config`, that a LISTEN lasts beyond its
 * own statement and that a notification sent from another session arrives.
 * A transaction-pooling proxy (pgbouncer pool_mode=transaction) fails one of
 * the two. After the LISTEN it hands that server connection to the next
 * transaction of any client: one is opened at once through `pool` (the
 * library's sessions), so with the proxy's usual last-used-first order the
 * check of pg_listening_channels() runs on another server connection and
 * finds nothing. If it still finds the channel (the check ran on the same
 * one), a NOTIFY sent through `pool` decides: the proxy no longer binds that
 * server connection to this client, so the notification goes to whoever
 * uses it then, or nowhere, and never arrives here within `timeoutMs`.
 */
export async function probeListen(config: pg.ClientConfig, pool: pg.Pool, timeoutMs: number): Promise<ListenProbeResult> {
  const client = new pg.Client({ ...config, application_name: 'pgasynq:listen-probe' });
  client.on('error', () => {});
  await client.connect();
  try {
    // Our own name, from hex digits only: safe to put in the statement.
    const channel = `pgasynq_probe_${randomUUID().replaceAll('-', '')}`;
    let heard!: () => void;
    const arrived = new Promise<void>((resolve) => (heard = resolve));
    client.on('notification', (n) => n.channel === channel && heard());
    await client.query(`LISTEN ${channel}`);
    const other = await pool.connect();
    let listening: boolean;
    try {
      await other.query('BEGIN');
      const { rows } = await client.query<{ listening: boolean }>('SELECT $1::text = ANY (ARRAY(SELECT pg_listening_channels())) AS listening', [channel]);
      listening = rows[0]?.listening === true;
    } finally {
      await other.query('COMMIT').catch(() => {});
      other.release();
    }
    if (!listening) return 'not-listening';
    await pool.query('SELECT pg_notify($1, $2)', [channel, 'probe']);
    let timer: NodeJS.Timeout | undefined;
    const timedOut = new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(true), timeoutMs)));
    const late = await Promise.race([arrived.then(() => false), timedOut]);
    clearTimeout(timer);
    return late ? 'no-notification' : null;
  } finally {
    await client.end().catch(() => {});
  }
}

/** What both notifiers share: who listens to which channel, and who hears of (re)connects. */
abstract class ListenerRegistry {
  protected readonly listeners = new Map<string, Listener[]>();
  protected readonly connectedCallbacks: (() => void)[] = [];

  on(channel: string, fn: Listener): void {
    this.listeners.set(channel, [...(this.listeners.get(channel) ?? []), fn]);
  }

  onConnected(fn: () => void): void {
    this.connectedCallbacks.push(fn);
  }

  /** Hands a notification's payload to every listener of its channel. */
  protected deliver(channel: string, payload: string): void {
    for (const fn of this.listeners.get(channel) ?? []) fn(payload);
  }

  protected connected(): void {
    for (const fn of this.connectedCallbacks) fn();
  }
}

/** LISTEN inside the embedded database: in-process, so nothing to reconnect. */
class EmbeddedNotifier extends ListenerRegistry implements Notifier {
  readonly #db: Db;
  readonly #logger: Logger;
  #unlisten: (() => Promise<void>)[] = [];

  constructor(db: Db, logger: Logger) {
    super();
    this.#db = db;
    this.#logger = logger;
  }

  async start(): Promise<void> {
    const pool = this.#db.embedded!.pool;
    // LISTEN takes the session like any statement, so it never lands inside someone's transaction.
    const client = await pool.connect();
    try {
      for (const channel of this.listeners.keys()) {
        this.#unlisten.push(await pool.session.listen(channel, (payload) => this.deliver(channel, payload)));
      }
    } catch (err) {
      this.#logger.warn({ err }, 'could not LISTEN on the embedded database; polling only');
    } finally {
      client.release();
    }
    this.connected();
  }

  async stop(): Promise<void> {
    const unlisten = this.#unlisten.splice(0);
    if (unlisten.length === 0) return;
    const client = await this.#db.embedded!.pool.connect().catch(() => undefined);
    if (!client) return;
    try {
      for (const fn of unlisten) await fn().catch(() => {});
    } finally {
      client.release();
    }
  }
}

/**
 * LISTEN on a dedicated connection of the PostgreSQL server, through pg-listen:
 * the pool's connection settings, or `listenConnectionString`. The first
 * connect probes that LISTEN works there (probeListen); behind a
 * transaction-pooling proxy it does not, so the notifier warns once and
 * stays off: the server polls every taskCheckInterval instead.
 *
 * A connection that died without a FIN or RST (a dropped route, a NAT or
 * firewall that forgot the flow) gives no socket event, and a health query on
 * it never settles, so the notifier pings itself: every 10·P it sends a
 * NOTIFY on a channel only it listens to, through the pool, and if that does
 * not arrive within P of its commit it destroys the listener's socket. P is
 * the poll interval, at least 1 s: polling covers the gap, so a ping needs no
 * finer grain.
 *
 * A lost connection (the socket's error, a terminated session) is replaced
 * by a new subscriber, on this notifier's backoff, never by pg-listen's own
 * loop (which would go on after stop()); the subscribers sweep after every
 * reconnect.
 */
class PgNotifier extends ListenerRegistry implements Notifier {
  readonly #db: Db;
  readonly #logger: Logger;
  readonly #opts: NotifierOptions;
  /** Connection failures of the listener: the first logged at once, the rest with backoff. */
  readonly #failures: FailureRun;
  #subscriber: Subscriber | undefined;
  #retryTimer: NodeJS.Timeout | undefined;
  #stopped = false;
  /** Whether LISTEN was found to work on this connection (decided once). */
  #listenWorks: boolean | undefined;
  /** The listening connection's socket (the latest pg-listen opened): what a failed ping destroys. */
  #socket: net.Socket | undefined;
  /** A channel only this notifier listens to, for its pings (hex digits only). */
  readonly #pingChannel = `pgasynq_ping_${randomUUID().replaceAll('-', '')}`;
  #pingTimer: NodeJS.Timeout | undefined;
  /** Resolves the running ping when its nonce arrives. */
  #pingHeard: { nonce: string; heard: () => void } | undefined;

  constructor(db: Db, logger: Logger, opts: NotifierOptions) {
    super();
    this.#db = db;
    this.#logger = logger;
    this.#opts = opts;
    this.#failures = new FailureRun(logger, 'listener cannot connect; polling for work until it can', 'listener connected again');
  }

  /**
   * Connects and listens. Never throws: without a database it keeps trying in
   * the background (polling covers the gap) until stop().
   */
  async start(): Promise<void> {
    this.#stopped = false;
    await this.#connect(0);
  }

  /** Settings of the listening connection. */
  #config(): pg.ClientConfig {
    const base: pg.ClientConfig =
      this.#opts.listenConnectionString === undefined
        ? { ...(this.#db.pool as unknown as { options: pg.ClientConfig }).options }
        : { connectionString: this.#opts.listenConnectionString, keepAlive: true, connectionTimeoutMillis: 10_000 };
    // Session settings of the pool (the server's synchronous_commit) mean nothing to
    // a connection that only listens, and a pooling proxy may refuse the parameter.
    delete (base as { options?: unknown }).options;
    return { ...base, application_name: 'pgasynq:listener' };
  }

  /** The ping's wait for its own notification, and its period (10 of them). */
  get #pingTimeout(): number {
    return Math.max(this.#opts.pollInterval ?? 1000, 1000);
  }

  #schedulePing(): void {
    clearTimeout(this.#pingTimer);
    if (this.#stopped) return;
    this.#pingTimer = setTimeout(() => void this.#ping(), 10 * this.#pingTimeout);
    this.#pingTimer.unref();
  }

  /**
   * One health ping. A pool that cannot send it says nothing about the
   * listener (the database is down, and the listener will hear of it). The
   * wait starts once the NOTIFY has committed, and on timeout gives pending
   * I/O one more turn of the event loop, so that a loop held up by a busy
   * process does not read as a dead connection.
   */
  async #ping(): Promise<void> {
    const nonce = randomUUID();
    const heard = new Promise<boolean>((resolve) => (this.#pingHeard = { nonce, heard: () => resolve(true) }));
    try {
      await this.#db.pool.query('SELECT pg_notify($1, $2)', [this.#pingChannel, nonce]);
      let timer: NodeJS.Timeout | undefined;
      const late = new Promise<boolean>((resolve) => (timer = setTimeout(() => setImmediate(() => resolve(false)), this.#pingTimeout)));
      const arrived = await Promise.race([heard, late]);
      clearTimeout(timer);
      if (!arrived && !this.#stopped && this.#pingHeard?.nonce === nonce) {
        this.#logger.warn({ timeoutMs: this.#pingTimeout }, 'listener did not hear its own ping: reconnecting it (polling meanwhile)');
        this.#socket?.destroy(new Error('listener ping timed out'));
      }
    } catch {
      // No verdict: see above.
    } finally {
      if (this.#pingHeard?.nonce === nonce) this.#pingHeard = undefined;
      this.#schedulePing();
    }
  }

  /** Probes once; false (after one warning) when LISTEN cannot work on this connection. */
  async #checkListen(config: pg.ClientConfig): Promise<boolean> {
    if (this.#listenWorks !== undefined) return this.#listenWorks;
    const why = await probeListen(config, this.#db.pool, this.#opts.probeTimeout ?? 2000);
    this.#listenWorks = why === null;
    if (why !== null) {
      const direct = this.#opts.listenConnectionString !== undefined;
      this.#logger.warn(
        { probe: why, pollInterval: this.#opts.pollInterval, listenConnectionString: direct },
        `LISTEN does not work on the ${direct ? 'listenConnectionString' : 'server'} connection ` +
          '(a transaction-pooling proxy such as pgbouncer with pool_mode=transaction?): notifications are off, ' +
          `the server polls for work every ${this.#opts.pollInterval ?? 'taskCheckInterval'} ms. ` +
          'For immediate pickup, pass listenConnectionString: a direct or session-pooled connection string.',
      );
    }
    return this.#listenWorks;
  }

  async #connect(attempt: number): Promise<void> {
    if (this.#stopped) return;
    const config = this.#config();
    let listen: boolean;
    try {
      listen = await this.#checkListen(config);
    } catch (err) {
      this.#retry(err, attempt);
      return;
    }
    if (this.#stopped) return;
    if (!listen) {
      // Polling only: the subscribers' sweep is all a "connect" means now.
      this.connected();
      return;
    }
    // Reconnecting is ours, not pg-listen's: its loop never looks at close(), so a server
    // shut down while the database was away kept retrying (and held its process open)
    // forever. With retryLimit 1 pg-listen gives up at once when the connection is lost,
    // and says so with an 'error'; this notifier then opens a new subscriber on its own
    // backoff, which stop() ends. Payloads are plain text, not JSON.
    // Our own socket, so that a ping that fails can end it (pg-listen keeps its client to
    // itself); the ping also replaces pg-listen's health query, which has no timeout.
    const stream = (): net.Socket => (this.#socket = new net.Socket());
    const subscriber = createSubscriber(
      { ...config, stream },
      {
        retryLimit: 1,
        paranoidChecking: false,
        parse: (s: string) => s,
        serialize: (s: unknown) => String(s),
      },
    );
    subscriber.events.on('error', (err: Error) => this.#lost(subscriber, err));
    for (const channel of this.listeners.keys()) {
      subscriber.notifications.on(channel, (payload: unknown) => this.deliver(channel, String(payload ?? '')));
    }
    subscriber.notifications.on(this.#pingChannel, (payload: unknown) => {
      if (this.#pingHeard?.nonce === String(payload)) this.#pingHeard.heard();
    });
    try {
      await subscriber.connect();
      for (const channel of [...this.listeners.keys(), this.#pingChannel]) await subscriber.listenTo(channel);
    } catch (err) {
      subscriber.close().catch(() => {});
      this.#retry(err, attempt);
      return;
    }
    if (this.#stopped) {
      await subscriber.close().catch(() => {});
      return;
    }
    this.#subscriber = subscriber;
    this.#failures.succeeded();
    this.connected();
    this.#schedulePing();
  }

  /** The listening connection of `subscriber` is gone: close it, and connect a new one (polling covers the gap). */
  #lost(subscriber: Subscriber, err: Error): void {
    subscriber.close().catch(() => {});
    if (subscriber !== this.#subscriber) return;
    this.#subscriber = undefined;
    clearTimeout(this.#pingTimer);
    this.#retry(new Error('the listening connection was lost', { cause: err }), 0);
  }

  #retry(err: unknown, attempt: number): void {
    this.#failures.failed(err, { attempt });
    if (this.#stopped) return;
    this.#retryTimer = setTimeout(() => void this.#connect(attempt + 1), backoffMs(attempt, 200, 5000));
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    clearTimeout(this.#retryTimer);
    clearTimeout(this.#pingTimer);
    const s = this.#subscriber;
    this.#subscriber = undefined;
    if (s) await s.close().catch(() => {});
  }
}
