/**
 * Queues known before their first task, and retries on time (issue #27,
 * items 1 and 2). A fresh schema answered setQueueLimits('emails', …) with
 * QueueNotFoundError, so a limit could not hold for a queue's first tasks;
 * a running server's queues were not listed; and a retry waited for the
 * forwarder's next poll (delayedTaskCheckInterval) because a failure that
 * goes to retry woke no forwarder, where an enqueue of a delayed task does.
 */
import assert from 'node:assert/strict';
import { describe } from 'node:test';
import { InvalidOptionError, QueueNotFoundError, Task, ValidationError, type TaskContext } from '../src/index.js';
import { Db } from '../src/broker/db.js';
import { silentLogger } from '../src/internal/logger.js';
import { Recoverer } from '../src/server/recoverer.js';
import { StatsCollector } from '../src/server/stats.js';
import { deferred, setupDb, test, waitFor } from './helpers.js';

const { db, client, inspector, startServer } = setupDb('t_queues_known', { resetEach: true, server: { taskCheckInterval: 50 } });

describe('a queue known before its first task', () => {
  test('createQueue makes it known with its limits and flag; again, it keeps its tasks and what is left out', async () => {
    const info = await inspector.createQueue('emails', { limits: { concurrency: 2, rateLimit: { limit: 10, interval: 1000 } }, paused: true });
    assert.equal(info.queue, 'emails');
    assert.equal(info.size, 0);
    assert.equal(info.paused, true);
    assert.deepEqual(info.limits, { concurrency: 2, keyConcurrency: null, rateLimit: { limit: 10, interval: 1000 } });
    assert.deepEqual(await inspector.queues(), ['emails']);

    await client.enqueue(new Task('welcome'), { queue: 'emails' });
    const again = await inspector.createQueue('emails');
    assert.equal(again.size, 1, 'an existing queue keeps its tasks');
    assert.equal(again.paused, true, 'paused left out: kept');
    assert.equal(again.limits.concurrency, 2, 'limits left out: kept');

    const changed = await inspector.createQueue('emails', { limits: { keyConcurrency: 1 }, paused: false });
    assert.equal(changed.paused, false);
    assert.deepEqual(changed.limits, { concurrency: null, keyConcurrency: 1, rateLimit: null }, 'given limits replace the old ones, as setQueueLimits');
    assert.equal(changed.size, 1);
  });

  test('bad arguments are refused by name, and nothing is made known', async () => {
    await assert.rejects(inspector.createQueue('bad name'), (e: unknown) => e instanceof ValidationError && /queue/.test(e.message));
    await assert.rejects(inspector.createQueue(''), ValidationError);
    await assert.rejects(inspector.createQueue('q', { paused: 'yes' } as never), (e: unknown) => e instanceof InvalidOptionError && e.field === 'paused');
    await assert.rejects(
      inspector.createQueue('q', { limits: { concurrency: 0 } }),
      (e: unknown) => e instanceof InvalidOptionError && e.field === 'concurrency',
    );
    await assert.rejects(inspector.createQueue('q', { limit: {} } as never), (e: unknown) => e instanceof InvalidOptionError && e.field === 'options.limit');
    await assert.rejects(inspector.createQueue('q', null as never), (e: unknown) => e instanceof InvalidOptionError && e.field === 'options');
    await assert.rejects(inspector.setQueueLimits('q', { concurrency: -1 }), InvalidOptionError);
    assert.deepEqual(await inspector.queues(), []);
  });

  test('the owner checks the names too: ensure_queues() refuses what an enqueue refuses, writing nothing', async () => {
    await assert.rejects(
      db.query(`SELECT {{schema}}.ensure_queues(ARRAY['ok', E'bad\\u0007'])`),
      (e: { code?: string; column?: string; message: string }) =>
        e.code === '22023' && e.column === 'queue' && /invalid queue: may contain only/.test(e.message),
    );
    await assert.rejects(db.query(`SELECT {{schema}}.ensure_queues(NULL)`), (e: { code?: string }) => e.code === '22023');
    await assert.rejects(db.query(`SELECT {{schema}}.ensure_queues(array_fill('q'::text, ARRAY[1001]))`), (e: { code?: string }) => e.code === '22023');
    assert.deepEqual(await inspector.queues(), []);
  });

  test('setQueueLimits on a queue with no task creates it, and the limit holds for the first tasks', { timeout: 30_000 }, async () => {
    await inspector.setQueueLimits('emails', { concurrency: 1 });
    assert.deepEqual((await inspector.getQueueInfo('emails')).limits, { concurrency: 1, keyConcurrency: null, rateLimit: null });
    let running = 0;
    let most = 0;
    let done = 0;
    const srv = await startServer(
      async () => {
        most = Math.max(most, ++running);
        await new Promise((r) => setTimeout(r, 100));
        running--;
        done++;
      },
      { queues: { emails: 1 }, concurrency: 4 },
    );
    try {
      await client.enqueueMany(Array.from({ length: 4 }, () => new Task('send', null, { queue: 'emails' })));
      await waitFor(() => done === 4, 20_000, 'the four tasks');
      assert.equal(most, 1, 'never more than one at once');
    } finally {
      await srv.shutdown();
    }
  });

  test('pauseQueue on a queue with no task creates it paused: its first tasks wait; unpause releases them', { timeout: 30_000 }, async () => {
    await inspector.pauseQueue('later');
    assert.equal((await inspector.getQueueInfo('later')).paused, true);
    await assert.rejects(inspector.pauseQueue('later'), /already paused/);
    const ran = deferred();
    const srv = await startServer(() => ran.resolve(), { queues: { later: 1 } });
    try {
      const { id } = await client.enqueue(new Task('t'), { queue: 'later' });
      await new Promise((r) => setTimeout(r, 300));
      assert.equal((await inspector.getTaskInfo('later', id)).state, 'pending', 'a paused queue is not claimed');
      await inspector.unpauseQueue('later');
      await ran.promise;
    } finally {
      await srv.shutdown();
    }
  });

  test('a name nothing made known stays unknown to reads and to unpause', async () => {
    await assert.rejects(inspector.getQueueInfo('nobody'), QueueNotFoundError);
    await assert.rejects(inspector.history('nobody', 1), QueueNotFoundError);
    await assert.rejects(inspector.unpauseQueue('nobody'), QueueNotFoundError);
    await assert.rejects(inspector.listPendingTasks('nobody'), QueueNotFoundError);
    assert.deepEqual(await inspector.queues(), []);
  });

  test('a started server registers the queues it serves', { timeout: 30_000 }, async () => {
    const srv = await startServer(() => {}, { queues: { critical: 6, default: 3, low: 1 } });
    try {
      assert.deepEqual(await inspector.queues(), ['critical', 'default', 'low']);
      const info = await inspector.getQueueInfo('low');
      assert.equal(info.size, 0);
      assert.equal(info.paused, false);
    } finally {
      await srv.shutdown();
    }
  });
});

