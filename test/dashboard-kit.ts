/**
 * What the dashboard's test files share (not a test file itself): the seeded
 * data every page is checked against, a live server and scheduler, the four
 * dashboards under test (default, read-only, with a token, hiding payloads),
 * an HTTP client with sessions and forms, and the browser suites' Chromium.
 *
 * DASHBOARD_SCREENSHOTS=1 makes the browser tests write the README's screenshots to docs/.
 */
import assert from 'node:assert/strict';
import { request } from 'node:http';
import type { Browser, BrowserContext, Page } from 'playwright-core';
import { Scheduler, Server, Task, createDashboard, type Dashboard } from '../src/index.js';
import { launchBrowser } from './browser.js';
import { setupDb, waitFor, type TestFile } from './helpers.js';

export const XSS_TYPE = '<img src=x onerror=alert(1)>';
export const TENANT_KEY = 'acme <b>corp</b>';
export const TENANT_LIMITS = { concurrency: 5, keyConcurrency: 2, rateLimit: { limit: 100, interval: 1000 } };
export const TOKEN = 'test-token-0123456789';
export const SHOTS = process.env.DASHBOARD_SCREENSHOTS === '1';

// ------------------------------------------------------------------ HTTP helper

export interface Res {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: string;
}

/** One request to 127.0.0.1:`p`, Host set to it unless `headers` say otherwise. */
export function http(p: number, method: string, path: string, headers: Record<string, string> = {}, body?: string): Promise<Res> {
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
export function cookiesOf(r: Res): string {
  const set = r.headers['set-cookie'];
  return (Array.isArray(set) ? set : set ? [set] : []).map((c) => c.split(';')[0]).join('; ');
}

/** A session on a dashboard: its cookie and a CSRF token, read from the overview's forms. */
export async function session(p: number, extra: Record<string, string> = {}): Promise<{ cookie: string; csrf: string }> {
  const r = await http(p, 'GET', '/', extra);
  assert.equal(r.status, 200);
  const csrf = /name="csrf" value="([^"]+)"/.exec(r.body)?.[1];
  assert.ok(csrf, 'the overview has forms with a CSRF token');
  return { cookie: cookiesOf(r), csrf };
}

/** An urlencoded form body; an array value repeats its field. */
export function form(fields: Record<string, string | string[]>): string {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(fields)) for (const x of Array.isArray(v) ? v : [v]) q.append(k, x);
  return q.toString();
}

export const FORM = 'application/x-www-form-urlencoded';

// ------------------------------------------------------------------ seeding

/** A dashboard test file: setupDb's, plus the dashboards' ports and what seeding started. */
export interface DashboardFile extends TestFile {
  conn: { connectionString: string; schema: string };
  /** The ports of the dashboards under test: default, read-only, with a token, hiding payloads. */
  port: Record<'dash' | 'ro' | 'tok' | 'hid', number>;
  /** The live server (running two tasks of "busy"), the scheduler, and its one entry's id. */
  seeded: { server: Server; scheduler: Scheduler; entryId: string };
}

/** The data the pages are checked against: tasks in every state, workflows, flow control, a live server and a scheduler. */
async function seed({ db, client, inspector, conn, seeded }: DashboardFile): Promise<void> {
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
  seeded.server = new Server({ ...conn, queues: { busy: 1 }, concurrency: 2, shutdownTimeout: 500, recoverCutoff: 600_000 });
  await seeded.server.start(
    (_task, ctx) => new Promise<void>((_resolve, reject) => ctx.signal.addEventListener('abort', () => reject(ctx.signal.reason), { once: true })),
  );
  await waitFor(async () => (await inspector.getQueueInfo('busy')).active === 2, 20_000, 'two active tasks');

  // A scheduler entry, and an enqueue history for it. The history is written
  // before the scheduler starts, with the current hour's tick handled, so it
  // has no tick to catch up (which would add a task mid-test).
  seeded.scheduler = new Scheduler(conn);
  seeded.entryId = seeded.scheduler.register('@every 1h', new Task('report:daily', { kind: 'daily' }), { queue: 'cron' });
  await db.query(
    `INSERT INTO {{schema}}.scheduler_events (entry_id, tick_at, task_id, enqueued_at)
     VALUES ($1, date_trunc('hour', now()) - interval '1 hour', 'cron-0', date_trunc('hour', now()) - interval '1 hour'),
            ($1, date_trunc('hour', now()), 'cron-1', date_trunc('hour', now()))`,
    [seeded.entryId],
  );
  await seeded.scheduler.start();
  await waitFor(async () => (await inspector.schedulerEntries()).length === 1, 20_000, 'the scheduler entry');
}

/**
 * Registers a dashboard test file on schema `name`: seeded before its tests,
 * its four dashboards listening on ports of their own. The server and the
 * scheduler live through the whole file (seed starts them): they are not the
 * afterEach's to shut down.
 */
export function setupDashboard(name: string): DashboardFile {
  let dash: Dashboard, ro: Dashboard, tok: Dashboard, hid: Dashboard;
  const port: DashboardFile['port'] = { dash: 0, ro: 0, tok: 0, hid: 0 };
  const seeded = {} as DashboardFile['seeded'];
  const file = setupDb(name, {
    setup: async () => {
      await seed(out);
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
      await seeded.scheduler?.shutdown();
      await seeded.server?.shutdown();
    },
  });
  const conn = { connectionString: file.db.connectionString, schema: file.db.schema };
  const out: DashboardFile = { ...file, conn, port, seeded };
  return out;
}

// ------------------------------------------------------------------ browser

/** Number in a cell, thousands separators dropped. */
export const cellNumber = async (p: Page, selector: string) => Number(((await p.locator(selector).first().textContent()) ?? '').replace(/[,\s]/g, ''));

/** What a browser suite watches: every dialog, CSP refusals and page errors; confirm() is accepted while acceptConfirm holds. */
export interface BrowserRun {
  browser: Browser;
  context: BrowserContext;
  page: Page;
  dialogs: string[];
  cspErrors: string[];
  acceptConfirm: boolean;
}

/** Chromium with a 1280×900 page on the dashboard at `base`, auto-refresh turned off, watched as {@link BrowserRun} says. */
export async function openBrowser(base: string): Promise<BrowserRun> {
  const browser = await launchBrowser();
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await context.newPage();
  const run: BrowserRun = { browser, context, page, dialogs: [], cspErrors: [], acceptConfirm: true };
  // Every dialog is recorded; confirm() is accepted (unless a test says otherwise) so actions go through.
  page.on('dialog', (d) => {
    run.dialogs.push(`${d.type()}: ${d.message()}`);
    void (d.type() === 'confirm' && run.acceptConfirm ? d.accept() : d.dismiss());
  });
  page.on('console', (m) => {
    if (/Content.Security.Policy|Refused to/i.test(m.text())) run.cspErrors.push(m.text());
  });
  page.on('pageerror', (e) => run.cspErrors.push(`page error: ${e.message}`));
  // No auto-refresh under the other tests' feet: the refresh test turns it on for itself.
  await page.goto(base);
  await page.evaluate("localStorage.setItem('pgasynq.refresh', '0')");
  return run;
}
