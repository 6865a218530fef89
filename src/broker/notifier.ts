/**
 * Wake-ups over LISTEN/NOTIFY, on one dedicated connection through pg-listen.
 * A notification is only ever a hint: every component also polls, and after
 * each (re)connect the subscribers are told to sweep for work they may have
 * missed while the connection was down.
 */
import * as pgListen from 'pg-listen';
import type { Options as ListenOptions, Subscriber } from 'pg-listen';
import type pg from 'pg';
import type { Logger } from '../logger.js';
import type { Db } from './db.js';

type Listener = (payload: string) => void;

// pg-listen is CommonJS with `exports.default`; under NodeNext its default import is the module object.
type CreateSubscriber = (config: pg.ClientConfig, options: ListenOptions) => Subscriber;
const listenModule = pgListen as unknown as { default: CreateSubscriber | { default: CreateSubscriber } };
const createSubscriber: CreateSubscriber =
  typeof listenModule.default === 'function' ? listenModule.default : listenModule.default.default;

/** Wake-ups for the server: one implementation per backend. */
export interface Notifier {
  /** Calls `fn` with the payload of every notification on `channel`; before start(). */
  on(channel: string, fn: Listener): void;
  /** Calls `fn` after every (re)connect, once LISTEN is in place. */
  onConnected(fn: () => void): void;
  start(): Promise<void>;
  stop(): Promise<void>;
}

/** The notifier for the database behind `db`. */
export function createNotifier(db: Db, logger: Logger): Notifier {
  return db.embedded ? new EmbeddedNotifier(db, logger) : new PgNotifier(db, logger);
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

/** LISTEN on a dedicated connection of the PostgreSQL server, through pg-listen. */
class PgNotifier extends ListenerRegistry implements Notifier {
  readonly #db: Db;
  readonly #logger: Logger;
  #subscriber: Subscriber | undefined;
  #retryTimer: NodeJS.Timeout | undefined;
  #stopped = false;

  constructor(db: Db, logger: Logger) {
    super();
    this.#db = db;
    this.#logger = logger;
  }

  /**
   * Connects and listens. Never throws: without a database it keeps trying in
   * the background (polling covers the gap) until stop().
   */
  async start(): Promise<void> {
    this.#stopped = false;
    await this.#connect(0);
  }

  async #connect(attempt: number): Promise<void> {
    if (this.#stopped) return;
    // pg-listen's defaults are wrong for a server: it gives up after 3 s without a
    // database and JSON-parses every payload. Never give up; payloads are plain text.
    const config = (this.#db.pool as unknown as { options: pg.ClientConfig }).options;
    const subscriber = createSubscriber({ ...config, application_name: 'pgasynq:listener' }, {
      retryTimeout: Number.POSITIVE_INFINITY,
      retryInterval: (n: number) => Math.min(5000, 100 * 2 ** n),
      paranoidChecking: 10_000,
      parse: (s: string) => s,
      serialize: (s: unknown) => String(s),
    });
    subscriber.events.on('error', (err: Error) => this.#logger.warn({ err }, 'listener connection error'));
    subscriber.events.on('reconnect', (n: number) => this.#logger.info({ attempt: n }, 'listener reconnecting'));
    for (const channel of this.listeners.keys()) {
      subscriber.notifications.on(channel, (payload: unknown) => this.deliver(channel, String(payload ?? '')));
    }
    try {
      await subscriber.connect();
      for (const channel of this.listeners.keys()) await subscriber.listenTo(channel);
    } catch (err) {
      this.#logger.warn({ err, attempt }, 'listener could not connect; polling until it can');
      subscriber.close().catch(() => {});
      this.#retryTimer = setTimeout(() => void this.#connect(attempt + 1), Math.min(5000, 200 * 2 ** attempt));
      return;
    }
    if (this.#stopped) {
      await subscriber.close().catch(() => {});
      return;
    }
    this.#subscriber = subscriber;
    // pg-listen re-LISTENs on reconnect, then emits 'connected'.
    subscriber.events.on('connected', () => this.connected());
    this.connected();
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    clearTimeout(this.#retryTimer);
    const s = this.#subscriber;
    this.#subscriber = undefined;
    if (s) await s.close().catch(() => {});
  }
}
