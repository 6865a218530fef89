/**
 * Attempt numbers are 1-based on every surface: attempt n is the n-th run of
 * a task (retried + 1 while it runs). Two real tasks: one that fails twice and
 * then succeeds (maxRetry 5), one that fails until it is archived (maxRetry
 * 2). Each surface is checked against them: the handler's ctx, ctx.logger's
 * lines, the worker's failure and archive lines (and the recoverer's),
 * `pgasynq task inspect`, and the dashboard's task page in Chromium.
 */
import assert from 'node:assert/strict';
import { after, before, describe } from 'node:test';
import type { Browser, Page } from 'playwright-core';
import { Task, createDashboard, type Dashboard, type TaskContext, type TaskInfo } from '../src/index.js';
import { Db } from '../src/broker/db.js';
import { Recoverer } from '../src/server/recoverer.js';
import { StatsCollector } from '../src/server/stats.js';
import { browserSkip, launchBrowser } from './browser.js';
import { captureLog, type LogLine } from './logs.js';
import { DATABASE_URL, runCli, setupDb, test, waitFor } from './helpers.js';

// In setup: after the schema is made (a before() of the file's own could run first).
const { db, client, inspector, startServer } = setupDb('t_attempt', { setup: () => runFlakyAndDoomed() });
const log = captureLog('debug');
/** What each run's ctx said, per task id. */
const seen = new Map<string, { attempt: number; retryCount: number; maxRetry: number }[]>();
let flaky: TaskInfo;
let doomed: TaskInfo;

const linesOf = (msg: string, id: string) => log.lines.filter((l) => l.msg === msg && (l.task as { id?: string } | undefined)?.id === id);
const attemptOf = (l: LogLine) => (l.task as { attempt: number }).attempt;

/** Runs a task that fails twice then succeeds (flaky) and one that fails every run (doomed), with a server of its own. */
async function runFlakyAndDoomed(): Promise<void> {
  const server = await startServer(
    async (task: Task, ctx: TaskContext) => {
      const runs = seen.get(ctx.taskId) ?? [];
      runs.push({ attempt: ctx.attempt, retryCount: ctx.retryCount, maxRetry: ctx.maxRetry });
      seen.set(ctx.taskId, runs);
      ctx.logger.info({ run: runs.length }, 'handler ran');
      if (task.type === 'doomed' || ctx.retryCount < 2) throw new Error(`boom on run ${runs.length}`);
    },
    {
      logger: log.logger,
      concurrency: 2,
      taskCheckInterval: 50,
      delayedTaskCheckInterval: 50,
      leaseDuration: 2000,
      heartbeatInterval: 200,
      retryDelay: () => 0,
    },
  );
  try {
    const f = await client.enqueue(new Task('flaky'), { maxRetry: 5, retention: 3_600_000 });
    const d = await client.enqueue(new Task('doomed'), { maxRetry: 2 });
    flaky = await waitFor(async () => ((await inspector.getTaskInfo('default', f.id)).state === 'completed' ? inspector.getTaskInfo('default', f.id) : null));
    doomed = await waitFor(async () => ((await inspector.getTaskInfo('default', d.id)).state === 'archived' ? inspector.getTaskInfo('default', d.id) : null));
  } finally {
    await server.shutdown();
  }
}

describe('the worker', () => {
  test('ctx.attempt is 1, 2, 3 over three runs; retryCount keeps asynq’s 0, 1, 2', () => {
    assert.deepEqual(seen.get(flaky.id), [
      { attempt: 1, retryCount: 0, maxRetry: 5 },
      { attempt: 2, retryCount: 1, maxRetry: 5 },
      { attempt: 3, retryCount: 2, maxRetry: 5 },
    ]);
    assert.deepEqual(
      seen.get(doomed.id)?.map((r) => r.attempt),
      [1, 2, 3],
    );
    assert.equal(flaky.retried, 2, 'TaskInfo.retried: the retries used');
    assert.equal(doomed.retried, 2, 'the failure that archives uses no retry (asynq)');
  });

  test('ctx.logger lines carry task.attempt, the same number as ctx.attempt', () => {
    assert.deepEqual(linesOf('handler ran', flaky.id).map(attemptOf), [1, 2, 3]);
    assert.deepEqual(linesOf('handler ran', doomed.id).map(attemptOf), [1, 2, 3]);
  });

  test('the failure line names the attempt that failed, of maxRetry + 1, with the retries spent before it', () => {
    const failed = linesOf('task failed; will retry', flaky.id);
    assert.deepEqual(failed.map(attemptOf), [1, 2], 'the first failure is attempt 1');
    for (const [i, l] of failed.entries()) {
      assert.deepEqual(l.task, { id: flaky.id, type: 'flaky', queue: 'default', attempt: i + 1 });
      assert.equal(l.maxAttempts, 6);
      assert.deepEqual([l.retried, l.maxRetry], [i, 5], 'retried as ctx.retryCount saw it: attempt − 1');
      assert.equal((l.err as { message: string }).message, `boom on run ${i + 1}`, 'the attempt number matches the run that threw');
    }
    assert.deepEqual(linesOf('task failed; will retry', doomed.id).map(attemptOf), [1, 2]);
  });

  test('the archive line names the last attempt: 3 of 3 with maxRetry 2', () => {
    const [archived, ...more] = linesOf('task archived', doomed.id);
    assert.ok(archived);
    assert.deepEqual(more, []);
    assert.deepEqual(archived.task, { id: doomed.id, type: 'doomed', queue: 'default', attempt: 3 });
    assert.equal(archived.maxAttempts, 3);
    assert.deepEqual([archived.retried, archived.maxRetry], [2, 2]);
    assert.equal(archived.reason, 'retries-exhausted');
    assert.equal((archived.err as { message: string }).message, 'boom on run 3');
  });

  test('the recoverer’s archive line: the attempt whose lease expired', async () => {
    const broker = new Db({ connectionString: db.connectionString, schema: db.schema });
    const own = captureLog('debug');
    try {
      const info = await client.enqueue(new Task('stalled'), { queue: 'rec', maxRetry: 2, processIn: 3_600_000 });
      await db.query(
        `UPDATE {{schema}}.tasks SET state = 'active', retried = 2, run_at = NULL, lease_owner = 'gone',
           lease_token = gen_random_uuid(), lease_expires_at = now() - interval '1 minute' WHERE queue = 'rec' AND id = $1`,
        [info.id],
      );
      const recoverer = new Recoverer(
        broker,
        own.logger,
        { recoverInterval: 60_000, recoverCutoff: 0, leaseDuration: 30_000, retryDelay: undefined },
        new StatsCollector(broker),
      );
      assert.deepEqual(await recoverer.runOnce(), { retried: 0, archived: 1 });
      const line = await own.find('task archived');
      assert.deepEqual(line.task, { id: info.id, type: 'stalled', queue: 'rec', attempt: 3 });
      assert.equal(line.maxAttempts, 3);
      assert.deepEqual([line.retried, line.maxRetry], [2, 2]);
    } finally {
      await broker.close();
    }
  });
});

