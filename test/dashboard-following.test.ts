/**
 * The task page following a task, against tasks a real Server runs: the
 * progress bar (a number, an object's done/total), every run in the
 * timeline with its outcome, server, times and error, and the newest log
 * lines; all of it escaped, and with hidePayloads the errors, lines and
 * progress objects kept on the server. Over HTTP, and in Chromium, which
 * with DASHBOARD_SCREENSHOTS=1 writes docs/dashboard-task-following.png.
 */
import assert from 'node:assert/strict';
import { after, before, describe } from 'node:test';
import type { Browser, Page } from 'playwright-core';
import { Server, Task, createDashboard, type Dashboard, type TaskContext } from '../src/index.js';
import { browserSkip } from './browser.js';
import { SHOTS, http, openBrowser } from './dashboard-kit.js';
import { deferred, setupDb, test, waitFor } from './helpers.js';

const Q = 'shipping';
const XSS = { log: '<script>alert("log")</script>', error: '<script>alert("error")</script>', progress: '<script>alert("progress")</script>' };
const release = deferred();
const step = deferred();
let server: Server | undefined;
let dash: Dashboard | undefined;
let hid: Dashboard | undefined;
const port = { dash: 0, hid: 0 };

async function handler(task: Task, ctx: TaskContext): Promise<void> {
  switch (task.type) {
    case 'label:print':
      ctx.log('fetching carrier rates');
      if (ctx.attempt === 1) throw new Error('ECONNRESET: the carrier API closed the connection');
      ctx.log('carrier API: 503 Service Unavailable, Retry-After: 30');
      if (ctx.attempt === 2) throw new Error('carrier API answered 503 Service Unavailable\n  at fetchRates (carrier.ts:41)');
      ctx.log('4 offers; cheapest: DHL Paket, 12.40 EUR');
      for (let i = 1; i <= 8; i++) ctx.log(`label ${i} of 12 printed`);
      await ctx.progress(65);
      await release.promise;
      return;
    case 'upload':
      await ctx.progress({ done: 3, total: 4, stage: 'uploading part 4' });
      return;
    case 'xss':
      ctx.log(XSS.log);
      await ctx.progress({ note: XSS.progress });
      if (ctx.attempt === 1) throw new Error(XSS.error);
      return;
    case 'live':
      ctx.log('step 1');
      await ctx.progress(20);
      await step.promise;
      ctx.log('step 2');
      await ctx.progress(80);
      await release.promise;
      return;
    case 'chatty':
      for (let i = 1; i <= 250; i++) ctx.log(`line ${i}`);
      await ctx.progress(100);
      return;
  }
}

const { client, inspector } = setupDb('t_dashboard_following', {
  setup: async (testDb) => {
    const conn = { connectionString: testDb.connectionString, schema: testDb.schema };
    server = new Server({ ...conn, logger: false, queues: { [Q]: 1 }, concurrency: 4, taskCheckInterval: 50, retryDelay: () => 0, shutdownTimeout: 500 });
    await server.start(handler);
    const opts = { queue: Q, retention: 3_600_000, maxRetry: 5 };
    await client.enqueue(new Task('label:print', { order: 'A-1042', labels: 12 }), { ...opts, taskId: 'ship-1' });
    await client.enqueue(new Task('upload', null), { ...opts, taskId: 'up-1' });
    await client.enqueue(new Task('xss', null), { ...opts, taskId: 'xss-1' });
    await client.enqueue(new Task('chatty', null), { ...opts, taskId: 'chatty-1' });
    await client.enqueue(new Task('idle', null), { queue: 'idle', taskId: 'idle-1' });
    const state = async (id: string) => (await inspector.getTaskInfo(Q, id)).state;
    await waitFor(async () => (await inspector.getTaskInfo(Q, 'ship-1')).progress === 65, 30_000, 'ship-1 at 65 %');
    for (const id of ['up-1', 'xss-1', 'chatty-1']) await waitFor(async () => (await state(id)) === 'completed', 30_000, `${id} completed`);
    dash = createDashboard({ ...conn, refreshInterval: 5000 });
    hid = createDashboard({ ...conn, hidePayloads: true });
    port.dash = (await dash.listen(0)).port;
    port.hid = (await hid.listen(0)).port;
  },
  teardown: async () => {
    step.resolve();
    release.resolve();
    await Promise.all([dash?.close(), hid?.close()]);
    await server?.shutdown();
  },
});

