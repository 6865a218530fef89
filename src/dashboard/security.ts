/**
 * The dashboard's defences, in the order a request meets them:
 *
 *   1. Host check: the Host header must name this server (by default, when
 *      bound to a loopback address, only localhost / 127.0.0.1 / [::1]), so a
 *      web page cannot reach a local dashboard by DNS rebinding.
 *   2. Token (when configured): `Authorization: Bearer <token>`, or the cookie
 *      that visiting `/?token=<token>` once sets (HttpOnly, SameSite=Strict;
 *      it holds a hash of the token, and the token is removed from the URL by
 *      a redirect). Compared in constant time.
 *   3. Read-only: every POST is refused (403) before anything else is read.
 *   4. Actions are POSTs only, and each must pass an Origin check (Origin, or
 *      Referer when a browser sends no Origin, must be this Host) and carry a
 *      CSRF token: an HMAC, under a secret drawn at start, of a random
 *      HttpOnly SameSite=Strict cookie (signed double submit, so a cookie
 *      planted by a sibling site does not help without the secret).
 *   5. Every response carries a strict Content-Security-Policy (no inline
 *      script or style, nothing from elsewhere, no framing), nosniff, a
 *      same-origin Referrer-Policy and no-store caching.
 */
import { createHash, createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';

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

/** Host names a dashboard bound to a loopback address answers to. */
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

/** The hostname part of a Host header ("[::1]:8080" → "[::1]", "Example.com:80" → "example.com"). */
export function hostnameOf(host: string): string {
  const h = host.trim().toLowerCase();
  if (h.startsWith('[')) {
    const end = h.indexOf(']');
    return end < 0 ? h : h.slice(0, end + 1);
  }
  const colon = h.lastIndexOf(':');
  return colon < 0 ? h : h.slice(0, colon);
}

/** True for an address that only this machine can reach. */
export function isLoopback(host: string): boolean {
  const h = host.replace(/^\[|\]$/g, '').toLowerCase();
  return h === 'localhost' || h === '::1' || /^127\.\d+\.\d+\.\d+$/.test(h);
}

export interface GuardOptions {
  token: string | undefined;
  /** Host names (no port) the dashboard answers to, or '*' for any. */
  allowedHosts: readonly string[] | '*';
  /** Path the cookies are scoped to. */
  cookiePath: string;
}

/** Outcome of the token check. */
export type AuthResult = { ok: true } | { ok: false; status: 401 } | { ok: true; setCookieAndRedirect: true };

/** Host, token, Origin and CSRF checks for one dashboard; its CSRF secret is drawn at construction. */
export class Guard {
  readonly #secret = randomBytes(32);
  readonly #tokenHash: string | undefined;
  #allowedHosts: readonly string[] | '*';
  readonly #cookiePath: string;

  constructor(opts: GuardOptions) {
    this.#tokenHash = opts.token === undefined ? undefined : createHash('sha256').update(`pgasynq-dashboard:${opts.token}`).digest('hex');
    this.#allowedHosts = opts.allowedHosts === '*' ? '*' : opts.allowedHosts.map((h) => h.toLowerCase());
    this.#cookiePath = opts.cookiePath;
  }

  get tokenRequired(): boolean {
    return this.#tokenHash !== undefined;
  }

  /** Changes the allowed hosts (listen() narrows them to loopback names when it binds to loopback). */
  setAllowedHosts(hosts: readonly string[] | '*'): void {
    this.#allowedHosts = hosts === '*' ? '*' : hosts.map((h) => h.toLowerCase());
  }

  /** The Host header names this server (DNS-rebinding defence). */
  hostAllowed(req: IncomingMessage): boolean {
    if (this.#allowedHosts === '*') return true;
    const host = req.headers.host;
    if (host === undefined || host === '') return false;
    return this.#allowedHosts.includes(hostnameOf(host));
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
    if (cookie !== undefined && safeEqual(cookie, expected)) return { ok: true };
    return { ok: false, status: 401 };
  }

  #hash(token: string): string {
    return createHash('sha256').update(`pgasynq-dashboard:${token}`).digest('hex');
  }

  /** The Set-Cookie value that lets a browser in after `/?token=`. */
  authCookie(): string {
    return `${AUTH_COOKIE}=${this.#tokenHash ?? ''}; Path=${this.#cookiePath}; HttpOnly; SameSite=Strict`;
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

/** Adds a header value without dropping the ones already set (several Set-Cookie). */
export function appendHeader(res: ServerResponse, name: string, value: string): void {
  const prev = res.getHeader(name);
  if (prev === undefined) res.setHeader(name, value);
  else res.setHeader(name, [...(Array.isArray(prev) ? prev : [String(prev)]), value]);
}
