/**
 * The dashboard in a real browser (Debian's Chromium through playwright-core),
 * page by page against seeded data: user strings render as text, every number
 * is the Inspector's, queue, task, workflow, server and scheduler pages, live
 * refresh, flow-control limits, and phone width.
 */
import assert from 'node:assert/strict';
import { after, before, describe } from 'node:test';
import type { Browser, BrowserContext, Page } from 'playwright-core';
import { Task, type QueueInfo } from '../src/index.js';
import { browserSkip } from './browser.js';
import { SHOTS, TENANT_KEY, TENANT_LIMITS, XSS_TYPE, cellNumber, http, openBrowser, setupDashboard } from './dashboard-kit.js';
import { test, waitFor } from './helpers.js';

const { client, inspector, port, seeded } = setupDashboard('t_dashboard_browser_pages');

describe('in the browser', { skip: browserSkip() }, () => {
  let browser: Browser, context: BrowserContext, page: Page, dialogs: string[], cspErrors: string[];
  const base = () => `http://127.0.0.1:${port.dash}`;
  before(async () => ({ browser, context, page, dialogs, cspErrors } = await openBrowser(base())));
  after(() => browser?.close());

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
    assert.ok((await page.locator('#r-lease').textContent())?.includes(seeded.server.id), 'the lease owner is the live server');
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
    await page.locator(`tr[data-entry-id="${seeded.entryId}"] a`).click();
    await page.waitForURL(/\/schedulers\//);
    const events = await inspector.listSchedulerEnqueueEvents(seeded.entryId);
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