const page = async (p: number, id: string, queue = Q) => {
  const r = await http(p, 'GET', `/queues/${queue}/tasks/${id}`);
  assert.equal(r.status, 200, r.body.slice(0, 300));
  return r.body;
};
/** The markup of the element with this id (a region), up to the next region. */
const region = (body: string, id: string) => body.slice(body.indexOf(`id="${id}"`), body.indexOf('data-region', body.indexOf(`id="${id}"`) + 1));

describe('HTTP', () => {
  test('a running task: the bar at its percentage, every run in the timeline with its error, the log lines with time and attempt', async () => {
    const body = await page(port.dash, 'ship-1');
    const attempts = await inspector.listAttempts(Q, 'ship-1');
    assert.deepEqual(
      attempts.map((a) => a.outcome),
      ['failed', 'failed', 'running'],
    );
    const progress = region(body, 'r-progress');
    assert.match(progress, /role="progressbar" aria-label="Progress" aria-valuemin="0" aria-valuemax="100" aria-valuenow="65" aria-valuetext="65 %"/);
    assert.match(progress, /<rect class="meter-fg" x="0" y="0" width="65\.00"/);
    assert.match(progress, /data-field="progress">65 %</);
    assert.doesNotMatch(progress, /style=/, 'no style attribute: the CSP forbids them');

    const timeline = region(body, 'r-timeline');
    assert.match(timeline, /<h2>Timeline <span class="muted small">3 runs<\/span><\/h2>/);
    assert.equal(timeline.match(/<li class="attempt"/g)?.length, 3);
    assert.match(
      timeline,
      /data-attempt="1" data-outcome="failed">.*<strong>attempt 1 of 6<\/strong> <span class="badge badge-bad">failed<\/span>.*ended <time/s,
    );
    assert.match(timeline, /ECONNRESET: the carrier API closed the connection<\/pre>/);
    assert.match(timeline, /carrier API answered 503 Service Unavailable\n {2}at fetchRates \(carrier\.ts:41\)<\/pre>/, 'the whole error, lines kept');
    assert.match(timeline, /data-attempt="3" data-outcome="running">.*<span class="badge badge-active">running<\/span>.*running for/s);
    assert.equal(timeline.match(/ · on [^<:]+:\d+<\/span>/g)?.length, 3, 'a live server by host and pid');
    assert.doesNotMatch(timeline, /<strong>started<\/strong>|<strong>failed<\/strong>/, 'the runs say when it started and failed');
    assert.ok(timeline.indexOf('<strong>enqueued</strong>') < timeline.indexOf('data-attempt="1"'), 'in time order');

    const logs = region(body, 'r-logs');
    const lines = await inspector.getTaskLogs(Q, 'ship-1');
    assert.equal(lines.length, 14);
    assert.match(logs, /<h2>Log <span class="muted small">14 lines<\/span><\/h2>/);
    assert.equal(logs.match(/<tr data-attempt="/g)?.length, 14);
    assert.match(
      logs,
      /<tr data-attempt="2"><td><time datetime="[^"]+" title="[^"]+">[^<]+<\/time><\/td><td class="num">2<\/td><td class="log-msg">carrier API: 503 Service Unavailable, Retry-After: 30<\/td><\/tr>/,
    );
    assert.doesNotMatch(logs, /data-truncated/);
  });

  test('an object with done and total: the bar at done/total and the JSON; the newest 200 lines of 250; a task with none of it: nothing new', async () => {
    const upload = await page(port.dash, 'up-1');
    const [run] = await inspector.listAttempts(Q, 'up-1');
    assert.match(upload, /aria-valuenow="75" aria-valuetext="3 of 4 \(75 %\)"/);
    assert.match(
      region(upload, 'r-timeline'),
      new RegExp(`data-outcome="completed">.* · server <code title="${run!.serverId}">${run!.serverId!.slice(0, 8)}</code></span></li>`),
      'a server that is not running it now: by its id',
    );
    assert.match(upload, /<pre class="code progress-json" data-block="progress">\{\n {2}&quot;done&quot;: 3,/);
    assert.match(upload, /uploading part 4/);

    const chatty = await page(port.dash, 'chatty-1');
    assert.match(chatty, /<p class="muted small" data-truncated="logs">Showing the last 200 of 250 lines\.<\/p>/);
    assert.equal(region(chatty, 'r-logs').match(/<tr data-attempt="/g)?.length, 200);
    assert.match(chatty, /<td class="log-msg">line 51<\/td>/);
    assert.doesNotMatch(chatty, /<td class="log-msg">line 50<\/td>/);
    assert.match(chatty, /<td class="log-msg">line 250<\/td><\/tr><\/tbody>/, 'oldest first, the newest last');

    const idle = await page(port.dash, 'idle-1', 'idle');
    assert.doesNotMatch(idle, /progressbar|data-card="logs"|class="attempt"/);
    assert.match(idle, /<div data-region id="r-progress"><\/div>/, 'the regions are there for a refresh to fill');
    assert.match(idle, /<div data-region id="r-logs"><\/div>/);
  });

  test('a log line, an error and a progress object holding <script> are text', async () => {
    const body = await page(port.dash, 'xss-1');
    const withoutOurScripts = body.replace(/<script src="[^"]+" defer><\/script>/g, '');
    assert.doesNotMatch(withoutOurScripts, /<script/i);
    assert.match(region(body, 'r-logs'), /<td class="log-msg">&lt;script&gt;alert\(&quot;log&quot;\)&lt;\/script&gt;<\/td>/);
    assert.match(region(body, 'r-timeline'), /data-block="attempt-error">&lt;script&gt;alert\(&quot;error&quot;\)&lt;\/script&gt;<\/pre>/);
    assert.match(region(body, 'r-progress'), /&lt;script&gt;alert\(\\&quot;progress\\&quot;\)&lt;\/script&gt;/);
  });

  test('hidePayloads: no error, log line or progress object leaves the server; the bar, the runs and their outcomes do', async () => {
    for (const id of ['ship-1', 'xss-1', 'up-1', 'chatty-1']) {
      const body = await page(port.hid, id);
      for (const secret of ['ECONNRESET', 'Service Unavailable', 'carrier', 'label 1', 'alert(', 'uploading', 'line 1', 'DHL'])
        assert.ok(!body.includes(secret), `${id} leaks ${secret}`);
      assert.match(region(body, 'r-logs'), /Hidden: the dashboard runs with --hide-payloads/);
    }
    const ship = await page(port.hid, 'ship-1');
    assert.match(ship, /aria-valuenow="65"/);
    assert.equal(region(ship, 'r-timeline').match(/<li class="attempt"/g)?.length, 3);
    assert.equal(region(ship, 'r-timeline').match(/error hidden/g)?.length, 2);
    const upload = await page(port.hid, 'up-1');
    assert.match(upload, /aria-valuenow="75"/, 'done and total are numbers: the bar stays');
    assert.match(region(upload, 'r-progress'), /Hidden: the dashboard runs with --hide-payloads/);
  });
});

describe('in the browser', { skip: browserSkip() }, () => {
  let browser: Browser, p: Page, dialogs: string[], cspErrors: string[];
  const base = () => `http://127.0.0.1:${port.dash}`;
  before(async () => ({ browser, page: p, dialogs, cspErrors } = await openBrowser(base())));
  after(() => browser?.close());

  test('the bar is drawn at 65 %, the runs and the log lines are visible; nothing a handler wrote runs', async () => {
    await p.goto(`${base()}/queues/${Q}/tasks/ship-1`);
    const bar = p.getByRole('progressbar', { name: 'Progress' });
    await bar.waitFor({ state: 'visible' });
    assert.equal(await bar.getAttribute('aria-valuenow'), '65');
    const [bg, fg] = await Promise.all([bar.locator('rect.meter-bg').boundingBox(), bar.locator('rect.meter-fg').boundingBox()]);
    assert.ok(bg && fg && bg.width > 200, `the bar has a width (${bg?.width})`);
    assert.ok(Math.abs(fg.width / bg.width - 0.65) < 0.01, `filled to 65 % (${fg.width} of ${bg.width})`);
    assert.equal(await p.locator('[data-field="progress"]').textContent(), '65 %');

    const runs = p.locator('#r-timeline li.attempt');
    assert.equal(await runs.count(), 3);
    for (let i = 0; i < 3; i++) assert.ok(await runs.nth(i).isVisible(), `run ${i + 1} visible`);
    assert.match((await runs.nth(0).textContent()) ?? '', /attempt 1 of 6\s+failed.*ECONNRESET/s);
    assert.match((await runs.nth(2).textContent()) ?? '', /attempt 3 of 6\s+running/);
    assert.ok(await p.locator('#r-logs table.logs').isVisible());
    assert.equal(await p.locator('#r-logs tbody tr').count(), 14);

    await p.goto(`${base()}/queues/${Q}/tasks/xss-1`);
    assert.equal(await p.locator('#r-logs td.log-msg').first().textContent(), XSS.log);
    assert.equal(await p.locator('main script').count(), 0);
    assert.deepEqual(dialogs, [], 'no script ran');
    assert.deepEqual(cspErrors, [], 'the page breaks none of its own CSP');
  });

  test('a refresh moves the bar and adds the new lines, without reloading the page', async () => {
    await client.enqueue(new Task('live', null), { queue: Q, taskId: 'live-1' });
    await waitFor(async () => (await inspector.getTaskInfo(Q, 'live-1')).progress === 20, 30_000, 'live-1 at 20 %');
    await p.goto(`${base()}/queues/${Q}/tasks/live-1`);
    assert.equal(await p.getByRole('progressbar').getAttribute('aria-valuenow'), '20');
    await p.selectOption('#refresh-select', '2000');
    try {
      await p.evaluate('window.marker = 42');
      step.resolve();
      await waitFor(async () => (await p.getByRole('progressbar').getAttribute('aria-valuenow')) === '80', 15_000, 'the bar at 80');
      await waitFor(async () => (await p.locator('#r-logs td.log-msg').allTextContents()).join() === 'step 1,step 2', 15_000, 'the new line');
      assert.equal(await p.evaluate('window.marker'), 42, 'no reload');
    } finally {
      await p.selectOption('#refresh-select', '0');
    }
  });

  test('phone width: the task page does not overflow', async () => {
    const ctx = await browser.newContext({ viewport: { width: 390, height: 844 }, isMobile: true });
    try {
      const phone = await ctx.newPage();
      for (const id of ['ship-1', 'up-1', 'chatty-1']) {
        await phone.goto(`${base()}/queues/${Q}/tasks/${id}`);
        const overflow = await phone.evaluate<number>('document.documentElement.scrollWidth - window.innerWidth');
        assert.ok(overflow <= 1, `${id} overflows by ${overflow} px`);
      }
    } finally {
      await ctx.close();
    }
  });

  test('screenshot for the README (DASHBOARD_SCREENSHOTS=1)', { skip: !SHOTS }, async () => {
    // Show the default refresh interval (the other tests turn refresh off).
    await p.evaluate("localStorage.removeItem('pgasynq.refresh')");
    try {
      await p.goto(`${base()}/queues/${Q}/tasks/ship-1`);
      await p.screenshot({ path: 'docs/dashboard-task-following.png', fullPage: true });
    } finally {
      await p.evaluate("localStorage.setItem('pgasynq.refresh', '0')");
    }
  });
});
