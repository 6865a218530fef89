/**
 * The dashboard's defences, in the order a request meets them:
 *
 *   1. Host check: the Host header must name this dashboard, so a web page
 *      cannot reach it by DNS rebinding (a name of the attacker's that
 *      resolves to this machine). Always allowed: localhost, 127.0.0.1,
 *      [::1] (only a page of this machine can send those). Besides them, by
 *      default, the name it listens on, or this machine's name (and the
 *      wildcard address) when it listens on every address or is mounted in a
 *      server of yours; `allowedHosts` replaces that with a list, or '*' for
 *      any Host (unsafe without a token). A refused Host gets 421 before
 *      anything else is read.
 *   2. Token (when configured): `Authorization: Bearer <token>`, or the session
 *      cookie that visiting `/?token=<token>` once sets (HttpOnly,
 *      SameSite=Strict), after which a redirect takes the token out of the
 *      URL. The cookie is a random session id with an HMAC under a key drawn
 *      at start: not a function of the token, different on every login, and
 *      worthless to any other dashboard process. Compared in constant time.
 *   3. Read-only: every POST is refused (403) before anything else is read.
 *   4. Actions are POSTs only, and each must pass an Origin check (Origin, or
 *      Referer when a browser sends no Origin, must be this Host) and carry a
 *      CSRF token: an HMAC, under a secret drawn at start, of a random
 *      HttpOnly SameSite=Strict cookie (signed double submit, so a cookie
 *      planted by a sibling site does not help without the secret).
 *   5. Redirects (after the token login, after an action) go only to a path
 *      of this site: the target is normalised first, then checked.
 *   6. Every response carries a strict Content-Security-Policy (no inline
 *      script or style, nothing from elsewhere, no framing), nosniff, a
 *      same-origin Referrer-Policy and no-store caching.
 */
