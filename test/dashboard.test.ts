/**
 * The dashboard and /metrics: HTTP-level checks of every defence (headers,
 * Host, token, read-only, Origin, CSRF), /metrics against the Inspector, the
 * `pgasynq dash` command, and a real browser (Debian's Chromium driven by
 * playwright-core) that loads every page against seeded data, compares the
 * numbers it shows with the Inspector, runs every action and checks the
 * database, and makes sure user-supplied strings render as text.
 *
 * DASHBOARD_SCREENSHOTS=1 also writes the README's screenshots to docs/.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { createServer, request } from 'node:http';
import type { AddressInfo } from 'node:net';
import { hostname } from 'node:os';
import { fileURLToPath } from 'node:url';
import { after, before, describe } from 'node:test';
import pg from 'pg';
import type { Browser, BrowserContext, Page } from 'playwright-core';
import {
  ConfigError,
  Scheduler,
  Server,
  Task,
  createDashboard,
  metricsHandler,
  renderPrometheus,
  serverMetrics,
  type Dashboard,
  type QueueInfo,
} from '../src/index.js';
import { browserSkip, launchBrowser } from './browser.js';
import { builtCli, setupDb, test, waitFor } from './helpers.js';

const XSS_TYPE = '<img src=x onerror=alert(1)>';
const TENANT_KEY = 'acme <b>corp</b>';
const TENANT_LIMITS = { concurrency: 5, keyConcurrency: 2, rateLimit: { limit: 100, interval: 1000 } };
const TOKEN = 'test-token-0123456789';
const SHOTS = process.env.DASHBOARD_SCREENSHOTS === '1';
const REPO = fileURLToPath(new URL('..', import.meta.url));

let server: Server;
let scheduler: Scheduler;
/** The dashboards under test: default, read-only, with a token, hiding payloads. */
let dash: Dashboard, ro: Dashboard, tok: Dashboard, hid: Dashboard;
const port: Record<'dash' | 'ro' | 'tok' | 'hid', number> = { dash: 0, ro: 0, tok: 0, hid: 0 };
let entryId: string;

// ------------------------------------------------------------------ HTTP helper

interface Res {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: string;
}

function http(p: number, method: string, path: string, headers: Record<string, string> = {}, body?: string): Promise<Res> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port: p, method, path, headers: { host: `127.0.0.1:${p}`, ...headers } }, (res) => {
      let text = '';
      res.setEncoding('utf8').on('data', (c: string) => (text += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: text }));
    });
    req.on('error', reject);
    req.end(body);
  });
}

/** The cookies a response sets, as a Cookie header. */
function cookiesOf(r: Res): string {
  const set = r.headers['set-cookie'];
  return (Array.isArray(set) ? set : set ? [set] : []).map((c) => c.split(';')[0]).join('; ');
}

/** A session on a dashboard: its cookie and a CSRF token, read from the overview's forms. */
async function session(p: number, extra: Record<string, string> = {}): Promise<{ cookie: string; csrf: string }> {
  const r = await http(p, 'GET', '/', extra);
  assert.equal(r.status, 200);
  const csrf = /name="csrf" value="([^"]+)"/.exec(r.body)?.[1];
  assert.ok(csrf, 'the overview has forms with a CSRF token');
  return { cookie: cookiesOf(r), csrf };
}

function form(fields: Record<string, string | string[]>): string {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(fields)) for (const x of Array.isArray(v) ? v : [v]) q.append(k, x);
  return q.toString();
}

const FORM = 'application/x-www-form-urlencoded';

// ------------------------------------------------------------------ seeding

async function seed(): Promise<void> {
  const tasks: Task[] = [];
  for (let i = 0; i < 45; i++)
    tasks.push(
      new Task(
        'email:send',
        { to: `user${i}@example.com`, template: 'welcome' },
        { queue: 'default', taskId: `mail-${String(i).padStart(2, '0')}`, headers: { 'x-request-id': `req-${i}` } },
      ),
    );
  for (let i = 0; i < 8; i++)
    tasks.push(new Task('image:resize', { image: `img/${i}.png`, width: 640 }, { queue: 'critical', taskId: `img-${i}`, processIn: 3_600_000 + i * 60_000 }));
  for (let i = 0; i < 6; i++)
    tasks.push(new Task('webhook:deliver', { url: `https://example.com/hooks/${i}` }, { queue: 'critical', taskId: `hook-${i}`, retention: 86_400_000 }));
  for (let i = 0; i < 5; i++)
    tasks.push(new Task('event:track', { user: i, event: 'page_view' }, { queue: 'low', taskId: `ev-${i}`, group: i < 3 ? 'g1' : 'g2' }));
  tasks.push(
    new Task(
      XSS_TYPE,
      { html: '<script>alert(2)</script>', quote: `"'><svg onload=alert(4)>` },
      { queue: 'low', taskId: 'xss', headers: { '<b>h</b>': '"><svg onload=alert(3)>' } },
    ),
  );
  tasks.push(new Task('binary:blob', Buffer.from('hello\u0000\u0001\u0002 binary world'), { queue: 'low', taskId: 'blob' }));
  for (let i = 0; i < 3; i++) tasks.push(new Task('job:long', { n: i }, { queue: 'busy', taskId: `long-${i}` }));
  for (let i = 0; i < 2; i++) tasks.push(new Task('report:daily', { kind: 'daily' }, { queue: 'cron', taskId: `cron-${i}` }));
  await client.enqueueMany(tasks);

  // Workflows. In "flow", b waits for a and x, c for a, d for b and for u of
  // another queue; then x completes and its rows go (the edge keeps how it
  // ended). "flow-act" holds waiting tasks for the actions to move.
  await client.enqueueMany([
    new Task('flow:step', { secret: 'flow-secret-a' }, { queue: 'flow', taskId: 'a' }),
    new Task('flow:step', null, { queue: 'flow', taskId: 'x' }),
    new Task('flow:step', null, { queue: 'flow-up', taskId: 'u' }),
    new Task('flow:step', { secret: 'flow-secret-b' }, { queue: 'flow', taskId: 'b', dependsOn: ['a', 'x'] }),
    new Task('flow:step', null, { queue: 'flow', taskId: 'c', dependsOn: ['a'] }),
    new Task('flow:step', null, { queue: 'flow', taskId: 'd', dependsOn: ['b', { queue: 'flow-up', id: 'u' }] }),
    new Task('flow:gate', null, { queue: 'flow-act', taskId: 'p' }),
    ...['w1', 'w2', 'w3', 'w4', 'w5'].map((id) => new Task('flow:step', null, { queue: 'flow-act', taskId: id, dependsOn: ['p'] })),
  ]);
  await db.query(`UPDATE {{schema}}.tasks SET state = 'completed', completed_at = now(), run_at = now() + interval '1 day' WHERE queue = 'flow' AND id = 'x'`);
  await inspector.deleteTask('flow', 'x');

  // States a client cannot enqueue: retry, archived, completed, and an orphan (an active task whose worker is gone).
  await db.query(
    `UPDATE {{schema}}.tasks SET state = 'retry', run_at = now() + interval '2 hours', retried = 1, error_msg = 'HTTP 503 <from upstream>', last_failed_at = now() - interval '1 minute' WHERE queue = 'critical' AND id IN ('hook-0', 'hook-1')`,
  );
  await db.query(
    `UPDATE {{schema}}.tasks SET state = 'archived', run_at = now() - interval '1 hour', retried = 25, error_msg = 'gave up: connection refused', last_failed_at = now() - interval '1 hour' WHERE queue = 'critical' AND id IN ('hook-2', 'hook-3')`,
  );
  await db.query(
    `UPDATE {{schema}}.tasks SET state = 'completed', completed_at = now() - interval '5 minutes', run_at = now() + interval '1 day', result = '{"status": 200, "ms": 41}' WHERE queue = 'critical' AND id IN ('hook-4', 'hook-5')`,
  );
  await db.query(`INSERT INTO {{schema}}.tasks (queue, id, type, payload, state, lease_owner, lease_expires_at, lease_token, started_at)
                  VALUES ('critical', 'orphan-1', 'report:build', '{"part": 1}', 'active', 'a-server-that-died', now() - interval '2 seconds', gen_random_uuid(), now() - interval '1 minute')`);
  await db.query(`INSERT INTO {{schema}}.daily_stats (queue, day, processed, failed) VALUES
                    ('critical', (now() AT TIME ZONE 'UTC')::date, 120, 7), ('critical', (now() AT TIME ZONE 'UTC')::date - 1, 340, 12),
                    ('default', (now() AT TIME ZONE 'UTC')::date, 900, 3), ('default', (now() AT TIME ZONE 'UTC')::date - 2, 1500, 40)`);
  await db.query(`UPDATE {{schema}}.queues SET processed_total = 5000, failed_total = 150 WHERE name = 'default'`);
  await db.query(`UPDATE {{schema}}.queues SET processed_total = 800, failed_total = 31 WHERE name = 'critical'`);

  // Flow control: a queue with every limit, a task with a priority and a concurrency key (markup in it), one without.
  await client.enqueueMany([
    new Task('tenant:sync', null, { queue: 'tenants', taskId: 't-high', priority: 42, concurrencyKey: TENANT_KEY }),
    new Task('tenant:sync', null, { queue: 'tenants', taskId: 't-plain' }),
  ]);
  await inspector.setQueueLimits('tenants', TENANT_LIMITS);

  // A live server running two tasks of "busy" until they are cancelled or it shuts down.
  server = new Server({ ...conn, queues: { busy: 1 }, concurrency: 2, shutdownTimeout: 500, recoverCutoff: 600_000 });
  await server.start(
    (_task, ctx) => new Promise<void>((_resolve, reject) => ctx.signal.addEventListener('abort', () => reject(ctx.signal.reason), { once: true })),
  );
  await waitFor(async () => (await inspector.getQueueInfo('busy')).active === 2, 20_000, 'two active tasks');

  // A scheduler entry, and an enqueue history for it. The history is written
  // before the scheduler starts, with the current hour's tick handled, so it
  // has no tick to catch up (which would add a task mid-test).
  scheduler = new Scheduler(conn);
  entryId = scheduler.register('@every 1h', new Task('report:daily', { kind: 'daily' }), { queue: 'cron' });
  await db.query(
    `INSERT INTO {{schema}}.scheduler_events (entry_id, tick_at, task_id, enqueued_at)
     VALUES ($1, date_trunc('hour', now()) - interval '1 hour', 'cron-0', date_trunc('hour', now()) - interval '1 hour'),
            ($1, date_trunc('hour', now()), 'cron-1', date_trunc('hour', now()))`,
    [entryId],
  );
  await scheduler.start();
  await waitFor(async () => (await inspector.schedulerEntries()).length === 1, 20_000, 'the scheduler entry');
}

