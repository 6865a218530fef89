/**
 * A TCP proxy in front of the owned cluster that reads enough of the
 * PostgreSQL wire protocol (v3) to lose the reply to a commit: the
 * `cutAfterCommitReply` fault of the reliability plan (§5.1, F02b).
 *
 * Client → server bytes are forwarded as they come; a copy is parsed for the
 * SQL each statement runs (Parse/Bind/Execute of the extended protocol, named
 * or unnamed, and Query of the simple one). Server → client bytes are parsed
 * into messages; from a CommandComplete ('C') on, the messages are held until
 * the ReadyForQuery ('Z') that follows, and then either relayed or dropped.
 *
 * A reply is a candidate for the cut when its ReadyForQuery says the session
 * is idle again (status 'I': the transaction has ended) and the transaction
 * it ends committed:
 *   - explicit: the last CommandComplete's tag is `COMMIT` (a failed
 *     transaction's COMMIT answers `ROLLBACK`, which is never cut);
 *   - implicit: the session was idle before (autocommit), no ErrorResponse
 *     came, and the statement's CommandComplete was received (a single
 *     statement in autocommit, such as a batched completion: in the extended
 *     protocol it commits at the Sync after it, so after its CommandComplete
 *     is sent and before the ReadyForQuery 'I' is: cutting at the
 *     ReadyForQuery cuts after the commit).
 * and when one of the statements the transaction ran matches `match` and
 * changed rows (its CommandComplete tag does not end in 0: a completion that
 * the lease token fenced off, `SELECT 0`, committed nothing). A
 * candidate is cut with probability `p`: its CommandComplete and
 * ReadyForQuery are not relayed, the client's socket is reset (RST) and the
 * server's closed. The server has already committed (with
 * synchronous_commit on, CommandComplete of a COMMIT is sent after the WAL
 * flush), so the client is left not knowing whether its commit happened.
 *
 * Each cut records that statement's SQL and parameters (the test reads the
 * completed tasks' seqs from them).
 *
 * SSL and GSSAPI encryption requests are answered by the server ('N' on the
 * test clusters); a connection that does switch to TLS is relayed untouched.
 */
import { createConnection, createServer, type Server, type Socket } from 'node:net';

export interface CommitCut {
  /** Date.now() when the reply was dropped. */
  at: number;
  conn: number;
  kind: 'explicit' | 'implicit';
  /** The first statement of the transaction that matched, cut to 160 characters. */
  sql: string;
  /** That statement's parameters as sent (text format; null for NULL, `<binary>` for binary ones), each cut to 2,000 characters. */
  params: (string | null)[];
}

export interface CommitProxyOptions {
  /** Where the server listens. */
  targetHost?: string;
  targetPort: number;
  /** Probability of cutting a candidate reply (0: relay everything). */
  p: number;
  /** Only transactions that ran a statement matching this are candidates. */
  match: RegExp;
}

export interface CommitProxy {
  port: number;
  /** `connectionString` with its port replaced by the proxy's. */
  url(connectionString: string): string;
  /** Every reply that was dropped, in order. */
  readonly cuts: CommitCut[];
  /** Counts: connections accepted, candidate replies seen (cut or relayed), connections relayed as opaque TLS. */
  readonly stats: { connections: number; candidates: number; opaque: number };
  /** Changes the probability from now on (0 stops cutting). */
  setP(p: number): void;
  close(): Promise<void>;
}

const SSL_REQUEST = 80877103;
const GSSENC_REQUEST = 80877104;
const CANCEL_REQUEST = 80877102;

/** A statement as run: its SQL and its parameters. */
interface Run {
  sql: string;
  params: (string | null)[];
}

/** The parameters of a Bind message from `off` (after the portal and statement names). */
function bindParams(body: Buffer, off: number): (string | null)[] {
  const nFormats = body.readInt16BE(off);
  const formats: number[] = [];
  for (let i = 0; i < nFormats; i++) formats.push(body.readInt16BE(off + 2 + 2 * i));
  let o = off + 2 + 2 * nFormats;
  const n = body.readInt16BE(o);
  o += 2;
  const params: (string | null)[] = [];
  for (let i = 0; i < n; i++) {
    const len = body.readInt32BE(o);
    o += 4;
    if (len < 0) {
      params.push(null);
      continue;
    }
    const binary = (nFormats === 1 ? formats[0] : formats[i]) === 1;
    params.push(binary ? '<binary>' : body.toString('utf8', o, o + Math.min(len, 2000)));
    o += len;
  }
  return params;
}