import { createHash, createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { isIPv6 } from 'node:net';
import { hostname } from 'node:os';
import { ConfigError } from '../model/errors.js';

/** The Content-Security-Policy of every response: only this origin, no inline code, no frames. */
export const CONTENT_SECURITY_POLICY = [
  "default-src 'self'",
  "script-src 'self'",
  "style-src 'self'",
  "img-src 'self'",
  "connect-src 'self'",
  "font-src 'self'",
  "object-src 'none'",
  "base-uri 'none'",
  "form-action 'self'",
  "frame-ancestors 'none'",
].join('; ');

/** Host names every dashboard answers to: only a page of this machine can send them. */
export const LOOPBACK_HOSTS: readonly string[] = ['localhost', '127.0.0.1', '[::1]'];

const AUTH_COOKIE = 'pgasynq_auth';
const CSRF_COOKIE = 'pgasynq_csrf';

/** Sets the headers every response carries. */
export function setSecurityHeaders(res: ServerResponse): void {
  res.setHeader('Content-Security-Policy', CONTENT_SECURITY_POLICY);
  res.setHeader('X-Content-Type-Options', 'nosniff');
  res.setHeader('X-Frame-Options', 'DENY');
  res.setHeader('Referrer-Policy', 'same-origin');
  res.setHeader('Cross-Origin-Opener-Policy', 'same-origin');
  res.setHeader('Cross-Origin-Resource-Policy', 'same-origin');
  res.setHeader('Permissions-Policy', 'camera=(), microphone=(), geolocation=()');
  res.setHeader('Cache-Control', 'no-store');
}

/** Cookies of a request, by name (the first of a name wins). */
export function parseCookies(req: IncomingMessage): Map<string, string> {
  const out = new Map<string, string>();
  const header = req.headers.cookie;
  if (header === undefined) return out;
  for (const pair of header.split(';')) {
    const eq = pair.indexOf('=');
    if (eq < 0) continue;
    const name = pair.slice(0, eq).trim();
    if (out.has(name)) continue;
    let value = pair.slice(eq + 1).trim();
    try {
      value = decodeURIComponent(value);
    } catch {
      // keep it as sent
    }
    out.set(name, value);
  }
  return out;
}

/** Equal strings, compared in time that does not depend on where they differ. */
export function safeEqual(a: string, b: string): boolean {
  const ha = createHash('sha256').update(a).digest();
  const hb = createHash('sha256').update(b).digest();
  return timingSafeEqual(ha, hb) && a.length === b.length;
}

/** The hostname part of a Host header, lower case, without a final dot ("[::1]:8080" → "[::1]", "Example.com.:80" → "example.com"). */
export function hostnameOf(host: string): string {
  const h = host.trim().toLowerCase();
  if (h.startsWith('[')) {
    const end = h.indexOf(']');
    return end < 0 ? h : h.slice(0, end + 1);
  }
  const colon = h.lastIndexOf(':');
  return (colon < 0 ? h : h.slice(0, colon)).replace(/\.$/, '');
}

/** True for an address that only this machine can reach. */
export function isLoopback(host: string): boolean {
  const h = host.replace(/^\[|\]$/g, '').toLowerCase();
  return h === 'localhost' || h === '::1' || /^127\.\d+\.\d+\.\d+$/.test(h);
}

/** True for an address that means every interface ("0.0.0.0", "::"). */
export function isWildcard(host: string): boolean {
  const h = host.replace(/^\[|\]$/g, '');
  return h === '' || h === '0.0.0.0' || /^[0:]+$/.test(h);
}

/** A DNS name (underscores too: container names) or an IPv4 address. */
const HOST_NAME = /^(?:[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?)(?:\.[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?)*$/;

/** A host name as normalHost() writes it: a DNS name, an IPv4 address, or an IPv6 address in brackets. */
function validHost(name: string): boolean {
  return name.startsWith('[') ? name.endsWith(']') && isIPv6(name.slice(1, -1)) : name.length <= 253 && HOST_NAME.test(name);
}

/** A host name as a Host header carries it: lower case, no final dot, an IPv6 address in brackets. */
function normalHost(name: string): string {
  const h = name.trim().toLowerCase().replace(/\.$/, '');
  return h.includes(':') && !h.startsWith('[') ? `[${h}]` : h;
}

/**
 * Checks the `allowedHosts` option: '*', or a non-empty array of host names
 * without port or scheme. Returns the names as Host headers carry them.
 */
export function allowedHostsOption(value: unknown, field = 'allowedHosts'): readonly string[] | '*' {
  if (value === '*') return '*';
  if (!Array.isArray(value) || value.length === 0) throw new ConfigError(field, "must be '*' or a non-empty array of host names");
  return value.map((h: unknown, i) => {
    const name = typeof h === 'string' ? normalHost(h) : '';
    if (!validHost(name)) {
      throw new ConfigError(
        `${field}[${i}]`,
        `must be a host name or IP address without port or scheme, like dash.example.com or 10.0.0.5 (got ${typeof h === 'string' ? JSON.stringify(h.slice(0, 100)) : typeof h})`,
      );
    }
    return name;
  });
}

/**
 * The Host names a dashboard answers to besides the loopback ones when
 * `allowedHosts` is not set: the name it listens on; this machine's name and
 * the wildcard address when it listens on every address, or is mounted in a
 * server of yours (undefined). IP addresses cannot be rebound: only a
 * machine's own pages can name them in a Host header.
 */
export function defaultAllowedHosts(bound: string | undefined): readonly string[] {
  const names = bound === undefined ? [hostname()] : isWildcard(bound) ? [hostname(), bound] : [bound];
  return [...new Set([...LOOPBACK_HOSTS, ...names.map(normalHost)])];
}

export interface GuardOptions {
  token: string | undefined;
  /** Host names (no port) the dashboard answers to besides LOOPBACK_HOSTS, or '*' for any. */
  allowedHosts: readonly string[] | '*';
  /** Path the cookies are scoped to. */
  cookiePath: string;
}

/** What a session cookie holds: a random id, a dot, and its HMAC. */
const SESSION = /^([A-Za-z0-9_-]{32})\.([A-Za-z0-9_-]{43})$/;

/** Outcome of the token check. */
export type AuthResult = { ok: true } | { ok: false; status: 401 } | { ok: true; setCookieAndRedirect: true };

/** Host, token, Origin and CSRF checks for one dashboard; its CSRF secret is drawn at construction. */
export class Guard {
  /** Signs CSRF cookies. */
  readonly #secret = randomBytes(32);
  /** Signs session ids: a different key, so a CSRF token can never pass for a session. */
  readonly #sessionKey = randomBytes(32);
  readonly #tokenHash: string | undefined;
  #allowedHosts: ReadonlySet<string> | '*';
  readonly #cookiePath: string;

  constructor(opts: GuardOptions) {
    this.#tokenHash = opts.token === undefined ? undefined : this.#hash(opts.token);
    this.#allowedHosts = Guard.#hostSet(opts.allowedHosts);
    this.#cookiePath = opts.cookiePath;
  }

  static #hostSet(hosts: readonly string[] | '*'): ReadonlySet<string> | '*' {
    return hosts === '*' ? '*' : new Set([...LOOPBACK_HOSTS, ...hosts.map(normalHost)]);
  }

  get tokenRequired(): boolean {
    return this.#tokenHash !== undefined;
  }

  /** The Host names answered to, the loopback ones first, or '*'. */
  get allowedHosts(): readonly string[] | '*' {
    return this.#allowedHosts === '*' ? '*' : [...this.#allowedHosts];
  }

  /** Changes the allowed hosts (listen() sets the defaults for the address it binds). */
  setAllowedHosts(hosts: readonly string[] | '*'): void {
    this.#allowedHosts = Guard.#hostSet(hosts);
  }

  /** The Host header names this server (DNS-rebinding defence). */
  hostAllowed(req: IncomingMessage): boolean {
    if (this.#allowedHosts === '*') return true;
    const host = req.headers.host;
    if (host === undefined || host === '') return false;
    return this.#allowedHosts.has(hostnameOf(host));
  }

  /**
   * The token check. A matching `?token=` on a GET answers with the cookie
   * and a redirect to the same URL without the token.
   */
  authenticate(req: IncomingMessage, url: URL): AuthResult {
    const expected = this.#tokenHash;
    if (expected === undefined) return { ok: true };
    const auth = req.headers.authorization;
    if (auth !== undefined) {
      const m = /^Bearer\s+(\S+)\s*$/i.exec(auth);
      if (m && safeEqual(this.#hash(m[1] as string), expected)) return { ok: true };
      return { ok: false, status: 401 };
    }
    const cookie = parseCookies(req).get(AUTH_COOKIE);
    const fromQuery = url.searchParams.get('token');
    if (fromQuery !== null && (req.method === 'GET' || req.method === 'HEAD')) {
      if (!safeEqual(this.#hash(fromQuery), expected)) return { ok: false, status: 401 };
      url.searchParams.delete('token');
      return { ok: true, setCookieAndRedirect: true };
    }
    if (cookie !== undefined && this.#validSession(cookie)) return { ok: true };
    return { ok: false, status: 401 };
  }

  #hash(token: string): string {
    return createHash('sha256').update(`pgasynq-dashboard:${token}`).digest('hex');
  }

  #sessionMac(id: string): string {
    return createHmac('sha256', this.#sessionKey).update(`session:${id}`).digest('base64url');
  }

  #validSession(cookie: string): boolean {
    const m = SESSION.exec(cookie);
    return m !== null && safeEqual(this.#sessionMac(m[1] as string), m[2] as string);
  }

  /**
   * The Set-Cookie value that lets a browser in after `/?token=`: a new
   * session id each time, signed, so the cookie says nothing about the token
   * and dies with this process (restart it to end every session).
   */
  authCookie(): string {
    const id = randomBytes(24).toString('base64url');
    return `${AUTH_COOKIE}=${id}.${this.#sessionMac(id)}; Path=${this.#cookiePath}; HttpOnly; SameSite=Strict`;
  }

  /**
   * The CSRF token to put in this response's forms. Sets the CSRF cookie
   * when the request has none.
   */
  csrfToken(req: IncomingMessage, res: ServerResponse): string {
    let cookie = parseCookies(req).get(CSRF_COOKIE);
    if (cookie === undefined || !/^[A-Za-z0-9_-]{20,100}$/.test(cookie)) {
      cookie = randomBytes(24).toString('base64url');
      appendHeader(res, 'Set-Cookie', `${CSRF_COOKIE}=${cookie}; Path=${this.#cookiePath}; HttpOnly; SameSite=Strict`);
    }
    return this.#sign(cookie);
  }

  #sign(cookie: string): string {
    return createHmac('sha256', this.#secret).update(cookie).digest('base64url');
  }

  /** The form's CSRF field matches the request's cookie. */
  csrfValid(req: IncomingMessage, field: string | undefined): boolean {
    const cookie = parseCookies(req).get(CSRF_COOKIE);
    if (cookie === undefined || field === undefined || field === '') return false;
    return safeEqual(this.#sign(cookie), field);
  }

  /**
   * The request comes from a page of this dashboard: its Origin (or, without
   * one, its Referer) has the request's own Host. A request with neither is
   * refused: every browser that runs the dashboard sends Origin on a POST.
   */
  sameOrigin(req: IncomingMessage): boolean {
    const host = req.headers.host;
    if (host === undefined || host === '') return false;
    const origin = req.headers.origin ?? req.headers.referer;
    if (origin === undefined || origin === '' || origin === 'null') return false;
    try {
      const u = new URL(origin);
      return (u.protocol === 'http:' || u.protocol === 'https:') && u.host.toLowerCase() === host.toLowerCase();
    } catch {
      return false;
    }
  }
}

/**
 * A place of this site to redirect to, from a path a request supplied (the
 * page of a token login, an action's `back`): normalised first, as a browser
 * would ("/.//evil.example/" becomes "//evil.example/", which a browser reads
 * as another site), then kept only if it is still a path of this origin that
 * starts with a single "/". Anything else is "/".
 */
export function localPath(target: string | undefined): string {
  // Control characters and backslashes are exactly what a redirect target must not hold.
  // eslint-disable-next-line no-control-regex
  if (target === undefined || !target.startsWith('/') || /[\u0000-\u001f\u007f\\]/.test(target)) return '/';
  const base = 'http://dashboard.invalid';
  let u: URL;
  try {
    u = new URL(target, base);
  } catch {
    return '/';
  }
  const path = u.pathname + u.search;
  return u.origin !== base || path.startsWith('//') || path.startsWith('/\\') ? '/' : path;
}

/** Adds a header value without dropping the ones already set (several Set-Cookie). */
export function appendHeader(res: ServerResponse, name: string, value: string): void {
  const prev = res.getHeader(name);
  if (prev === undefined) res.setHeader(name, value);
  else res.setHeader(name, [...(Array.isArray(prev) ? prev : [String(prev)]), value]);
}