/** `pgasynq task inspect` of a task in the test schema: its lines by field name. */
async function inspect(queue: string, id: string): Promise<Map<string, string>> {
  const r = await runCli(['--database-url', DATABASE_URL, '--schema', db.schema, 'task', 'inspect', queue, id]);
  assert.equal(r.code, 0, r.stderr);
  return new Map(
    r.stdout
      .split('\n')
      .map((l) => /^([a-z ]+):\s+(.*)$/.exec(l))
      .filter((m) => m !== null)
      .map((m) => [m[1]!, m[2]!]),
  );
}

/** A task in the retry state after its first failure, as a worker leaves it. */
async function retryTask(): Promise<TaskInfo> {
  const info = await client.enqueue(new Task('later'), { queue: 'waits', maxRetry: 2, processIn: 3_600_000 });
  await db.query("UPDATE {{schema}}.tasks SET state = 'retry', retried = 1, error_msg = 'boom', last_failed_at = now() WHERE queue = 'waits' AND id = $1", [
    info.id,
  ]);
  return inspector.getTaskInfo('waits', info.id);
}

describe('pgasynq task inspect', () => {
  test('an attempt line, and which attempt failed last', async () => {
    const retry = await retryTask();
    const [a, c, r] = await Promise.all([inspect('default', doomed.id), inspect('default', flaky.id), inspect('waits', retry.id)]);
    assert.equal(a.get('retried'), '2 of 2');
    assert.equal(a.get('attempt'), '3 of 3, the last');
    assert.match(a.get('last failed at') ?? '', /, attempt 3 of 3$/);
    assert.equal(c.get('attempt'), '3 of 6, the last');
    assert.match(c.get('last failed at') ?? '', /, attempt 2 of 6$/);
    assert.equal(r.get('attempt'), '2 of 3, next');
    assert.match(r.get('last failed at') ?? '', /, attempt 1 of 3$/);
  });
});

describe('the dashboard’s task page', { skip: browserSkip() }, () => {
  let browser: Browser;
  let page: Page;
  let dash: Dashboard;
  let base: string;

  before(async () => {
    dash = createDashboard({ connectionString: db.connectionString, schema: db.schema });
    base = `http://127.0.0.1:${(await dash.listen(0)).port}`;
    browser = await launchBrowser();
    page = await (await browser.newContext()).newPage();
  });

  after(async () => {
    await browser?.close();
    await dash?.close();
  });

  /** Each run's entry in the timeline, as `attempt N of M <outcome>`. */
  const runs = () =>
    page
      .locator('ol.timeline li.attempt')
      .evaluateAll((lis) => lis.map((li) => `${li.querySelector('strong')?.textContent} ${li.querySelector('.badge')?.textContent}`));

  test('the timeline lists every run with the attempt it was and its outcome; the facts name the attempt', async () => {
    const retry = await retryTask();
    await page.goto(`${base}/queues/default/tasks/${doomed.id}`);
    assert.deepEqual(await runs(), ['attempt 1 of 3 failed', 'attempt 2 of 3 failed', 'attempt 3 of 3 failed'], 'archived with maxRetry 2');
    assert.equal(await page.locator('[data-field="attempt"]').textContent(), '3 of 3, the last');
    await page.goto(`${base}/queues/default/tasks/${flaky.id}`);
    assert.deepEqual(await runs(), ['attempt 1 of 6 failed', 'attempt 2 of 6 failed', 'attempt 3 of 6 completed'], 'failed twice, then completed');
    assert.equal(await page.locator('[data-field="attempt"]').textContent(), '3 of 6, the last');
    await page.goto(`${base}/queues/waits/tasks/${retry.id}`);
    assert.deepEqual(await runs(), [], 'a row set to retry in SQL has no recorded run');
    const failed = (await page.locator('ol.timeline li', { hasText: 'failed' }).textContent()) ?? '';
    assert.match(failed.replace(/\s+/g, ' '), / · attempt 1 of 3$/, 'the timeline falls back to the row’s last failure');
    assert.equal(await page.locator('[data-field="attempt"]').textContent(), '2 of 3, next');
  });
});
