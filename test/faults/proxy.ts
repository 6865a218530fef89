/**
 * The fault suite's TCP proxy (reliability plan §5.1: `tc netem` is not
 * available on this kernel, so the harness owns the network faults it
 * injects above TCP). One listening socket in the test's own process, in
 * front of one PostgreSQL address; each accepted connection gets its own
 * upstream connection and its own mode, switchable at run time:
 *
 *   pass        forward both ways.
 *   delay(ms)   hold every chunk from the server for `ms` before it reaches the
 *               client (order kept: a chunk never overtakes an earlier one, even
 *               when the delay is lowered); client → server is not delayed.
 *   blackhole   forward nothing, either way, and keep both sockets open: no FIN,
 *               no RST reaches either side, whatever the other side does (a
 *               half-open flow; TCP itself stays healthy, since this host's
 *               kernel still acknowledges, so only an application-level ping
 *               with a timeout can notice). Data in flight is dropped.
 *   reset       reset both sockets (RST) at once; a new connection is reset as
 *               soon as it is accepted.
 *
 *   const proxy = await TcpProxy.start({ targetHost: '127.0.0.1', targetPort: cluster.port });
 *   const dsn = proxy.dsn(cluster.connectionString);      // same DSN, through the proxy
 *   proxy.setMode(blackhole(), { future: false });        // existing flows only; new ones pass
 *   proxy.setMode(delay(500));                            // every flow, existing and new
 *   await proxy.close();
 */
import { createServer, connect, type Server, type Socket } from 'node:net';

export type ProxyMode = { kind: 'pass' } | { kind: 'delay'; ms: number } | { kind: 'blackhole' } | { kind: 'reset' };

export const pass = (): ProxyMode => ({ kind: 'pass' });
export const delay = (ms: number): ProxyMode => (ms > 0 ? { kind: 'delay', ms } : { kind: 'pass' });
export const blackhole = (): ProxyMode => ({ kind: 'blackhole' });
export const reset = (): ProxyMode => ({ kind: 'reset' });

const describe = (m: ProxyMode): string => (m.kind === 'delay' ? `delay(${m.ms})` : m.kind);

/** What goes to the client, in order: data, then maybe its end (FIN) or its close. */
type Item = { at: number; chunk: Buffer } | { at: number; end: 'fin' | 'destroy' | 'rst' };

/** One client connection and its upstream connection. */
export class ProxyConnection {
  readonly openedAt = performance.now();
  bytesUp = 0;
  bytesDown = 0;
  /** Bytes the proxy dropped (blackhole). */
  bytesDropped = 0;
  #mode: ProxyMode;
  #clientGone = false;
  #serverGone = false;
  readonly #queue: Item[] = [];
  #lastAt = 0;
  #timer: NodeJS.Timeout | undefined;