// The server and the scheduler live through the whole file (seed starts them): they are not the afterEach's to shut down.
const { db, client, inspector } = setupDb('t_dashboard', {
  setup: async () => {
    await seed();
    dash = createDashboard({ ...conn, refreshInterval: 5000 });
    ro = createDashboard({ ...conn, readOnly: true });
    tok = createDashboard({ ...conn, token: TOKEN });
    hid = createDashboard({ ...conn, hidePayloads: true });
    port.dash = (await dash.listen(0)).port;
    port.ro = (await ro.listen(0)).port;
    port.tok = (await tok.listen(0)).port;
    port.hid = (await hid.listen(0)).port;
  },
  teardown: async () => {
    await Promise.all([dash?.close(), ro?.close(), tok?.close(), hid?.close()]);
    await scheduler?.shutdown();
    await server?.shutdown();
  },
});
const conn = { connectionString: db.connectionString, schema: db.schema };

// ------------------------------------------------------------------ HTTP

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
      `/schedulers/${entryId}`,
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

  test('hide-payloads: no payload, result or worker payload leaves the server', async () => {
    const pages = [
      '/queues/default?state=pending',
      '/queues/default/tasks/mail-07',
      '/queues/critical?state=completed',
      '/queues/critical/tasks/hook-4',
      '/queues/low/tasks/blob',
      '/queues/flow?state=waiting',
      '/queues/flow/tasks/a',
      '/queues/flow/tasks/b',
      '/servers',
      '/schedulers',
      '/api/overview',
    ];
    // Headers, last errors and results often repeat what the payload held: hidden too.
    pages.push(
      '/queues/critical?state=retry',
      '/queues/critical?state=archived',
      '/queues/critical/tasks/hook-0',
      '/queues/critical/tasks/hook-2',
      '/queues/low/tasks/xss',
    );
    for (const path of pages) {
      const r = await http(port.hid, 'GET', path);
      assert.equal(r.status, 200, path);
      for (const secret of [
        'user7@example.com',
        'user0@example.com',
        '"status"',
        '&quot;status&quot;',
        '68 65 6c 6c 6f',
        'kind',
        '&quot;n&quot;',
        'HTTP 503',
        'from upstream',
        'connection refused',
        'x-request-id',
        'req-7',
        'onload',
        'flow-secret',
      ]) {
        assert.ok(!r.body.includes(secret), `${path} leaks ${secret}`);
      }
    }
    for (const path of ['/queues/default/tasks/mail-07', '/queues/critical/tasks/hook-0', '/queues/critical?state=retry']) {
      assert.match((await http(port.hid, 'GET', path)).body, /hidden/i, `${path} says what it hides`);
    }
    assert.match((await http(port.dash, 'GET', '/queues/default/tasks/mail-07')).body, /user7@example\.com/, 'shown without the flag');
    assert.match((await http(port.dash, 'GET', '/queues/default/tasks/mail-07')).body, /req-7/, 'headers shown without the flag');
    assert.match((await http(port.dash, 'GET', '/queues/critical?state=retry')).body, /HTTP 503/, 'errors shown without the flag');
    // A dependency's name is no content: the waiting tab and the task page still link it.
    assert.match((await http(port.hid, 'GET', '/queues/flow?state=waiting')).body, /href="\/queues\/flow\/tasks\/a"/);
    assert.match((await http(port.hid, 'GET', '/queues/flow/tasks/a')).body, /href="\/queues\/flow\/tasks\/b"/);
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

  test('list pages and /metrics read previews and sizes, not whole rows: a page over 0.6 MB payloads stays small', { timeout: 120_000 }, async () => {
    // Bytes the dashboard's own pool reads from PostgreSQL, over every connection it opened.
    const pool = new pg.Pool({ connectionString: db.connectionString, max: 4 });
    const clients: pg.PoolClient[] = [];
    pool.on('connect', (c) => void clients.push(c));
    const bytesRead = () => clients.reduce((n, c) => n + (c as unknown as { connection: { stream: { bytesRead: number } } }).connection.stream.bytesRead, 0);
    const big = createDashboard({ pool, schema: db.schema });
    const blob = 'x'.repeat(600_000);
    const ids = (from: number, to: number) => Array.from({ length: to - from }, (_, i) => `big-${from + i}`);
    await client.enqueueMany(ids(0, 30).map((id) => new Task('big:blob', { blob, id }, { queue: 'big', taskId: id, headers: { h: blob.slice(0, 50_000) } })));
    await db.query(
      `UPDATE {{schema}}.tasks SET state = 'retry', run_at = now() + interval '1 hour', retried = 1, error_msg = repeat('e', 600000), last_failed_at = now() WHERE queue = 'big' AND id = ANY($1)`,
      [ids(15, 20)],
    );
    await db.query(
      `UPDATE {{schema}}.tasks SET state = 'completed', completed_at = now(), run_at = now() + interval '1 day', result = payload WHERE queue = 'big' AND id = ANY($1)`,
      [ids(20, 25)],
    );
    // Active, leased to the live server (its heartbeat does not know them; the lease outlasts the test).
    await db.query(
      `UPDATE {{schema}}.tasks SET state = 'active', lease_owner = $2, lease_expires_at = now() + interval '1 hour', lease_token = gen_random_uuid(), started_at = now() WHERE queue = 'big' AND id = ANY($1)`,
      [ids(25, 30), server.id],
    );
    try {
      const p = (await big.listen(0)).port;
      for (const path of [
        '/queues/big?state=pending&size=1000',
        '/queues/big?state=retry&size=1000',
        '/queues/big?state=completed&size=1000',
        '/queues/big?state=active&size=1000',
        '/queues/big?state=pending&search=blob',
        '/servers',
        '/metrics',
      ]) {
        const before = bytesRead();
        const r = await http(p, 'GET', path);
        const read = bytesRead() - before;
        assert.equal(r.status, 200, `${path}: ${r.body.slice(0, 300)}`);
        assert.ok(read < 1_000_000, `${path} read ${read} bytes from PostgreSQL`);
        assert.ok(r.body.length < 500_000, `${path} sent ${r.body.length} characters`);
      }
      assert.match((await http(p, 'GET', '/queues/big?state=pending')).body, /big-0/, 'the rows are there');
    } finally {
      await big.close();
      await pool.end();
      await db.query(`DELETE FROM {{schema}}.tasks WHERE queue = 'big'`);
      await db.query(`DELETE FROM {{schema}}.queues WHERE name = 'big'`);
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

  test('invisible and direction characters in types, headers and payloads are shown as \\u{…} escapes, never raw', async () => {
    const RLO = '\u202E';
    const ZWSP = '\u200B';
    await client.enqueue(new Task(`invoice${RLO}fdp.exe`, { note: `a${ZWSP}b` }, { queue: 'bidi', taskId: 'bidi-1', headers: { [`h${ZWSP}`]: `v${RLO}` } }));
    try {
      const raw = /[\u061C\u200B-\u200F\u202A-\u202E\u2060-\u2069\uFEFF]/;
      for (const path of ['/queues/bidi?state=pending', '/queues/bidi/tasks/bidi-1', '/']) {
        const r = await http(port.dash, 'GET', path);
        assert.equal(r.status, 200, path);
        assert.doesNotMatch(r.body, raw, `${path} holds a raw invisible character`);
      }
      const list = (await http(port.dash, 'GET', '/queues/bidi?state=pending')).body;
      assert.ok(list.includes('invoice\\u{202E}fdp.exe'), 'the type, its override shown');
      assert.ok(list.includes('a\\u{200B}b'), 'the payload preview');
      const task = (await http(port.dash, 'GET', '/queues/bidi/tasks/bidi-1')).body;
      assert.ok(task.includes('invoice\\u{202E}fdp.exe') && task.includes('h\\u{200B}') && task.includes('v\\u{202E}'), 'type and headers on the task page');
    } finally {
      await inspector.deleteTask('bidi', 'bidi-1');
      await inspector.deleteQueue('bidi');
    }
  });

  test('/api/overview: counts and samples, no payloads', async () => {
    const r = await http(port.dash, 'GET', '/api/overview');
    assert.match(String(r.headers['content-type']), /^application\/json/);
    const j = JSON.parse(r.body) as { queues: { queue: string; pending: number }[]; samples: unknown[] };
    const info = await inspector.getQueueInfo('default');
    assert.equal(j.queues.find((q) => q.queue === 'default')?.pending, info.pending);
    assert.ok(j.samples.length >= 1);
    assert.doesNotMatch(r.body, /payload|example\.com/);
  });
});

// ------------------------------------------------------------------ /metrics

/** Parses the text format strictly: every line is a comment of the right shape or a sample of a declared family. */
function parseMetrics(text: string): { types: Map<string, string>; samples: Map<string, number> } {
  const types = new Map<string, string>();
  const samples = new Map<string, number>();
  assert.ok(text.endsWith('\n'));
  for (const line of text.slice(0, -1).split('\n')) {
    let m = /^# (HELP|TYPE) ([a-zA-Z_:][a-zA-Z0-9_:]*) (.+)$/.exec(line);
    if (m) {
      if (m[1] === 'TYPE') {
        assert.match(m[3] as string, /^(gauge|counter)$/);
        types.set(m[2] as string, m[3] as string);
      }
      continue;
    }
    m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*",?)*\})? (-?[0-9.e+]+|NaN|[+-]Inf)$/.exec(line);
    assert.ok(m, `not a valid sample line: ${JSON.stringify(line)}`);
    assert.ok(types.has(m[1] as string), `sample before its TYPE: ${line}`);
    samples.set(`${m[1]}${m[2] ?? ''}`, Number(m[3]));
  }
  return { types, samples };
}

describe('/metrics', () => {
  test("asynq's names, types and labels; the numbers are the Inspector's", async () => {
    const r = await http(port.dash, 'GET', '/metrics');
    assert.equal(r.status, 200);
    assert.equal(r.headers['content-type'], 'text/plain; version=0.0.4; charset=utf-8');
    const { types, samples } = parseMetrics(r.body);
    assert.equal(types.get('asynq_tasks_enqueued_total'), 'gauge');
    assert.equal(types.get('asynq_tasks_processed_total'), 'counter');
    assert.equal(types.get('asynq_tasks_failed_total'), 'counter');
    for (const name of ['asynq_queue_size', 'asynq_queue_latency_seconds', 'asynq_queue_memory_usage_approx_bytes', 'asynq_queue_paused_total'])
      assert.equal(types.get(name), 'gauge', name);
    const get = (k: string) => {
      const v = samples.get(k);
      assert.notEqual(v, undefined, `missing ${k}`);
      return v as number;
    };
    for (const q of await inspector.queues()) {
      const info = await inspector.getQueueInfo(q);
      for (const state of ['active', 'pending', 'scheduled', 'retry', 'archived', 'completed'] as const) {
        assert.equal(get(`asynq_tasks_enqueued_total{queue="${q}",state="${state}"}`), info[state], `${q} ${state}`);
      }
      assert.equal(samples.has(`asynq_tasks_enqueued_total{queue="${q}",state="aggregating"}`), false, 'asynq exports no aggregating state');
      assert.equal(get(`asynq_queue_size{queue="${q}"}`), info.size);
      assert.equal(get(`asynq_tasks_processed_total{queue="${q}"}`), info.processedTotal);
      assert.equal(get(`asynq_tasks_failed_total{queue="${q}"}`), info.failedTotal);
      assert.equal(get(`asynq_queue_paused_total{queue="${q}"}`), info.paused ? 1 : 0);
      assert.equal(get(`pgasynq_tasks_aggregating{queue="${q}"}`), info.aggregating);
      assert.equal(samples.has(`asynq_tasks_enqueued_total{queue="${q}",state="waiting"}`), false, 'asynq exports no waiting state');
      assert.equal(get(`pgasynq_tasks_waiting{queue="${q}"}`), info.waiting);
      const latency = get(`asynq_queue_latency_seconds{queue="${q}"}`);
      assert.ok(Math.abs(latency - info.latency / 1000) < 5, `${q} latency ${latency} vs ${info.latency} ms`);
      const bytes = get(`asynq_queue_memory_usage_approx_bytes{queue="${q}"}`);
      assert.ok(info.size === 0 ? bytes === 0 : bytes >= info.size * 100, `${q} approx bytes ${bytes} for ${info.size} tasks`);
    }
    assert.equal(types.get('pgasynq_tasks_waiting'), 'gauge');
    assert.equal(get('pgasynq_tasks_waiting{queue="flow"}'), 3, 'b, c and d wait');
    assert.equal(get('pgasynq_tasks_waiting{queue="flow-act"}'), 5);
    assert.equal(get('pgasynq_tasks_waiting{queue="default"}'), 0);
    assert.equal(get('asynq_queue_size{queue="flow"}'), 4, 'a and the waiting tasks');
    assert.ok(get('asynq_queue_memory_usage_approx_bytes{queue="flow"}') >= 4 * 300, 'waiting tasks are counted in the estimate');
    assert.equal(get('pgasynq_tasks_orphaned{queue="critical"}'), 1, 'the seeded orphan');
    assert.equal(get('pgasynq_tasks_orphaned{queue="busy"}'), 0);
    const servers = await inspector.servers();
    assert.equal(get('pgasynq_servers'), servers.length);
    assert.equal(get('pgasynq_workers_busy'), 2);
    assert.equal(get('pgasynq_workers_capacity'), 2);
    assert.equal(get('pgasynq_scheduler_entries'), 1);
    assert.ok(get('pgasynq_active_task_oldest_age_seconds{queue="busy"}') >= 0);
  });

  test('metricsHandler() on your own server, with server.metrics() through `extra`', async () => {
    const handler = metricsHandler({ ...conn, extra: () => serverMetrics(server) });
    try {
      const text = await handler.collect();
      const { samples } = parseMetrics(text);
      assert.ok(samples.has(`pgasynq_tasks_claimed_total{server="${server.id}"}`));
      assert.equal(samples.get(`pgasynq_fenced_writes_total{server="${server.id}"}`), server.metrics().fencedWrites);
      assert.equal(samples.get(`pgasynq_leases_lost_total{server="${server.id}"}`), server.metrics().leasesLost);
      assert.ok(samples.has('asynq_queue_size{queue="default"}'));
    } finally {
      await handler.close();
    }
    assert.equal(
      renderPrometheus([{ name: 'x_total', help: 'a\\b\nc', type: 'counter', samples: [{ labels: { queue: 'q"\\\n' }, value: 1.5 }] }]),
      '# HELP x_total a\\\\b\\nc\n# TYPE x_total counter\nx_total{queue="q\\"\\\\\\n"} 1.5\n',
    );
    assert.throws(() => renderPrometheus([{ name: 'bad-name', help: '', type: 'gauge', samples: [] }]));
  });
});

// ------------------------------------------------------------------ CLI

function runDash(args: string[]): { child: ReturnType<typeof spawn>; out: Promise<string>; exit: Promise<number | null>; stderr: () => string } {
  const child = spawn(process.execPath, [builtCli(), '--database-url', db.connectionString, '--schema', db.schema, ...args], {
    cwd: REPO,
    env: { ...process.env, PGASYNQ_DASH_TOKEN: '' },
  });
  let stdout = '';
  let stderr = '';
  child.stderr?.setEncoding('utf8').on('data', (s: string) => (stderr += s));
  const out = new Promise<string>((resolve) => {
    child.stdout?.setEncoding('utf8').on('data', (s: string) => {
      stdout += s;
      if (stdout.includes('\n')) resolve(stdout);
    });
    child.on('close', () => resolve(stdout));
  });
  const exit = new Promise<number | null>((resolve) => child.on('close', (code) => resolve(code)));
  return { child, out, exit, stderr: () => stderr };
}

describe('pgasynq dash', () => {
  test('prints the URL, serves the dashboard, stops on SIGTERM with exit 0', async () => {
    const run = runDash(['--json', 'dash', '--port', '0', '--read-only', '--refresh', '2']);
    const line = JSON.parse((await run.out).split('\n')[0] as string) as { url: string; metricsUrl: string; readOnly: boolean };
    assert.match(line.url, /^http:\/\/127\.0\.0\.1:\d+\/$/);
    assert.equal(line.metricsUrl, `${line.url}metrics`);
    assert.equal(line.readOnly, true);
    const p = Number(new URL(line.url).port);
    const page = await http(p, 'GET', '/');
    assert.equal(page.status, 200);
    assert.match(page.body, /data-refresh="2000"/);
    assert.match(page.body, /read-only/);
    assert.equal((await http(p, 'GET', '/metrics')).status, 200);
    run.child.kill('SIGTERM');
    assert.equal(await run.exit, 0, run.stderr());
  });

  test(
    '--host 0.0.0.0: answers to loopback names, this machine and the bound address only, says how to allow more; --allowed-hosts adds names',
    { timeout: 60_000 },
    async () => {
      const run = runDash(['--json', 'dash', '--port', '0', '--host', '0.0.0.0', '--read-only']);
      try {
        const line = JSON.parse((await run.out).split('\n')[0] as string) as { url: string; allowedHosts: string[] };
        const p = Number(new URL(line.url).port);
        assert.deepEqual(line.allowedHosts, ['localhost', '127.0.0.1', '[::1]', hostname().toLowerCase(), '0.0.0.0']);
        assert.equal((await http(p, 'GET', '/', { host: `evil.example:${p}` })).status, 421);
        for (const host of [`127.0.0.1:${p}`, `localhost:${p}`, `${hostname()}:${p}`, `0.0.0.0:${p}`])
          assert.equal((await http(p, 'GET', '/', { host })).status, 200, host);
        await waitFor(() => /--allowed-hosts/.test(run.stderr()), 10_000, 'the hint on stderr');
      } finally {
        run.child.kill('SIGTERM');
        assert.equal(await run.exit, 0, run.stderr());
      }
      const named = runDash(['--json', 'dash', '--port', '0', '--host', '0.0.0.0', '--read-only', '--allowed-hosts', 'dash.example, 10.1.2.3']);
      try {
        const line = JSON.parse((await named.out).split('\n')[0] as string) as { url: string };
        const p = Number(new URL(line.url).port);
        for (const host of [`dash.example:${p}`, `10.1.2.3:${p}`, `127.0.0.1:${p}`]) assert.equal((await http(p, 'GET', '/', { host })).status, 200, host);
        assert.equal((await http(p, 'GET', '/', { host: `evil.example:${p}` })).status, 421);
      } finally {
        named.child.kill('SIGTERM');
        assert.equal(await named.exit, 0, named.stderr());
      }
      const bad = runDash(['dash', '--port', '0', '--allowed-hosts', 'dash.example,a:80']);
      assert.equal(await bad.exit, 2);
      assert.match(bad.stderr(), /--allowed-hosts/);
    },
  );

  test('bad usage is exit 2; an unreachable database is exit 1', async () => {
    const bad = runDash(['dash', '--port', 'eighty']);
    assert.equal(await bad.exit, 2);
    assert.match(bad.stderr(), /--port/);
    const child = spawn(process.execPath, [builtCli(), '--database-url', 'postgres://u:secret@127.0.0.1:1/x', 'dash', '--port', '0'], {
      cwd: REPO,
    });
    let stderr = '';
    child.stderr.setEncoding('utf8').on('data', (s: string) => (stderr += s));
    const code = await new Promise<number | null>((resolve) => child.on('close', resolve));
    assert.equal(code, 1);
    assert.match(stderr, /cannot reach the database/);
    assert.ok(!stderr.includes('secret'));
  });
});

// ------------------------------------------------------------------ browser

describe('in the browser', { skip: browserSkip() }, () => {
  let browser: Browser;
  let context: BrowserContext;
  let page: Page;
  const dialogs: string[] = [];
  const cspErrors: string[] = [];
  let acceptConfirm = true;
  const base = () => `http://127.0.0.1:${port.dash}`;

  before(async () => {
    browser = await launchBrowser();
    context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
    page = await context.newPage();
    // Every dialog is recorded; confirm() is accepted (unless a test says otherwise) so actions go through.
    page.on('dialog', (d) => {
      dialogs.push(`${d.type()}: ${d.message()}`);
      void (d.type() === 'confirm' && acceptConfirm ? d.accept() : d.dismiss());
    });
    page.on('console', (m) => {
      if (/Content.Security.Policy|Refused to/i.test(m.text())) cspErrors.push(m.text());
    });
    page.on('pageerror', (e) => cspErrors.push(`page error: ${e.message}`));
    // No auto-refresh under the other tests' feet: the refresh test turns it on for itself.
    await page.goto(base());
    await page.evaluate("localStorage.setItem('pgasynq.refresh', '0')");
  });

  after(async () => {
    await browser?.close();
  });

  const cellNumber = async (p: Page, selector: string) => Number(((await p.locator(selector).first().textContent()) ?? '').replace(/[,\s]/g, ''));

  test('user-supplied strings render as text: no dialog, no element', async () => {
    for (const path of ['/queues/low?state=pending', '/queues/low/tasks/xss', '/']) {
      await page.goto(base() + path);
      await page.waitForLoadState('load');
    }
    await page.goto(`${base()}/queues/low?state=pending`);
    assert.equal(await page.locator('tr[data-task-id="xss"] td.type').textContent(), XSS_TYPE);
    assert.equal(await page.locator('tr[data-task-id="xss"] td.type img').count(), 0);
    await page.goto(`${base()}/queues/low/tasks/xss`);
    assert.equal(await page.locator('[data-field="type"]').textContent(), XSS_TYPE);
    assert.match((await page.locator('pre[data-block="payload"]').textContent()) ?? '', /<script>alert\(2\)<\/script>/);
    assert.equal(await page.locator('main img, main svg[onload], main script').count(), 0);
    assert.match((await page.locator('table.kv').textContent()) ?? '', /<b>h<\/b>/);
    assert.deepEqual(dialogs, [], 'no script ran');
    assert.deepEqual(cspErrors, [], 'the pages break none of their own CSP');
  });

  test('screenshots for the README (DASHBOARD_SCREENSHOTS=1)', { skip: !SHOTS }, async () => {
    const p = await context.newPage();
    try {
      // Show the default refresh interval (the other tests turn refresh off).
      await p.goto(`http://127.0.0.1:${port.dash}/`);
      await p.evaluate("localStorage.removeItem('pgasynq.refresh')");
      // Some movement for the live chart.
      for (let i = 0; i < 20; i++) {
        await client.enqueueMany(
          Array.from(
            { length: 5 + ((i * 7) % 11) },
            (_, k) => new Task('email:send', { to: `burst${i}-${k}@example.com` }, { queue: i % 3 === 0 ? 'critical' : 'default' }),
          ),
        );
        await http(port.dash, 'GET', '/api/overview');
        await new Promise((r) => setTimeout(r, 1100));
      }
      const shots: [string, string][] = [
        ['/', 'docs/dashboard-queues.png'],
        ['/queues/default?state=pending', 'docs/dashboard-queue.png'],
        ['/queues/critical/tasks/hook-0', 'docs/dashboard-task.png'],
        ['/servers', 'docs/dashboard-servers.png'],
        ['/schedulers', 'docs/dashboard-schedulers.png'],
      ];
      for (const [path, file] of shots) {
        await p.goto(`http://127.0.0.1:${port.dash}${path}`);
        if (path === '/') await p.locator('#live-chart svg').waitFor();
        await p.screenshot({ path: file, fullPage: path !== '/queues/default?state=pending' });
      }
    } finally {
      await p.evaluate("localStorage.setItem('pgasynq.refresh', '0')");
      await p.close();
    }
  });

  test('overview: every number shown is the Inspector\u2019s; the live chart draws', async () => {
    await page.goto(base());
    const queues = await inspector.queues();
    assert.equal(await page.locator('table.queues tbody tr').count(), queues.length);
    const infos: QueueInfo[] = [];
    for (const q of queues) {
      const info = await inspector.getQueueInfo(q);
      infos.push(info);
      const row = `tr[data-queue="${q}"]`;
      for (const col of [
        'active',
        'pending',
        'waiting',
        'aggregating',
        'scheduled',
        'retry',
        'archived',
        'completed',
        'size',
        'processed',
        'failed',
      ] as const) {
        assert.equal(await cellNumber(page, `${row} td[data-col="${col}"]`), info[col], `${q} ${col}`);
      }
      assert.equal(await page.locator(`${row} td[data-col="paused"]`).textContent(), info.paused ? 'yes' : 'no');
    }
    const total = (k: 'size' | 'pending' | 'processed' | 'failed') => infos.reduce((n, i) => n + i[k], 0);
    for (const k of ['size', 'pending', 'processed', 'failed'] as const)
      assert.equal(await cellNumber(page, `[data-tile="${k}"] .tile-value`), total(k), `tile ${k}`);
    await page.locator('#live-chart svg').waitFor();
    assert.ok((await page.locator('#live-chart .legend').textContent())?.includes('default'));
    assert.ok((await page.locator('#r-history rect.bar-ok').count()) >= 7, 'a bar per day');
    await page.goto(`${base()}/?days=30`);
    assert.equal(await page.locator('#r-history g').count(), 30);
  });

  test('queue page: tabs with counts, pages of 30, search by id and by type', async () => {
    await page.goto(`${base()}/queues/default?state=pending`);
    const info = await inspector.getQueueInfo('default');
    for (const s of ['active', 'pending', 'waiting', 'aggregating', 'scheduled', 'retry', 'archived', 'completed'] as const) {
      assert.equal(await cellNumber(page, `a.tab[data-state="${s}"] .count`), info[s], `tab ${s}`);
    }
    const first = await inspector.listPendingTasks('default');
    assert.deepEqual(
      await page.locator('table.tasks tbody tr').evaluateAll((rows) => rows.map((r) => r.getAttribute('data-task-id'))),
      first.map((t) => t.id),
    );
    await page.locator('nav.pager a', { hasText: 'Next' }).click();
    await page.waitForURL(/page=2/);
    const second = await inspector.listPendingTasks('default', { page: 2 });
    assert.deepEqual(
      await page.locator('table.tasks tbody tr').evaluateAll((rows) => rows.map((r) => r.getAttribute('data-task-id'))),
      second.map((t) => t.id),
    );

    await page.goto(`${base()}/queues/low?state=pending`);
    await page.fill('input[name=search]', 'BINARY');
    await page.press('input[name=search]', 'Enter');
    await page.waitForURL(/search=BINARY/);
    assert.deepEqual(await page.locator('table.tasks tbody tr').evaluateAll((rows) => rows.map((r) => r.getAttribute('data-task-id'))), ['blob']);
    await page.fill('input[name=search]', 'hook-0');
    await page.press('input[name=search]', 'Enter');
    await page.waitForURL(/search=hook-0/);
    assert.equal((await page.locator('.error-page').count()) + (await page.locator('[data-search-result]').count()), 1, 'hook-0 is not in queue low');
    await page.goto(`${base()}/queues/critical?state=pending`);
    await page.fill('input[name=search]', 'hook-0');
    await page.press('input[name=search]', 'Enter');
    await page.waitForURL(/\/queues\/critical\/tasks\/hook-0$/);

    await page.goto(`${base()}/queues/low?state=aggregating`);
    const groups = await inspector.groups('low');
    assert.deepEqual(
      await page.locator('nav.groups [data-group]').evaluateAll((els) => els.map((e) => e.getAttribute('data-group'))),
      groups.map((g) => g.group),
    );
    assert.equal(await page.locator('table.tasks tbody tr').count(), groups[0]?.size);
  });

  test('task page: payload (JSON and hex), headers, error, result, lease', async () => {
    const t = await inspector.getTaskInfo('default', 'mail-07');
    await page.goto(`${base()}/queues/default/tasks/mail-07`);
    assert.equal(await page.locator('pre[data-block="payload"]').textContent(), JSON.stringify(t.payload, null, 2));
    assert.match((await page.locator('table.kv').textContent()) ?? '', /x-request-id\s*req-7/);
    await page.goto(`${base()}/queues/low/tasks/blob`);
    assert.match((await page.locator('pre[data-block="payload"]').textContent()) ?? '', /^00000000 {2}68 65 6c 6c 6f 00 01 02/);
    await page.goto(`${base()}/queues/critical/tasks/hook-0`);
    assert.equal(await page.locator('pre[data-block="error"]').textContent(), 'HTTP 503 <from upstream>');
    await page.goto(`${base()}/queues/critical/tasks/hook-4`);
    assert.equal(await page.locator('pre[data-block="result"]').textContent(), JSON.stringify({ ms: 41, status: 200 }, null, 2));
    await page.goto(`${base()}/queues/critical/tasks/orphan-1`);
    assert.match((await page.locator('#r-lease').textContent()) ?? '', /Orphaned\s*yes/);
    const busy = (await inspector.listActiveTasks('busy'))[0];
    assert.ok(busy);
    await page.goto(`${base()}/queues/busy/tasks/${busy.id}`);
    assert.ok((await page.locator('#r-lease').textContent())?.includes(server.id), 'the lease owner is the live server');
  });

  test('workflows: the waiting tab links each task\u2019s dependencies; task pages link dependencies and dependents both ways', async () => {
    const ids = async () => page.locator('table.tasks tbody tr').evaluateAll((rows) => rows.map((r) => r.getAttribute('data-task-id')));
    // Each row's cells, as the eye reads them.
    const rowTexts = async (rows: string) => (await page.locator(rows).allInnerTexts()).map((t) => t.replace(/\s+/g, ' ').trim());
    await page.goto(`${base()}/queues/flow?state=waiting`);
    assert.equal(await cellNumber(page, 'a.tab[data-state="waiting"] .count'), 3);
    assert.deepEqual(
      await ids(),
      (await inspector.listWaitingTasks('flow')).map((t) => t.id),
    );
    assert.deepEqual(await page.locator('table.tasks thead th').allTextContents(), ['', 'ID', 'Type', 'Payload', 'waiting for', 'depends on', '']);
    // b waits for a; x completed and is gone: named after a, muted, with its outcome on hover.
    const b = 'tr[data-task-id="b"]';
    assert.equal(await page.locator(`${b} td[data-col="waiting-for"]`).textContent(), '1 of 2');
    assert.equal(await page.locator(`${b} td[data-col="depends-on"]`).textContent(), 'a, x');
    assert.equal(await page.locator(`${b} td[data-col="depends-on"] a.muted`).getAttribute('title'), 'completed');
    // A dependency in another queue is named with it.
    assert.equal(await page.locator('tr[data-task-id="d"] td[data-col="waiting-for"]').textContent(), '2 of 2');
    assert.equal(
      await page.locator('tr[data-task-id="d"] td[data-col="depends-on"]').textContent(),
      'flow-up/u, b',
      'in the order the dependencies were enqueued',
    );
    assert.equal(
      await page.locator('tr[data-task-id="d"] td[data-col="depends-on"] a', { hasText: 'flow-up/u' }).getAttribute('href'),
      '/queues/flow-up/tasks/u',
    );

    // The waiting tab → a's page: its dependents, b and c, waiting.
    await page.locator(`${b} td[data-col="depends-on"] a`, { hasText: /^a$/ }).click();
    await page.waitForURL((u) => u.pathname === '/queues/flow/tasks/a');
    assert.equal(await page.locator('section[data-list="depends-on"]').count(), 0, 'a depends on nothing: no section');
    const dependents = 'section[data-list="dependents"] tbody tr';
    assert.deepEqual(await rowTexts(dependents), ['flow/b waiting', 'flow/c waiting']);

    // a's page → b's page: a unfinished and pending, x completed and gone (named, not linked), d a dependent.
    await page.click(`${dependents}[data-dep="flow/b"] a`);
    await page.waitForURL((u) => u.pathname === '/queues/flow/tasks/b');
    assert.match((await page.locator('#r-facts').textContent()) ?? '', /Waiting for\s*1 of 2 dependencies/);
    const deps = 'section[data-list="depends-on"] tbody tr';
    assert.deepEqual(await rowTexts(deps), ['flow/a not yet pending', 'flow/x completed gone']);
    assert.equal(await page.locator(`${deps}[data-dep="flow/x"] a`).count(), 0, 'no link to a task that is gone');
    assert.equal(await page.locator(`${dependents}[data-dep="flow/d"] a`).getAttribute('href'), '/queues/flow/tasks/d');

    // b's page → back to a through its dependency, and on to d through its dependent.
    await page.click(`${deps}[data-dep="flow/a"] a`);
    await page.waitForURL((u) => u.pathname === '/queues/flow/tasks/a');
    await page.goto(`${base()}/queues/flow/tasks/b`);
    await page.click(`${dependents}[data-dep="flow/d"] a`);
    await page.waitForURL((u) => u.pathname === '/queues/flow/tasks/d');
    assert.deepEqual(await page.locator(deps).evaluateAll((rows) => rows.map((r) => r.getAttribute('data-dep'))), ['flow-up/u', 'flow/b']);
    assert.equal(await page.locator('section[data-list="dependents"]').count(), 0, 'nothing depends on d: no section');
    // A dependency gone: its page answers 404, the page of an error.
    const gone = await page.goto(`${base()}/queues/flow/tasks/x`);
    assert.equal(gone?.status(), 404);
    assert.deepEqual(cspErrors, [], 'the pages break none of their own CSP');
  });

  test('workflows: run, archive and delete on the waiting tab', async () => {
    const flash = async () => (await page.locator('.flash').textContent()) ?? '';
    const state = (id: string) => inspector.getTaskInfo('flow-act', id).then((t) => t.state);
    await page.goto(`${base()}/queues/flow-act?state=waiting`);
    assert.deepEqual(await page.locator('tr[data-task-id="w1"] button[data-op]').evaluateAll((bs) => bs.map((b) => b.getAttribute('data-op'))), [
      'run',
      'archive',
      'delete',
    ]);

    // Run one: pending at once, whatever it waited for.
    await page.click('tr[data-task-id="w1"] button[data-op="run"]');
    await page.waitForSelector('.flash');
    assert.equal(await state('w1'), 'pending');

    // Archive a selection.
    await page.check('tr[data-task-id="w2"] input[type=checkbox]');
    await page.click('button[data-op="archive"][data-scope="selected"]');
    await page.waitForSelector('.flash');
    assert.match(await flash(), /Archived 1 task/);
    assert.equal(await state('w2'), 'archived');

    // Delete one (asks first).
    dialogs.length = 0;
    await page.click('tr[data-task-id="w3"] button[data-op="delete"]');
    await page.waitForSelector('.flash');
    await assert.rejects(inspector.getTaskInfo('flow-act', 'w3'), /cannot find task/);
    assert.ok(
      dialogs.some((d) => d.startsWith('confirm: Delete for good task w3')),
      dialogs.join('\n'),
    );

    // Run all the rest.
    await page.click('button[data-op="run"][data-scope="all"]');
    await page.waitForSelector('.flash');
    assert.match(await flash(), /Ran 2 waiting task/);
    assert.deepEqual([await state('w4'), await state('w5')], ['pending', 'pending']);
    const info = await inspector.getQueueInfo('flow-act');
    assert.equal(info.waiting, 0);
    assert.equal(await cellNumber(page, 'a.tab[data-state="waiting"] .count'), 0);
    assert.equal(await page.locator('p.empty').textContent(), 'No waiting tasks.');
    assert.deepEqual(cspErrors, []);
  });

  test('servers and schedulers pages', async () => {
    const servers = await inspector.servers();
    await page.goto(`${base()}/servers`);
    assert.equal(await page.locator('section.server').count(), servers.length);
    const s = servers[0];
    assert.ok(s);
    assert.equal(await page.locator(`[data-server-id="${s.id}"] [data-field="busy"]`).textContent(), `${s.activeWorkers.length} / ${s.concurrency}`);
    assert.deepEqual(
      (await page.locator(`[data-server-id="${s.id}"] table.workers tbody tr`).evaluateAll((rows) => rows.map((r) => r.getAttribute('data-task-id')))).sort(),
      s.activeWorkers.map((w) => w.taskId).sort(),
    );
    await page.goto(`${base()}/schedulers`);
    const entries = await inspector.schedulerEntries();
    assert.deepEqual(
      await page.locator('table.entries tbody tr').evaluateAll((rows) => rows.map((r) => r.getAttribute('data-entry-id'))),
      entries.map((e) => e.id),
    );
    await page.locator(`tr[data-entry-id="${entryId}"] a`).click();
    await page.waitForURL(/\/schedulers\//);
    const events = await inspector.listSchedulerEnqueueEvents(entryId);
    assert.equal(await page.locator('table.events tbody tr').count(), events.length);
    await page.locator('table.events a').first().click();
    await page.waitForURL((u) => u.pathname === `/queues/cron/tasks/${events[0]?.taskId}`);
  });

  test('refresh swaps only what changed, without reloading the page', async () => {
    await page.goto(base());
    await page.selectOption('#refresh-select', '2000');
    // Browser-side code as strings: the test's tsconfig has no DOM types.
    await page.evaluate("window.marker = 42; document.getElementById('r-history').untouched = 'yes'");
    const before = await cellNumber(page, 'tr[data-queue="default"] td[data-col="pending"]');
    await client.enqueue(new Task('email:send', { to: 'late@example.com' }, { queue: 'default', taskId: 'late-1' }));
    // (waitForFunction would eval in the page, which the CSP forbids: poll from here.)
    await waitFor(async () => (await cellNumber(page, 'tr[data-queue="default"] td[data-col="pending"]')) === before + 1, 15_000, 'the refreshed count');
    assert.equal(await page.evaluate('window.marker'), 42, 'no reload');
    assert.equal(await page.evaluate("document.getElementById('r-history').untouched"), 'yes', 'an unchanged region is the same node');
    assert.match((await page.locator('#updated').textContent()) ?? '', /updated/);
    await page.selectOption('#refresh-select', '0');
  });

  test('actions: each one, confirmed in the browser, changes the database', async () => {
    dialogs.length = 0;
    const flash = async () => (await page.locator('.flash').textContent()) ?? '';

    // Delete one pending task (asks first).
    await page.goto(`${base()}/queues/default?state=pending`);
    await page.click('tr[data-task-id="mail-00"] button[data-op="delete"]');
    await page.waitForSelector('.flash');
    assert.match(await flash(), /Deleted task mail-00/);
    await assert.rejects(inspector.getTaskInfo('default', 'mail-00'), /cannot find task/);
    assert.ok(
      dialogs.some((d) => d.startsWith('confirm: Delete for good task mail-00')),
      dialogs.join('\n'),
    );

    // A dismissed confirmation does nothing.
    acceptConfirm = false;
    const asked = dialogs.length;
    await page.click('tr[data-task-id="mail-01"] button[data-op="delete"]');
    await waitFor(() => dialogs.length > asked, 5000, 'the confirmation');
    acceptConfirm = true;
    await page.waitForLoadState('load');
    assert.equal((await inspector.getTaskInfo('default', 'mail-01')).state, 'pending');

    // Archive a selection.
    await page.check('tr[data-task-id="mail-01"] input[type=checkbox]');
    await page.check('tr[data-task-id="mail-02"] input[type=checkbox]');
    await page.click('button[data-op="archive"][data-scope="selected"]');
    await page.waitForSelector('.flash');
    assert.match(await flash(), /Archived 2 task/);
    assert.equal((await inspector.getTaskInfo('default', 'mail-01')).state, 'archived');
    assert.equal((await inspector.getTaskInfo('default', 'mail-02')).state, 'archived');

    // Run one archived task (no confirmation needed).
    await page.goto(`${base()}/queues/default?state=archived`);
    await page.click('tr[data-task-id="mail-01"] button[data-op="run"]');
    await page.waitForSelector('.flash');
    assert.equal((await inspector.getTaskInfo('default', 'mail-01')).state, 'pending');

    // Run all scheduled.
    await page.goto(`${base()}/queues/critical?state=scheduled`);
    await page.click('button[data-op="run"][data-scope="all"]');
    await page.waitForSelector('.flash');
    assert.match(await flash(), /Ran 8 scheduled task/);
    assert.equal((await inspector.getQueueInfo('critical')).scheduled, 0);

    // Archive all retry; delete all completed.
    await page.goto(`${base()}/queues/critical?state=retry`);
    await page.click('button[data-op="archive"][data-scope="all"]');
    await page.waitForSelector('.flash');
    assert.equal((await inspector.getQueueInfo('critical')).retry, 0);
    await page.goto(`${base()}/queues/critical?state=completed`);
    await page.click('button[data-op="delete"][data-scope="all"]');
    await page.waitForSelector('.flash');
    assert.equal((await inspector.getQueueInfo('critical')).completed, 0);

    // Run all of one group.
    await page.goto(`${base()}/queues/low?state=aggregating&group=g1`);
    await page.click('button[data-op="run"][data-scope="all"]');
    await page.waitForSelector('.flash');
    assert.deepEqual(await inspector.groups('low'), [{ group: 'g2', size: 2 }]);

    // Refusals are shown, not thrown: deleting the (active) orphan is refused by the Inspector.
    await page.goto(`${base()}/queues/critical?state=active`);
    assert.equal(await page.locator('tr[data-task-id="orphan-1"] button[data-op="delete"]').count(), 0, 'active tasks offer cancel only');

    // Cancel one running task: its handler is aborted and the task leaves active.
    const running = (await inspector.listActiveTasks('busy'))[0];
    assert.ok(running);
    await page.goto(`${base()}/queues/busy?state=active`);
    await page.click(`tr[data-task-id="${running.id}"] button[data-op="cancel"]`);
    await page.waitForSelector('.flash');
    assert.match(await flash(), /cancel/i);
    await waitFor(async () => (await inspector.getTaskInfo('busy', running.id)).state !== 'active', 15_000, 'the cancelled task to leave active');

    // Pause and resume from the overview.
    await page.goto(base());
    await page.click('tr[data-queue="low"] button[data-op="pause"]');
    await page.waitForSelector('.flash');
    assert.equal((await inspector.getQueueInfo('low')).paused, true);
    assert.equal(await page.locator('tr[data-queue="low"] td[data-col="paused"]').textContent(), 'yes');
    await page.click('tr[data-queue="low"] button[data-op="resume"]');
    await page.waitForSelector('.flash');
    assert.equal((await inspector.getQueueInfo('low')).paused, false);
    assert.deepEqual(cspErrors, []);
  });

  test('read-only in the browser: no button, no form', async () => {
    const p = await context.newPage();
    try {
      for (const path of ['/', '/queues/critical?state=archived', '/queues/critical/tasks/hook-2']) {
        await p.goto(`http://127.0.0.1:${port.ro}${path}`);
        assert.equal(await p.locator('button[name="do"], form[method="post"]').count(), 0, path);
        assert.equal(await p.locator('.badge', { hasText: 'read-only' }).count(), 1);
      }
    } finally {
      await p.close();
    }
  });

  test('token in the browser: 401 until /?token= once, then the cookie', async () => {
    const ctx = await browser.newContext();
    const p = await ctx.newPage();
    try {
      const denied = await p.goto(`http://127.0.0.1:${port.tok}/servers`);
      assert.equal(denied?.status(), 401);
      assert.match((await p.textContent('h1')) ?? '', /Token required/);
      await p.goto(`http://127.0.0.1:${port.tok}/?token=${TOKEN}`);
      assert.equal(new URL(p.url()).search, '', 'the token is gone from the address bar');
      assert.ok((await p.locator('table.queues tbody tr').count()) > 0);
      const next = await p.goto(`http://127.0.0.1:${port.tok}/servers`);
      assert.equal(next?.status(), 200);
    } finally {
      await ctx.close();
    }
  });

  test('flow control: the queue page shows its limits, the overview marks limited queues, a task page its priority and concurrency key', async () => {
    const tiles = () => page.locator('[data-tile^="limit-"]').evaluateAll((els) => els.map((e) => [e.getAttribute('data-tile'), e.textContent]));
    await page.goto(`${base()}/queues/tenants`);
    assert.deepEqual(await tiles(), [
      ['limit-concurrency', '5concurrency limit'],
      ['limit-key-concurrency', '2limit per key'],
      ['limit-rate', '100 / 1srate limit'],
    ]);
    await page.goto(`${base()}/queues/default`);
    assert.deepEqual(await tiles(), [], 'a queue without limits has no limit tiles');

    await page.goto(base());
    const marker = page.locator('tr[data-queue="tenants"] [data-limits]');
    assert.equal(await marker.textContent(), 'limited');
    assert.equal(await marker.getAttribute('title'), 'concurrency 5 · per key 2 · rate 100 / 1s');
    assert.equal(await page.locator('table.queues [data-limits]').count(), 1, 'only the limited queue is marked');

    await page.goto(`${base()}/queues/tenants/tasks/t-high`);
    assert.equal(await page.locator('[data-field="priority"]').textContent(), '42');
    assert.equal(await page.locator('[data-field="concurrency-key"]').textContent(), TENANT_KEY, 'the key is text');
    assert.equal(await page.locator('[data-field="concurrency-key"] b').count(), 0);
    await page.goto(`${base()}/queues/tenants/tasks/t-plain`);
    assert.equal(await page.locator('[data-field="priority"], [data-field="concurrency-key"]').count(), 0, 'priority 0 and no key: not shown');

    // A change shows on the next load: only the rate left, its interval exact.
    await inspector.setQueueLimits('tenants', { concurrency: null, keyConcurrency: null, rateLimit: { limit: 10, interval: 90_000 } });
    try {
      await page.goto(`${base()}/queues/tenants`);
      assert.deepEqual(await tiles(), [['limit-rate', '10 / 1m30srate limit']]);
      // The overview reads every queue at most once a second.
      await waitFor(
        async () => {
          await page.goto(base());
          return (await marker.getAttribute('title')) === 'rate 10 / 1m30s';
        },
        10_000,
        'the new limits on the overview',
      );
      await inspector.setQueueLimits('tenants', { concurrency: null, keyConcurrency: null, rateLimit: null });
      await page.goto(`${base()}/queues/tenants`);
      assert.deepEqual(await tiles(), []);
    } finally {
      await inspector.setQueueLimits('tenants', TENANT_LIMITS);
    }
    assert.deepEqual(cspErrors, []);
  });

  test('phone width: nothing overflows the viewport', async () => {
    const ctx = await browser.newContext({ viewport: { width: 390, height: 844 }, deviceScaleFactor: SHOTS ? 2 : 1, isMobile: true });
    const p = await ctx.newPage();
    try {
      for (const path of [
        '/',
        '/queues/default?state=pending',
        '/queues/low/tasks/xss',
        '/queues/flow?state=waiting',
        '/queues/flow/tasks/b',
        '/queues/tenants',
        '/queues/tenants/tasks/t-high',
        '/servers',
      ]) {
        await p.goto(`http://127.0.0.1:${port.dash}${path}`);
        const overflow = await p.evaluate<number>('document.documentElement.scrollWidth - window.innerWidth');
        assert.ok(overflow <= 1, `${path} overflows by ${overflow} px`);
      }
      if (SHOTS) {
        await p.goto(`http://127.0.0.1:${port.dash}/`);
        await p.locator('#live-chart svg').waitFor();
        await p.screenshot({ path: 'docs/dashboard-phone.png', fullPage: false });
      }
    } finally {
      await ctx.close();
    }
  });
});
