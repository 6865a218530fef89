/**
 * The dashboard's actions in a real browser (Debian's Chromium through
 * playwright-core): each one, confirmed or dismissed, checked in the database,
 * on the waiting tab too; and no action in read-only, none before the token.
 */
import assert from 'node:assert/strict';
import { after, before, describe } from 'node:test';
import type { Browser, BrowserContext, Page } from 'playwright-core';
import { browserSkip } from './browser.js';
import { TOKEN, cellNumber, openBrowser, setupDashboard, type BrowserRun } from './dashboard-kit.js';
import { test, waitFor } from './helpers.js';

const { inspector, port } = setupDashboard('t_dashboard_browser_actions');

describe('in the browser', { skip: browserSkip() }, () => {
  let run: BrowserRun, browser: Browser, context: BrowserContext, page: Page, dialogs: string[], cspErrors: string[];
  const base = () => `http://127.0.0.1:${port.dash}`;
  before(async () => ({ browser, context, page, dialogs, cspErrors } = run = await openBrowser(base())));
  after(() => browser?.close());

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
    run.acceptConfirm = false;
    const asked = dialogs.length;
    await page.click('tr[data-task-id="mail-01"] button[data-op="delete"]');
    await waitFor(() => dialogs.length > asked, 5000, 'the confirmation');
    run.acceptConfirm = true;
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
});
