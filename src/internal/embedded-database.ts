/**
 * The embedded backend's machinery: PostgreSQL compiled to WebAssembly
 * (PGlite), in this process, with no server to install. The public front,
 * createEmbeddedDatabase(), is src/embedded.ts.
 *
 * PGlite is one session, so this module puts a pg.Pool-shaped front on it
 * whose connect() hands out that session to one holder at a time: a
 * transaction owns the database until it releases it, and every other
 * statement waits its turn. Everything above (Kysely's PostgresDialect, the
 * migration runner, callers' `tx`) then works unchanged.
 */
import { EventEmitter } from 'node:events';

/** The part of PGlite we use, so our types never depend on the optional package. */
export interface PGliteLike {
  query<T>(sql: string, params?: unknown[]): Promise<{ rows: T[]; affectedRows?: number }>;
  exec(sql: string): Promise<{ rows: unknown[]; affectedRows?: number }[]>;
  listen(channel: string, callback: (payload: string) => void): Promise<() => Promise<void>>;
  close(): Promise<void>;
  readonly closed: boolean;
}

export interface QueryResult {
  rows: unknown[];
  rowCount: number;
  command: string;
}

/** pg returns bytea as Buffer; PGlite as Uint8Array. Keep pg's shape everywhere. */
function toBuffers(value: unknown): unknown {
  if (value instanceof Uint8Array && !Buffer.isBuffer(value)) return Buffer.from(value.buffer, value.byteOffset, value.byteLength);
  if (Array.isArray(value)) return value.map(toBuffers);
  if (value !== null && typeof value === 'object' && !(value instanceof Date) && !Buffer.isBuffer(value)) {
    for (const [k, v] of Object.entries(value)) (value as Record<string, unknown>)[k] = toBuffers(v);
  }
  return value;
}

/** The one session, lent to one holder at a time. */
class Session {
  readonly #db: PGliteLike;
  #tail: Promise<void> = Promise.resolve();

  constructor(db: PGliteLike) {
    this.#db = db;
  }

  /** Resolves once the caller holds the session; call the returned function to give it back. */
  acquire(): Promise<() => void> {
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    const turn = this.#tail.then(() => release);
    this.#tail = this.#tail.then(() => held);
    return turn;
  }

  async run(text: string, values?: readonly unknown[]): Promise<QueryResult> {
    const command = /^\s*(\w+)/.exec(text)?.[1]?.toUpperCase() ?? '';
    if (values === undefined || values.length === 0) {
      // Without parameters a text may hold several statements (migration files): the simple protocol.
      const results = await this.#db.exec(text);
      const last = results.at(-1);
      return { rows: toBuffers(last?.rows ?? []) as unknown[], rowCount: last?.affectedRows ?? last?.rows.length ?? 0, command };
    }
    const result = await this.#db.query(text, [...values]);
    return { rows: toBuffers(result.rows) as unknown[], rowCount: result.affectedRows ?? result.rows.length, command };
  }

  listen(channel: string, fn: (payload: string) => void): Promise<() => Promise<void>> {
    return this.#db.listen(channel, fn);
  }

  close(): Promise<void> {
    return this.#db.closed ? Promise.resolve() : this.#db.close();
  }
}

/**
 * The embedded database's one session, lent to you until release(): run your
 * own statements, or BEGIN … COMMIT around them and pass it as `tx` to enqueue.
 * Everything else waits while you hold it, so release it promptly.
 */
export class EmbeddedClient {
  readonly #session: Session;
  readonly #release: () => void;
  #released = false;

  constructor(session: Session, release: () => void) {
    this.#session = session;
    this.#release = release;
  }

  query(text: string | { text: string; values?: unknown[] }, values?: unknown[]): Promise<QueryResult> {
    if (this.#released) return Promise.reject(new Error('this embedded client was released'));
    if (typeof text === 'object') return this.#session.run(text.text, text.values);
    return this.#session.run(text, values);
  }

  release(): void {
    if (this.#released) return;
    this.#released = true;
    this.#release();
  }
}

/** @internal A pg.Pool lookalike over one PGlite session. */
export class EmbeddedPool extends EventEmitter {
  readonly session: Session;
  readonly options = {};
  #ended = false;

  constructor(db: PGliteLike) {
    super();
    this.session = new Session(db);
  }

  async connect(): Promise<EmbeddedClient> {
    if (this.#ended) throw new Error('the embedded database is closed');
    return new EmbeddedClient(this.session, await this.session.acquire());
  }

  async query(text: string, values?: unknown[]): Promise<QueryResult> {
    const client = await this.connect();
    try {
      return await client.query(text, values);
    } finally {
      client.release();
    }
  }

  /** Borrowed by every Client and Server: only EmbeddedDatabase.close() ends it. */
  async end(): Promise<void> {}

  async shutdown(): Promise<void> {
    if (this.#ended) return;
    this.#ended = true;
    const release = await this.session.acquire();
    try {
      await this.session.close();
    } finally {
      release();
    }
  }
}

/**
 * A PostgreSQL running inside this process (PGlite), for the demo and for
 * testing your handlers without a database server. Pass it as `embedded` to
 * Client, Server, Inspector and migrate(); it is yours to close.
 *
 * @example
 * const db = await createEmbeddedDatabase();
 * await migrate({ embedded: db });
 * const client = new Client({ embedded: db });
 * const server = new Server({ embedded: db, concurrency: 4 });
 */
export class EmbeddedDatabase {
  /** @internal */
  readonly pool: EmbeddedPool;
  /** Where the data lives; undefined for a database in memory. */
  readonly dataDir: string | undefined;

  /** @internal use createEmbeddedDatabase() */
  constructor(db: PGliteLike, dataDir: string | undefined) {
    this.pool = new EmbeddedPool(db);
    this.dataDir = dataDir;
  }

  /** Borrows the session for your own statements or transaction; release() it when done. */
  connect(): Promise<EmbeddedClient> {
    return this.pool.connect();
  }

  /** Runs one statement of yours. */
  async query<R = Record<string, unknown>>(text: string, values?: unknown[]): Promise<{ rows: R[]; rowCount: number }> {
    return (await this.pool.query(text, values)) as { rows: R[]; rowCount: number };
  }

  /** Closes the database; every Client and Server on it must be closed first. */
  close(): Promise<void> {
    return this.pool.shutdown();
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