/** Reads a NUL-terminated string at `off`; returns it and the offset after the NUL. */
function cstr(buf: Buffer, off: number): [string, number] {
  const end = buf.indexOf(0, off);
  if (end < 0) return [buf.toString('utf8', off), buf.length];
  return [buf.toString('utf8', off, end), end + 1];
}

export async function startCommitProxy(opts: CommitProxyOptions): Promise<CommitProxy> {
  const host = opts.targetHost ?? '127.0.0.1';
  let p = opts.p;
  const cuts: CommitCut[] = [];
  const stats = { connections: 0, candidates: 0, opaque: 0 };
  const sockets = new Set<Socket>();

  const server: Server = createServer((client) => {
    const conn = ++stats.connections;
    const upstream = createConnection({ host, port: opts.targetPort });
    sockets.add(client);
    sockets.add(upstream);
    client.setNoDelay(true);
    upstream.setNoDelay(true);
    let closed = false;
    const closeBoth = () => {
      if (closed) return;
      closed = true;
      client.destroy();
      upstream.destroy();
    };
    client.on('error', closeBoth);
    upstream.on('error', closeBoth);
    client.on('close', () => {
      sockets.delete(client);
      upstream.end();
    });
    upstream.on('close', () => {
      sockets.delete(upstream);
      closeBoth();
    });

    // ---- client → server: forwarded at once, parsed on the side ----
    let cbuf: Buffer = Buffer.alloc(0);
    let startupDone = false;
    /** The server answers an SSL/GSS request with one untyped byte. */
    let expectEncByte = false;
    let opaque = false;
    const statements = new Map<string, string>();
    const portals = new Map<string, Run>();
    /** The statements run since the session was last idle: the current transaction's. */
    let txSql: Run[] = [];

    const onClientMessage = (type: string, body: Buffer) => {
      if (type === 'P') {
        const [name, o] = cstr(body, 0);
        const [text] = cstr(body, o);
        statements.set(name, text);
      } else if (type === 'B') {
        const [portal, o1] = cstr(body, 0);
        const [stmt, o2] = cstr(body, o1);
        portals.set(portal, { sql: statements.get(stmt) ?? '', params: bindParams(body, o2) });
      } else if (type === 'E') {
        const [portal] = cstr(body, 0);
        txSql.push(portals.get(portal) ?? { sql: '', params: [] });
      } else if (type === 'Q') {
        txSql.push({ sql: cstr(body, 0)[0], params: [] });
      } else if (type === 'C') {
        // Close of a statement ('S') or portal ('P').
        const kind = String.fromCharCode(body[0]!);
        const [name] = cstr(body, 1);
        (kind === 'S' ? statements : portals).delete(name);
      }
    };

    client.on('data', (chunk: Buffer) => {
      upstream.write(chunk);
      if (opaque) return;
      cbuf = cbuf.length === 0 ? chunk : Buffer.concat([cbuf, chunk]);
      for (;;) {
        if (!startupDone) {
          if (cbuf.length < 8) return;
          const len = cbuf.readInt32BE(0);
          if (cbuf.length < len) return;
          const code = cbuf.readInt32BE(4);
          cbuf = cbuf.subarray(len);
          if (code === SSL_REQUEST || code === GSSENC_REQUEST) expectEncByte = true;
          else if (code !== CANCEL_REQUEST) startupDone = true;
          continue;
        }
        if (cbuf.length < 5) return;
        const len = cbuf.readInt32BE(1);
        if (cbuf.length < 1 + len) return;
        onClientMessage(String.fromCharCode(cbuf[0]!), cbuf.subarray(5, 1 + len));
        cbuf = cbuf.subarray(1 + len);
      }
    });

    // ---- server → client: parsed into messages, held from CommandComplete to ReadyForQuery ----
    let sbuf: Buffer = Buffer.alloc(0);
    let held: Buffer[] = [];
    let holding = false;
    let lastTag = '';
    /** The CommandComplete tags since the session was last idle, one per statement of txSql. */
    let tags: string[] = [];
    let errorSeen = false;
    /** The session's status at the previous ReadyForQuery ('I' idle, 'T' in a transaction, 'E' failed one). */
    let prevStatus = 'I';

    const cut = (kind: CommitCut['kind'], run: Run) => {
      cuts.push({ at: Date.now(), conn, kind, sql: run.sql.replace(/\s+/g, ' ').trim().slice(0, 160), params: run.params });
      closed = true;
      held = [];
      client.resetAndDestroy();
      upstream.destroy();
    };

    const onReadyForQuery = (status: string, raw: Buffer): boolean => {
      const out = [...held, raw];
      held = [];
      holding = false;
      if (status === 'I') {
        const explicit = prevStatus !== 'I' && lastTag === 'COMMIT';
        const implicit = prevStatus === 'I' && !errorSeen && lastTag !== '';
        // A statement that matched but changed no row (a completion fenced off: tag `SELECT 0`) wrote nothing.
        const aligned = tags.length === txSql.length;
        const wrote = (i: number) => !aligned || !(Number(tags[i]!.split(' ').at(-1)) === 0);
        const matched = txSql.find((s, i) => opts.match.test(s.sql) && wrote(i));
        txSql = [];
        tags = [];
        errorSeen = false;
        lastTag = '';
        prevStatus = status;
        if ((explicit || implicit) && matched !== undefined) {
          stats.candidates++;
          if (Math.random() < p) {
            cut(explicit ? 'explicit' : 'implicit', matched);
            return false;
          }
        }
      } else {
        prevStatus = status;
      }
      client.write(Buffer.concat(out));
      return true;
    };

    upstream.on('data', (chunk: Buffer) => {
      if (closed) return;
      if (opaque) {
        client.write(chunk);
        return;
      }
      sbuf = sbuf.length === 0 ? chunk : Buffer.concat([sbuf, chunk]);
      const pass: Buffer[] = [];
      const flush = () => {
        if (pass.length > 0) client.write(Buffer.concat(pass.splice(0)));
      };
      for (;;) {
        if (expectEncByte) {
          if (sbuf.length < 1) break;
          const answer = String.fromCharCode(sbuf[0]!);
          pass.push(sbuf.subarray(0, 1));
          sbuf = sbuf.subarray(1);
          expectEncByte = false;
          if (answer !== 'N') {
            // Encrypted from here on: relay the rest untouched.
            opaque = true;
            stats.opaque++;
            pass.push(sbuf);
            sbuf = Buffer.alloc(0);
            break;
          }
          continue;
        }
        if (sbuf.length < 5) break;
        const len = sbuf.readInt32BE(1);
        if (sbuf.length < 1 + len) break;
        const type = String.fromCharCode(sbuf[0]!);
        const raw = sbuf.subarray(0, 1 + len);
        sbuf = sbuf.subarray(1 + len);
        if (type === 'C') {
          lastTag = cstr(raw, 5)[0];
          tags.push(lastTag);
          holding = true;
        } else if (type === 'E') {
          errorSeen = true;
        }
        if (type === 'Z') {
          flush();
          if (!onReadyForQuery(String.fromCharCode(raw[5]!), raw)) return;
        } else if (holding) {
          held.push(raw);
        } else {
          pass.push(raw);
        }
      }
      flush();
    });
  });

  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve());
  });
  const port = (server.address() as { port: number }).port;

  return {
    port,
    url(connectionString) {
      const u = new URL(connectionString);
      u.hostname = '127.0.0.1';
      u.port = String(port);
      return u.toString();
    },
    cuts,
    stats,
    setP(value) {
      p = value;
    },
    close() {
      for (const s of sockets) s.destroy();
      return new Promise((resolve) => server.close(() => resolve()));
    },
  };
}