describe('retries on time', () => {
  // The forwarders' poll is a minute here: only a wake-up brings a retry in on time.
  const POLL = 60_000;
  const DELAY = 200;

  test('a failed attempt that goes to retry wakes the forwarders: each retry starts about its delay later', { timeout: 30_000 }, async () => {
    const starts: number[] = [];
    let finished = false;
    const srv = await startServer(
      (_task: Task, ctx: TaskContext) => {
        starts.push(performance.now());
        if (ctx.retryCount < 2) throw new Error(`attempt ${ctx.retryCount + 1} fails`);
        finished = true;
      },
      { delayedTaskCheckInterval: POLL, retryDelay: () => DELAY },
    );
    try {
      await client.enqueue(new Task('flaky'), { maxRetry: 3 });
      await waitFor(() => finished, 15_000, 'the third attempt');
      assert.equal(starts.length, 3);
      for (let n = 1; n < starts.length; n++) {
        const gap = starts[n]! - starts[n - 1]!;
        // The delay, plus a claim and a forward: far from the minute's poll.
        assert.ok(gap >= DELAY - 20 && gap < DELAY + 2_000, `retry ${n} started ${Math.round(gap)} ms after the failure`);
      }
    } finally {
      await srv.shutdown();
    }
  });

  test("the recoverer's retries wake the forwarders too", { timeout: 30_000 }, async () => {
    let started: number | undefined;
    // Its own recoverer leaves the orphan alone (a cutoff of a day): the one below finds it.
    const srv = await startServer(() => void (started = performance.now()), {
      delayedTaskCheckInterval: POLL,
      recoverInterval: POLL,
      recoverCutoff: 86_400_000,
    });
    const broker = new Db({ connectionString: db.connectionString, schema: db.schema });
    try {
      // A task whose worker died an hour ago, found by another server's recoverer.
      const { id } = await client.enqueue(new Task('orphan'), { maxRetry: 3, processIn: 3_600_000 });
      await db.query(
        `UPDATE {{schema}}.tasks SET state = 'active', run_at = NULL, lease_owner = 'gone', lease_token = gen_random_uuid(),
           lease_expires_at = now() - interval '1 hour' WHERE id = $1`,
        [id],
      );
      const recoverer = new Recoverer(
        broker,
        silentLogger,
        { recoverInterval: POLL, recoverCutoff: 0, leaseDuration: 30_000, retryDelay: () => DELAY },
        new StatsCollector(broker),
      );
      const recovered = performance.now();
      assert.deepEqual(await recoverer.runOnce(), { retried: 1, archived: 0 });
      await waitFor(() => started, 15_000, 'the retry');
      assert.ok(started! - recovered < DELAY + 2_000, `the retry started ${Math.round(started! - recovered)} ms after the recovery`);
    } finally {
      await srv.shutdown();
      await broker.close();
    }
  });
});
