/**
 * The dashboard's defences, over HTTP: security headers, the Host check (DNS
 * rebinding, allowedHosts), actions behind Origin and CSRF, read-only, the
 * token and its session cookie, and redirects that stay on the dashboard.
 */
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { hostname } from 'node:os';
import { describe } from 'node:test';
import { ConfigError, Task, createDashboard } from '../src/index.js';
import { FORM, TOKEN, cookiesOf, form, http, session, setupDashboard } from './dashboard-kit.js';
import { test } from './helpers.js';

const { client, inspector, conn, port, seeded } = setupDashboard('t_dashboard_http_security');

describe('HTTP', () => {
  test('pages answer 200 with the security headers; unknown things 404, bad names 400', async () => {
    for (const path of [
      '/',
      '/queues/default',
      '/queues/critical?state=retry',
      '/queues/low/tasks/xss',
      '/queues/flow?state=waiting',
      '/queues/flow/tasks/b',
      '/servers',
      '/schedulers',
      `/schedulers/${seeded.entryId}`,
      '/api/overview',
      '/metrics',
    ]) {
      const r = await http(port.dash, 'GET', path);
      assert.equal(r.status, 200, `${path}: ${r.body.slice(0, 300)}`);
      const csp = String(r.headers['content-security-policy']);
      assert.match(csp, /default-src 'self'/);
      assert.match(csp, /script-src 'self'/);
      assert.match(csp, /frame-ancestors 'none'/);
      assert.doesNotMatch(csp, /unsafe-inline|unsafe-eval|\*/);
      assert.equal(r.headers['x-content-type-options'], 'nosniff');
      assert.equal(r.headers['referrer-policy'], 'same-origin');
      assert.equal(r.headers['x-frame-options'], 'DENY');
      assert.equal(r.headers['cache-control'], 'no-store');
    }
    const html = await http(port.dash, 'GET', '/');
    assert.doesNotMatch(
      html.body.replace(/<script src="[^"]+" defer><\/script>|<script type="application\/json" id="live-data">[^<]*<\/script>/g, ''),
      /<script|style=/i,
      'no inline script or style',
    );
    assert.equal((await http(port.dash, 'GET', '/queues/nope')).status, 404);
    assert.equal((await http(port.dash, 'GET', '/queues/default/tasks/nope')).status, 404);
    assert.equal((await http(port.dash, 'GET', '/queues/bad%20name')).status, 400);
    assert.equal((await http(port.dash, 'GET', '/queues/%E0%A4%A')).status, 400);
    assert.equal((await http(port.dash, 'GET', '/no/such/page')).status, 404);
    assert.equal((await http(port.dash, 'PUT', '/')).status, 405);
    const js = await http(port.dash, 'GET', '/assets/app.js');
    assert.equal(js.status, 200);
    assert.match(String(js.headers['content-type']), /^text\/javascript/);
    assert.equal((await http(port.dash, 'GET', '/assets/app.js', { 'if-none-match': String(js.headers.etag) })).status, 304);
  });

  test('a Host that is not this server is refused (DNS rebinding)', async () => {
    assert.equal((await http(port.dash, 'GET', '/', { host: 'evil.example:80' })).status, 421);
    assert.equal((await http(port.dash, 'GET', '/', { host: `localhost:${port.dash}` })).status, 200);
  });

  test('actions: POST with Origin and CSRF token only; refusals change nothing', async () => {
    const { cookie, csrf } = await session(port.dash);
    const origin = `http://127.0.0.1:${port.dash}`;
    const pause = form({ csrf, do: 'pause', queue: 'cron', confirmed: '1', back: '/' });
    const post = (headers: Record<string, string>, body = pause) => http(port.dash, 'POST', '/action', { 'content-type': FORM, ...headers }, body);

    assert.equal((await post({ cookie })).status, 403, 'no Origin, no Referer');
    assert.equal((await post({ cookie, origin: 'http://evil.example' })).status, 403, 'foreign Origin');
    assert.equal((await post({ cookie, origin: 'null' })).status, 403, 'opaque Origin');
    assert.equal((await post({ cookie, referer: 'http://evil.example/x' })).status, 403, 'foreign Referer');
    assert.equal((await post({ origin }, pause)).status, 403, 'no CSRF cookie');
    assert.equal((await post({ cookie, origin }, form({ do: 'pause', queue: 'cron', confirmed: '1' }))).status, 403, 'no CSRF field');
    assert.equal((await post({ cookie, origin }, form({ csrf: `${csrf}x`, do: 'pause', queue: 'cron', confirmed: '1' }))).status, 403, 'wrong CSRF field');
    const other = await session(port.dash);
    assert.equal((await post({ cookie: other.cookie, origin })).status, 403, "another session's cookie");
    assert.equal((await post({ cookie, origin, 'content-type': 'application/json' }, JSON.stringify({ csrf, do: 'pause' }))).status, 415);
    assert.equal((await inspector.getQueueInfo('cron')).paused, false, 'nothing was paused');

    // Without confirmed=1 a destructive action answers with a confirmation page and does nothing.
    const ask = await post({ cookie, origin }, form({ csrf, do: 'pause', queue: 'cron', back: '/' }));
    assert.equal(ask.status, 200);
    assert.match(ask.body, /Pause queue cron\?/);
    assert.equal((await inspector.getQueueInfo('cron')).paused, false);

    const ok = await post({ cookie, origin });
    assert.equal(ok.status, 303, ok.body);
    assert.match(String(ok.headers.location), /^\/\?flash=/);
    assert.equal((await inspector.getQueueInfo('cron')).paused, true);
    const viaReferer = await post({ cookie, referer: `${origin}/queues/cron` }, form({ csrf, do: 'resume', queue: 'cron', back: '//evil.example/' }));
    assert.equal(viaReferer.status, 303);
    assert.match(String(viaReferer.headers.location), /^\/\?flash=/, 'an off-site back target becomes /');
    assert.equal((await inspector.getQueueInfo('cron')).paused, false);

    const bad = await post({ cookie, origin }, form({ csrf, do: 'run:all', queue: 'cron', state: 'pending', confirmed: '1' }));
    assert.equal(bad.status, 400, 'run is not an action for pending tasks');
    assert.equal((await http(port.dash, 'GET', '/action')).status, 404, 'actions are POST only');
  });

  test('read-only: no action is rendered, every POST is 403', async () => {
    const page = await http(port.ro, 'GET', '/queues/critical?state=retry');
    assert.equal(page.status, 200);
    assert.doesNotMatch(page.body, /<form method="post"|name="do"/);
    assert.match(page.body, /read-only/);
    const { csrf } = await session(port.dash);
    const r = await http(
      port.ro,
      'POST',
      '/action',
      { 'content-type': FORM, origin: `http://127.0.0.1:${port.ro}` },
      form({ csrf, do: 'pause', queue: 'critical', confirmed: '1' }),
    );
    assert.equal(r.status, 403);
    assert.equal((await inspector.getQueueInfo('critical')).paused, false);
  });

  test('token: required on every route; Bearer or the cookie from ?token=', async () => {
    for (const path of ['/', '/queues/default', '/metrics', '/api/overview', '/assets/app.js']) {
      const r = await http(port.tok, 'GET', path);
      assert.equal(r.status, 401, path);
      assert.doesNotMatch(r.body, /default|email:send/, 'a 401 shows no data');
    }
    assert.equal((await http(port.tok, 'GET', '/', { authorization: 'Bearer wrong' })).status, 401);
    assert.equal((await http(port.tok, 'GET', '/?token=wrong')).status, 401);
    assert.equal((await http(port.tok, 'GET', '/metrics', { authorization: `Bearer ${TOKEN}` })).status, 200);
    const login = await http(port.tok, 'GET', `/queues/default?state=pending&token=${TOKEN}`);
    assert.equal(login.status, 303);
    assert.equal(login.headers.location, '/queues/default?state=pending', 'the token leaves the URL');
    const setCookie = String(login.headers['set-cookie']);
    assert.match(setCookie, /HttpOnly/);
    assert.match(setCookie, /SameSite=Strict/);
    assert.ok(!setCookie.includes(TOKEN), 'the cookie holds a hash, not the token');
    assert.equal((await http(port.tok, 'GET', '/queues/default', { cookie: cookiesOf(login) })).status, 200);
    assert.equal((await http(port.tok, 'GET', '/', { cookie: 'pgasynq_auth=0000' })).status, 401);
  });

  test('mounted in your own server it answers only to loopback names and this machine; a refused Host does nothing (DNS rebinding)', async () => {
    const mounted = createDashboard(conn);
    const srv = createServer(mounted);
    await new Promise<void>((resolve) => srv.listen(0, '127.0.0.1', resolve));
    const p = (srv.address() as AddressInfo).port;
    await client.enqueue(new Task('rebind:victim', null, { queue: 'rebind', taskId: 'victim' }));
    try {
      assert.equal((await http(p, 'GET', '/', { host: `evil.example:${p}` })).status, 421);
      assert.equal((await http(p, 'GET', '/queues/rebind', { host: `evil.example:${p}` })).status, 421);
      for (const host of [`localhost:${p}`, `127.0.0.1:${p}`, `[::1]:${p}`, `${hostname()}:${p}`]) {
        assert.equal((await http(p, 'GET', '/', { host })).status, 200, host);
      }
      // The attack: a page of evil.example, now resolving to this machine, posts with a CSRF token it read.
      const { cookie, csrf } = await session(p);
      const del = form({ csrf, do: 'delete:one:victim', queue: 'rebind', state: 'pending', confirmed: '1', back: '/' });
      const r = await http(p, 'POST', '/action', { host: `evil.example:${p}`, origin: `http://evil.example:${p}`, cookie, 'content-type': FORM }, del);
      assert.equal(r.status, 421);
      assert.equal((await inspector.getTaskInfo('rebind', 'victim')).state, 'pending', 'nothing was deleted');
    } finally {
      srv.closeAllConnections();
      srv.close();
      await mounted.close();
      await inspector.deleteTask('rebind', 'victim');
      await inspector.deleteQueue('rebind');
    }
  });

  test('allowedHosts adds names to the loopback ones; "*" is an explicit opt-in; bad values are ConfigErrors', async () => {
    const named = createDashboard({ ...conn, allowedHosts: ['Dash.Example', '10.1.2.3', '::2', 'my_service'] });
    const any = createDashboard({ ...conn, allowedHosts: '*' });
    try {
      const p = (await named.listen(0)).port;
      for (const host of [`dash.example:${p}`, `DASH.example.:${p}`, `10.1.2.3:${p}`, `[::2]:${p}`, `my_service:${p}`, `localhost:${p}`, `127.0.0.1:${p}`]) {
        assert.equal((await http(p, 'GET', '/', { host })).status, 200, host);
      }
      for (const host of [`evil.example:${p}`, `dash.example.evil.example:${p}`, `10.1.2.4:${p}`]) {
        assert.equal((await http(p, 'GET', '/', { host })).status, 421, host);
      }
      const q = (await any.listen(0)).port;
      assert.equal((await http(q, 'GET', '/', { host: `evil.example:${q}` })).status, 200);
    } finally {
      await named.close();
      await any.close();
    }
    for (const bad of [['dash.example:8080'], ['a:80'], ['[::1]:80'], ['bad host'], [''], 'dash.example', [1], ['http://x'], []] as unknown[]) {
      const err = ((): unknown => {
        try {
          createDashboard({ ...conn, allowedHosts: bad as string[] });
        } catch (e) {
          return e;
        }
        return undefined;
      })();
      assert.ok(err instanceof ConfigError, `${JSON.stringify(bad)}: ${String(err)}`);
      assert.match(err.message, /^allowedHosts(\[\d\])? must/);
    }
  });

  test('redirects stay on this dashboard: the token login and an action\u2019s back target are normalised before they are checked', async () => {
    const onSite = /^\/(?![/\\])/;
    for (const path of ['/.//evil.example/', '/%2e//evil.example/', '/./\\evil.example/', '/..//evil.example/x', '//evil.example/']) {
      const r = await http(port.tok, 'GET', `${path}?token=${TOKEN}`);
      assert.equal(r.status, 303, path);
      assert.match(String(r.headers.location), onSite, `${path} → ${r.headers.location}`);
    }
    const { cookie, csrf } = await session(port.dash);
    const origin = `http://127.0.0.1:${port.dash}`;
    for (const back of [
      '/.//evil.example/',
      '/%2e//evil.example/x',
      '/./\\evil.example/',
      '/\\evil.example',
      '\\\\evil.example',
      'http://evil.example/',
      '/..//evil.example',
    ]) {
      const r = await http(port.dash, 'POST', '/action', { 'content-type': FORM, cookie, origin }, form({ csrf, do: 'resume', queue: 'cron', back }));
      assert.equal(r.status, 303, back);
      assert.match(String(r.headers.location), onSite, `${back} → ${r.headers.location}`);
      const ask = await http(port.dash, 'POST', '/action', { 'content-type': FORM, cookie, origin }, form({ csrf, do: 'pause', queue: 'cron', back }));
      assert.equal(ask.status, 200);
      const cancel = /<a class="btn" href="([^"]*)">Cancel<\/a>/.exec(ask.body)?.[1];
      assert.ok(
        cancel !== undefined && new URL(cancel, origin).origin === origin && onSite.test(new URL(cancel, origin).pathname),
        `${back}: Cancel goes to ${cancel}`,
      );
    }
    assert.equal((await inspector.getQueueInfo('cron')).paused, false);
    const here = await http(
      port.dash,
      'POST',
      '/action',
      { 'content-type': FORM, cookie, origin },
      form({ csrf, do: 'resume', queue: 'cron', back: '/queues/cron?state=pending' }),
    );
    assert.match(String(here.headers.location), /^\/queues\/cron\?state=pending&flash=/, 'a path of this dashboard is kept');
  });

  test('the session cookie is drawn at random per login, is not a function of the token, and only this dashboard honours it', async () => {
    const a = cookiesOf(await http(port.tok, 'GET', `/?token=${TOKEN}`));
    const b = cookiesOf(await http(port.tok, 'GET', `/?token=${TOKEN}`));
    assert.match(a, /^pgasynq_auth=/);
    assert.notEqual(a, b, 'two logins, two cookies');
    const hash = createHash('sha256').update(`pgasynq-dashboard:${TOKEN}`).digest('hex');
    for (const c of [a, b]) {
      assert.ok(!c.includes(TOKEN) && !c.includes(hash), c);
      assert.equal((await http(port.tok, 'GET', '/', { cookie: c })).status, 200);
    }
    assert.equal((await http(port.tok, 'GET', '/', { cookie: `pgasynq_auth=${hash}` })).status, 401, 'a hash of the token is no session');
    const flipped = a.slice(0, -1) + (a.endsWith('A') ? 'B' : 'A');
    assert.equal((await http(port.tok, 'GET', '/', { cookie: flipped })).status, 401, 'a tampered cookie');
    const other = createDashboard({ ...conn, token: TOKEN });
    try {
      const p = (await other.listen(0)).port;
      assert.equal((await http(p, 'GET', '/', { cookie: a })).status, 401, 'another dashboard with the same token');
    } finally {
      await other.close();
    }
  });
});