  constructor(
    readonly id: number,
    readonly client: Socket,
    readonly server: Socket,
    mode: ProxyMode,
  ) {
    this.#mode = mode;
    client.setNoDelay(true);
    server.setNoDelay(true);
    client.on('data', (chunk: Buffer) => {
      this.bytesUp += chunk.length;
      if (this.#mode.kind === 'blackhole' || this.#serverGone) {
        this.bytesDropped += chunk.length;
        return;
      }
      if (!server.write(chunk)) {
        client.pause();
        server.once('drain', () => client.resume());
      }
    });
    server.on('data', (chunk: Buffer) => {
      this.bytesDown += chunk.length;
      if (this.#mode.kind === 'blackhole' || this.#clientGone) {
        this.bytesDropped += chunk.length;
        return;
      }
      this.#push({ at: this.#releaseAt(), chunk });
    });
    // FIN from the client: passed on, unless the flow is blackholed (the server never learns).
    client.on('end', () => {
      if (this.#mode.kind !== 'blackhole' && !this.#serverGone) server.end();
    });
    server.on('end', () => {
      if (this.#mode.kind !== 'blackhole' && !this.#clientGone) this.#push({ at: this.#releaseAt(), end: 'fin' });
    });
    client.on('error', () => {});
    server.on('error', (err: NodeJS.ErrnoException) => {
      if (err.code === 'ECONNRESET' && this.#mode.kind !== 'blackhole' && !this.#clientGone) this.#push({ at: this.#releaseAt(), end: 'rst' });
    });
    client.on('close', () => {
      this.#clientGone = true;
      this.#clearQueue();
      // The client went away: so does the upstream, unless blackholed (the server keeps its session).
      if (this.#mode.kind !== 'blackhole') server.destroy();
    });
    server.on('close', () => {
      this.#serverGone = true;
      if (this.#mode.kind !== 'blackhole' && !this.#clientGone) this.#push({ at: this.#releaseAt(), end: 'destroy' });
    });
  }

  get mode(): ProxyMode {
    return this.#mode;
  }

  /** Both sockets are gone. */
  get closed(): boolean {
    return this.#clientGone && this.#serverGone;
  }

  /** The client's local port as the proxy sees it (its remote port). */
  get clientPort(): number | undefined {
    return this.client.remotePort;
  }

  setMode(mode: ProxyMode): void {
    this.#mode = mode;
    if (mode.kind === 'reset') {
      this.#clearQueue();
      if (!this.client.destroyed) this.client.resetAndDestroy();
      if (!this.server.destroyed) this.server.resetAndDestroy();
    } else if (mode.kind === 'blackhole') {
      for (const item of this.#queue) if ('chunk' in item) this.bytesDropped += item.chunk.length;
      this.#clearQueue();
    }
  }

  /** Destroys both sockets (the proxy is closing). */
  destroy(): void {
    this.#clearQueue();
    this.client.destroy();
    this.server.destroy();
  }

  toString(): string {
    return `#${this.id} ${describe(this.#mode)} up ${this.bytesUp} B down ${this.bytesDown} B${this.closed ? ' closed' : ''}`;
  }

  /** When a server chunk arriving now may reach the client: after the delay, never before an earlier one. */
  #releaseAt(): number {
    const ms = this.#mode.kind === 'delay' ? this.#mode.ms : 0;
    this.#lastAt = Math.max(performance.now() + ms, this.#lastAt);
    return this.#lastAt;
  }

  #push(item: Item): void {
    this.#queue.push(item);
    this.#pump();
  }

  #pump(): void {
    clearTimeout(this.#timer);
    this.#timer = undefined;
    const now = performance.now();
    while (this.#queue.length > 0 && this.#queue[0]!.at <= now) {
      const item = this.#queue.shift()!;
      if (this.#clientGone) continue;
      if ('chunk' in item) this.client.write(item.chunk);
      else if (item.end === 'fin') this.client.end();
      else if (item.end === 'rst') this.client.resetAndDestroy();
      else this.client.destroy();
    }
    const next = this.#queue[0];
    if (next) this.#timer = setTimeout(() => this.#pump(), Math.max(0, next.at - now));
  }

  #clearQueue(): void {
    clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#queue.length = 0;
  }
}

export interface ProxyOptions {
  targetHost: string;
  targetPort: number;
  /** Where the proxy listens (127.0.0.1). */
  listenHost?: string;
  /** The mode of new connections (pass). */
  mode?: ProxyMode;
}

export class TcpProxy {
  /** Every connection accepted so far, open or closed, in order. */
  readonly connections: ProxyConnection[] = [];
  #mode: ProxyMode;
  #nextId = 1;
  readonly #listeners: ((c: ProxyConnection) => void)[] = [];

  private constructor(
    readonly server: Server,
    readonly host: string,
    readonly port: number,
    readonly opts: ProxyOptions,
  ) {
    this.#mode = opts.mode ?? pass();
    server.on('connection', (client) => this.#accept(client));
  }

  static async start(opts: ProxyOptions): Promise<TcpProxy> {
    const host = opts.listenHost ?? '127.0.0.1';
    const server = createServer({ allowHalfOpen: true });
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(0, host, () => resolve());
    });
    server.on('error', () => {});
    const { port } = server.address() as { port: number };
    return new TcpProxy(server, host, port, opts);
  }

  /** The mode new connections get. */
  get mode(): ProxyMode {
    return this.#mode;
  }

  /** Connections with at least one socket still open. */
  get open(): ProxyConnection[] {
    return this.connections.filter((c) => !c.closed);
  }

  /** `connectionString` with its host and port replaced by the proxy's. */
  dsn(connectionString: string): string {
    const url = new URL(connectionString);
    url.hostname = this.host;
    url.port = String(this.port);
    return url.href;
  }

  /**
   * Switches the open connections (`existing`, default true) and the ones
   * accepted from now on (`future`, default true) to `mode`. Returns the
   * existing connections it switched.
   */
  setMode(mode: ProxyMode, { existing = true, future = true }: { existing?: boolean; future?: boolean } = {}): ProxyConnection[] {
    if (future) this.#mode = mode;
    if (!existing) return [];
    const switched = this.open;
    for (const c of switched) c.setMode(mode);
    return switched;
  }

  /** Calls `fn` with every connection accepted from now on. */
  onConnection(fn: (c: ProxyConnection) => void): void {
    this.#listeners.push(fn);
  }

  async close(): Promise<void> {
    for (const c of this.connections) c.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  #accept(client: Socket): void {
    if (this.#mode.kind === 'reset') {
      client.on('error', () => {});
      client.resetAndDestroy();
      return;
    }
    const server = connect({ host: this.opts.targetHost, port: this.opts.targetPort, allowHalfOpen: true });
    const conn = new ProxyConnection(this.#nextId++, client, server, this.#mode);
    this.connections.push(conn);
    for (const fn of this.#listeners) fn(conn);
  }
}
