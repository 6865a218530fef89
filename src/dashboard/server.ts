/**
 * The dashboard's HTTP side: options, routing, and the listener. It is a
 * plain node:http request handler, so it can run on its own (`listen()`,
 * `pgasynq dash`) or be mounted in an existing server.
 *
 * Routes (all relative to `basePath`):
 *
 *   GET  /                          queues overview (?days=7|30|90 for the history chart)
 *   GET  /queues/:queue             a queue: ?state=…&page=…&size=…&group=…&search=…
 *   GET  /queues/:queue/tasks/:id   a task
 *   GET  /servers                   live servers and what they run
 *   GET  /schedulers                cron entries
 *   GET  /schedulers/:entry         an entry and its enqueue history (?page=)
 *   GET  /api/overview              JSON for the live chart (counts and samples; never payloads)
 *   GET  /metrics                   Prometheus text format
 *   GET  /assets/app.css, app.js    the stylesheet and script
 *   POST /action                    every action (see actions.ts); refused in read-only mode
 *
 * Every request passes security.ts's Host and token checks first; every
 * response carries its headers.
 */
import { createServer, type IncomingMessage, type Server as HttpServer, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { randomBytes } from 'node:crypto';
import type { ConnectionOptions } from '../internal/connection.js';
import { redact } from '../internal/redact.js';
import { ConfigError } from '../model/errors.js';
import { Inspector } from '../inspector.js';
import { resolveLogger, type Logger } from '../internal/logger.js';
import { BadActionError, confirmationFor, parseAction, runAction, type FormFields } from './actions.js';
import { CSS, etagOf, JS } from './assets.js';
import type { Html } from './html.js';
import { serveMetrics, type MetricFamily } from './metrics.js';
import { confirmPage, errorPage, overviewJson, overviewPage, statusOf, tokenPage, type PageContext, type PageResult } from './pages.js';
import { queuePage } from './queue-pages.js';
import { taskPage } from './task-page.js';
import { schedulerEntryPage, schedulersPage, serversPage } from './registry-pages.js';
import { QueueSampler } from './sampler.js';
import { allowedHostsOption, appendHeader, defaultAllowedHosts, Guard, localPath, setSecurityHeaders } from './security.js';

export const DASHBOARD_PORT_DEFAULT = 8080;
export const DASHBOARD_HOST_DEFAULT = '127.0.0.1';
export const DASHBOARD_REFRESH_DEFAULT_MS = 5000;
/** Largest form body an action may send (a selection of 1000 ids fits). */
const MAX_BODY_BYTES = 1_048_576;

/** Options of createDashboard(): the connection, and what the dashboard shows and allows. */
export interface DashboardOptions extends ConnectionOptions {
  /** Hide every action and refuse every POST with 403. @defaultValue false */
  readOnly?: boolean;
  /**
   * Require this token on every request: `Authorization: Bearer <token>`, or
   * the cookie set by opening `/?token=<token>` once. Visible ASCII, no spaces.
   * @defaultValue none (anyone who reaches the port gets in: keep it on 127.0.0.1)
   */
  token?: string;
  /** Never send payloads or results to the browser. @defaultValue false */
  hidePayloads?: boolean;
  /** Default auto-refresh interval in ms (each browser may pick another); 0 turns it off. @defaultValue 5000 */
  refreshInterval?: number;
  /**
   * Host names (without port: `dash.example.com`, `10.0.0.5`, `::1`) the Host
   * header may carry besides localhost, 127.0.0.1 and [::1], which are always
   * answered: the defence against DNS rebinding, where a web page you open
   * reaches the dashboard under a name of its own that resolves to this
   * machine. Any other Host gets 421. '*' answers to any Host: unsafe without
   * a token, since such a page can then read and act on your queues.
   * @defaultValue the address given to listen(); this machine's name (and
   * the address) when listen() binds every address (0.0.0.0, ::); this
   * machine's name when the handler is mounted in a server of yours.
   */
  allowedHosts?: readonly string[] | '*';
  /** Path prefix when the dashboard is mounted below the root of another server ('/admin/queues'). @defaultValue '' */
  basePath?: string;
  /** Families appended to /metrics, e.g. `() => serverMetrics(server)`. @defaultValue none */
  metricsExtra?: () => MetricFamily[] | Promise<MetricFamily[]>;
}

/** A running dashboard: a request handler with a listener of its own. */
export interface Dashboard {
  (req: IncomingMessage, res: ServerResponse): void;
  /** The Inspector every read and action goes through. */
  readonly inspector: Inspector;
  /** Starts an HTTP server on host:port (port 0: any free port); resolves once it listens, with the Host names it answers to. */
  listen(port?: number, host?: string): Promise<{ url: string; port: number; host: string; allowedHosts: readonly string[] | '*' }>;
  /** Stops the listener (if any) and closes the Inspector. */
  close(): Promise<void>;
}

interface Resolved {
  readOnly: boolean;
  token: string | undefined;
  hidePayloads: boolean;
  refreshMs: number;
  allowedHosts: readonly string[] | '*' | undefined;
  basePath: string;
}

function resolve(opts: DashboardOptions): Resolved {
  const bool = (v: unknown, name: string) => {
    if (v === undefined) return false;
    if (typeof v !== 'boolean') throw new ConfigError(name, 'must be a boolean');
    return v;
  };
  const token = opts.token;
  if (token !== undefined && (typeof token !== 'string' || !/^[\x21-\x7e]{1,512}$/.test(token))) {
    throw new ConfigError('token', 'must be 1–512 visible ASCII characters without spaces');
  }
  const refresh = opts.refreshInterval ?? DASHBOARD_REFRESH_DEFAULT_MS;
  if (typeof refresh !== 'number' || !Number.isInteger(refresh) || refresh < 0 || (refresh > 0 && refresh < 500) || refresh > 3_600_000) {
    throw new ConfigError('refreshInterval', 'must be 0 (off) or an integer number of ms from 500 to 3600000');
  }
  const base = opts.basePath ?? '';
  if (typeof base !== 'string' || (base !== '' && !/^(\/[A-Za-z0-9._~-]+)+$/.test(base))) {
    throw new ConfigError('basePath', "must be '' or a path like '/admin/queues' (no trailing slash)");
  }
  const hosts = opts.allowedHosts === undefined ? undefined : allowedHostsOption(opts.allowedHosts);
  return {
    readOnly: bool(opts.readOnly, 'readOnly'),
    token,
    hidePayloads: bool(opts.hidePayloads, 'hidePayloads'),
    refreshMs: refresh,
    allowedHosts: hosts,
    basePath: base,
  };
}

function readBody(req: IncomingMessage): Promise<string> {
  return new Promise((resolveBody, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on('data', (c: Buffer) => {
      size += c.length;
      if (size > MAX_BODY_BYTES) {
        reject(Object.assign(new Error('request body too large'), { status: 413 }));
        req.destroy();
        return;
      }
      chunks.push(c);
    });
    req.on('end', () => resolveBody(Buffer.concat(chunks).toString('utf8')));
    req.on('error', reject);
  });
}

function formFields(body: string): FormFields {
  const out = Object.create(null) as FormFields;
  for (const [k, v] of new URLSearchParams(body)) (out[k] ??= []).push(v);
  return out;
}

/**
 * Builds the dashboard over an Inspector on the given connection. Use it as
 * a request handler, or call `listen()`; `close()` ends both.
 *
 * @example
 * const dash = createDashboard({ connectionString: process.env.DATABASE_URL, readOnly: true });
 * const { url } = await dash.listen(8080);            // 127.0.0.1 by default
 * // or: http.createServer(dash).listen(8080, '127.0.0.1');
 */
export function createDashboard(opts: DashboardOptions = {}): Dashboard {
  const cfg = resolve(opts);
  const { readOnly: _r, token: _t, hidePayloads: _h, refreshInterval: _i, allowedHosts: _a, basePath: _b, metricsExtra, ...conn } = opts;
  const root = resolveLogger(conn);
  const { logLevel: _level, ...connection } = conn;
  const inspector = new Inspector({ ...connection, logger: root });
  const sampler = new QueueSampler(inspector);
  const log: Logger = root.child({ component: 'dashboard' });
  // Mounted in a server of yours, the dashboard cannot know the address: listen() narrows this to the one it binds.
  const guard = new Guard({ token: cfg.token, allowedHosts: cfg.allowedHosts ?? defaultAllowedHosts(undefined), cookiePath: cfg.basePath || '/' });
  const flashes = new Map<string, { ok: boolean; message: string; at: number }>();
  let server: HttpServer | undefined;
  const chrome = { base: cfg.basePath, readOnly: cfg.readOnly, refreshMs: cfg.refreshMs };

  function send(req: IncomingMessage, res: ServerResponse, status: number, type: string, body: string | Html): void {
    res.statusCode = status;
    res.setHeader('Content-Type', type);
    res.end(req.method === 'HEAD' ? undefined : String(body));
  }

  function sendError(req: IncomingMessage, res: ServerResponse, status: number, message: string): void {
    send(req, res, status, 'text/html; charset=utf-8', errorPage(chrome, status, message));
  }

  function redirect(res: ServerResponse, location: string): void {
    res.statusCode = 303;
    res.setHeader('Location', location);
    res.end();
  }

  function pageContext(req: IncomingMessage, res: ServerResponse, url: URL): PageContext {
    const flashId = url.searchParams.get('flash');
    const flash = flashId === null ? undefined : flashes.get(flashId);
    return {
      inspector,
      sampler,
      readOnly: cfg.readOnly,
      hidePayloads: cfg.hidePayloads,
      refreshMs: cfg.refreshMs,
      csrf: guard.csrfToken(req, res),
      base: cfg.basePath,
      url,
      flash,
    };
  }

  function addFlash(ok: boolean, message: string): string {
    const now = Date.now();
    for (const [k, f] of flashes) if (now - f.at > 120_000 || flashes.size > 200) flashes.delete(k);
    const id = randomBytes(9).toString('base64url');
    flashes.set(id, { ok, message, at: now });
    return id;
  }

  async function page(req: IncomingMessage, res: ServerResponse, url: URL, render: (ctx: PageContext) => Promise<PageResult>): Promise<void> {
    const ctx = pageContext(req, res, url);
    const r = await render(ctx);
    if ('redirect' in r) return redirect(res, cfg.basePath + r.redirect);
    send(req, res, r.status, 'text/html; charset=utf-8', r.body);
  }

  function asset(req: IncomingMessage, res: ServerResponse, body: string, type: string, etag: string): void {
    res.setHeader('Cache-Control', 'no-cache');
    res.setHeader('ETag', etag);
    if (req.headers['if-none-match'] === etag) {
      res.statusCode = 304;
      res.end();
      return;
    }
    send(req, res, 200, type, body);
  }
  const cssTag = etagOf(CSS);
  const jsTag = etagOf(JS);

  async function action(req: IncomingMessage, res: ServerResponse, url: URL): Promise<void> {
    if (!guard.sameOrigin(req)) return sendError(req, res, 403, 'Refused: the request did not come from a page of this dashboard (Origin check).');
    const type = (req.headers['content-type'] ?? '').split(';')[0]?.trim().toLowerCase();
    if (type !== 'application/x-www-form-urlencoded') return sendError(req, res, 415, 'Actions take an application/x-www-form-urlencoded form.');
    const fields = formFields(await readBody(req));
    if (!guard.csrfValid(req, fields.csrf?.[0])) return sendError(req, res, 403, 'Refused: missing or stale CSRF token. Reload the page and try again.');
    let a;
    try {
      a = parseAction(fields);
    } catch (err) {
      if (err instanceof BadActionError) return sendError(req, res, 400, err.message);
      throw err;
    }
    const question = confirmationFor(a);
    if (question !== undefined && fields.confirmed?.[0] !== '1') {
      return send(req, res, 200, 'text/html; charset=utf-8', confirmPage(pageContext(req, res, url), fields, question));
    }
    const outcome = await runAction(inspector, a);
    sampler.invalidate();
    log.info({ action: a.kind === 'queue' ? a.op : `${a.op}:${a.scope}`, queue: a.queue, ok: outcome.ok }, 'dashboard action');
    const back = new URL(localPath(fields.back?.[0]), 'http://dashboard.invalid');
    back.searchParams.set('flash', addFlash(outcome.ok, outcome.message));
    redirect(res, cfg.basePath + back.pathname + back.search);
  }

  async function route(req: IncomingMessage, res: ServerResponse, url: URL, path: string): Promise<void> {
    const method = req.method ?? 'GET';
    if (method === 'POST') {
      if (cfg.readOnly) return sendError(req, res, 403, 'This dashboard is read-only.');
      if (path === '/action') return action(req, res, url);
      return sendError(req, res, 404, 'No such page.');
    }
    if (method !== 'GET' && method !== 'HEAD') {
      res.setHeader('Allow', cfg.readOnly ? 'GET, HEAD' : 'GET, HEAD, POST');
      return sendError(req, res, 405, `${method} is not allowed.`);
    }
    const seg = path
      .split('/')
      .slice(1)
      .map((s) => decodeURIComponent(s));
    if (path === '/') return page(req, res, url, overviewPage);
    if (path === '/assets/app.css') return asset(req, res, CSS, 'text/css; charset=utf-8', cssTag);
    if (path === '/assets/app.js') return asset(req, res, JS, 'text/javascript; charset=utf-8', jsTag);
    if (path === '/metrics') return serveMetrics(inspector, metricsExtra, req, res);
    if (path === '/api/overview') return send(req, res, 200, 'application/json; charset=utf-8', JSON.stringify(await overviewJson({ sampler })));
    if (path === '/servers') return page(req, res, url, serversPage);
    if (path === '/schedulers') return page(req, res, url, schedulersPage);
    if (path === '/favicon.ico') {
      res.statusCode = 204;
      return void res.end();
    }
    if (seg[0] === 'schedulers' && seg.length === 2 && seg[1]) return page(req, res, url, (ctx) => schedulerEntryPage(ctx, seg[1] as string));
    if (seg[0] === 'queues' && seg.length === 2 && seg[1]) return page(req, res, url, (ctx) => queuePage(ctx, seg[1] as string));
    if (seg[0] === 'queues' && seg.length === 4 && seg[1] && seg[2] === 'tasks' && seg[3]) {
      return page(req, res, url, (ctx) => taskPage(ctx, seg[1] as string, seg[3] as string));
    }
    return sendError(req, res, 404, 'No such page.');
  }

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    setSecurityHeaders(res);
    let url: URL;
    try {
      url = new URL(req.url ?? '/', 'http://dashboard.invalid');
    } catch {
      return sendError(req, res, 400, 'Bad URL.');
    }
    if (!guard.hostAllowed(req)) {
      res.statusCode = 421;
      res.setHeader('Content-Type', 'text/plain; charset=utf-8');
      return void res.end('This dashboard does not answer to that Host name: add it with --allowed-hosts (pgasynq dash) or the allowedHosts option.\n');
    }
    const auth = guard.authenticate(req, url);
    if (!auth.ok) {
      res.setHeader('WWW-Authenticate', 'Bearer realm="pgasynq"');
      return send(req, res, 401, 'text/html; charset=utf-8', tokenPage());
    }
    let path = url.pathname;
    if (cfg.basePath !== '' && (path === cfg.basePath || path.startsWith(`${cfg.basePath}/`))) path = path.slice(cfg.basePath.length) || '/';
    if ('setCookieAndRedirect' in auth) {
      appendHeader(res, 'Set-Cookie', guard.authCookie());
      // The token leaves the URL (history, Referer); the cookie carries the session.
      return redirect(res, cfg.basePath + localPath(path + url.search));
    }
    // Pages address themselves without the base path.
    const local = new URL(path + url.search, 'http://dashboard.invalid');
    try {
      await route(req, res, local, path);
    } catch (err) {
      if (res.headersSent) return void res.destroy();
      const status = (err as { status?: number }).status ?? (err instanceof URIError ? 400 : statusOf(err));
      if (status >= 500) log.error({ err }, 'dashboard request failed');
      const message = err instanceof Error ? err.message : String(err);
      sendError(req, res, status, redact(message));
    }
  }

  const dashboard = ((req: IncomingMessage, res: ServerResponse) => {
    void handle(req, res);
  }) as Dashboard;
  Object.defineProperty(dashboard, 'inspector', { value: inspector, enumerable: true });
  dashboard.listen = (port = DASHBOARD_PORT_DEFAULT, host = DASHBOARD_HOST_DEFAULT) =>
    new Promise((resolveListen, reject) => {
      if (server) return reject(new ConfigError('listen', 'was already called'));
      if (cfg.allowedHosts === undefined) guard.setAllowedHosts(defaultAllowedHosts(host));
      const srv = createServer(dashboard);
      srv.once('error', (err) => {
        server = undefined;
        reject(err);
      });
      srv.listen(port, host, () => {
        server = srv;
        const addr = srv.address() as AddressInfo;
        const shown = addr.family === 'IPv6' || host.includes(':') ? `[${host.replace(/^\[|\]$/g, '')}]` : host;
        resolveListen({ url: `http://${shown}:${addr.port}${cfg.basePath}/`, port: addr.port, host, allowedHosts: guard.allowedHosts });
      });
    });
  dashboard.close = async () => {
    const srv = server;
    server = undefined;
    if (srv) {
      await new Promise<void>((r) => {
        srv.close(() => r());
        srv.closeAllConnections();
      });
    }
    await inspector.close();
  };
  return dashboard;
}
