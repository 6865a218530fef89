/**
 * The Server's own timers: a task's timeout and deadline, the forwarder that
 * makes a scheduled task pending once due, the janitor's retention, and a
 * claim loop that leaves running handlers their timers. What waits for a
 * timer of the server's moves the server's clock instead of sleeping.
 */
import assert from 'node:assert/strict';
import { describe } from 'node:test';
import { Task, TaskTimeoutError } from '../src/index.js';
import { DatabaseClock } from '../src/internal/clock.js';
import { countByState, deferred, test, waitFor } from './helpers.js';
import { HOUR, LONG_LEASE, MINUTE, serverFile } from './shared.js';

const { db, client, startServer, reset, taskRow, taskIn } = serverFile('t_server_timers');

/**
 * A handler that waits until its signal aborts (and never settles otherwise), on a
 * server whose clock the test moves: `started` once it runs, `reason` its signal's
 * abort reason.
 */
async function untilAborted(): Promise<{ clock: DatabaseClock; started: Promise<void>; reason: Promise<unknown> }> {
  const clock = new DatabaseClock();
  const started = deferred();
  const reason = deferred<unknown>();
  await startServer(
    (_t, ctx) =>
      new Promise<void>(() => {
        ctx.signal.addEventListener('abort', () => reason.resolve(ctx.signal.reason));
        started.resolve();
      }),
    { clock, ...LONG_LEASE, retryDelay: () => HOUR },
  );
  return { clock, started: started.promise, reason: reason.promise };
}

describe('timeouts and deadlines', () => {
  // An hour is far beyond the test's own time: only the clock's move makes it pass.
  test('a timeout aborts ctx.signal with TaskTimeoutError and retries the task', { timeout: 30_000 }, async () => {
    await reset();
    const { clock, started, reason } = await untilAborted();
    const info = await client.enqueue(new Task('slow'), { timeout: HOUR });
    await started;
    clock.advance(HOUR);
    const r = await reason;
    assert.ok(r instanceof TaskTimeoutError, `the handler's signal was aborted with ${String(r)}`);
    assert.equal(r.message, `task timeout of ${HOUR} ms exceeded`);
    const row = await taskIn(info.id, 'retry');
    assert.equal(row.retried, 1);
    assert.equal(row.error_msg, r.message);
  });

  test('a deadline aborts the handler when it passes: TaskTimeoutError, and the task is retried', { timeout: 30_000 }, async () => {
    await reset();
    const { clock, started, reason } = await untilAborted();
    // Enqueued once the server runs: the handler runs, and the deadline aborts it (a task
    // claimed after its deadline is the next test's case).
    const info = await client.enqueue(new Task('deadline'), { deadline: new Date(Date.now() + HOUR) });
    await started;
    clock.advance(HOUR);
    const r = await reason;
    assert.ok(r instanceof TaskTimeoutError, `the handler's signal was aborted with ${String(r)}`);
    assert.equal(r.message, 'task deadline exceeded');
    const row = await taskIn(info.id, 'retry');
    assert.equal(row.error_msg, 'task deadline exceeded');
  });

  test('a task whose deadline passed before it was claimed fails without running', { timeout: 30_000 }, async () => {
    await reset();
    const info = await client.enqueue(new Task('late'), { deadline: new Date(Date.now() + 60_000), maxRetry: 0 });
    await db.query("UPDATE {{schema}}.tasks SET deadline = now() - interval '1 second' WHERE id = $1", [info.id]);
    let ran = false;
    const server = await startServer(() => {
      ran = true;
    });
    const row = await taskIn(info.id, 'archived');
    assert.equal(ran, false);
    assert.equal(row.error_msg, 'task deadline exceeded');
    await server.shutdown();
  });
});

describe('scheduling', () => {
  test('a scheduled task runs once due, woken by the enqueue, not by the forwarder poll', { timeout: 30_000 }, async () => {
    await reset();
    const started = deferred<number>();
    // The forwarder's poll is set far beyond the test's timeout: that the task runs at all
    // shows that the enqueue's notification woke the forwarder.
    await startServer(() => started.resolve(Date.now()), { delayedTaskCheckInterval: 10 * MINUTE });
    const due = Date.now() + 400;
    const info = await client.enqueue(new Task('later'), { processAt: new Date(due) });
    assert.equal(info.state, 'scheduled');
    const at = await started.promise;
    assert.ok(at >= due - 50, `started ${due - at} ms before it was due`);
  });

  test('a completed task is deleted by the janitor once its retention ends', { timeout: 30_000 }, async () => {
    await reset();
    const clock = new DatabaseClock();
    const info = await client.enqueue(new Task('short-retention'), { retention: HOUR });
    await startServer(() => {}, { clock, janitorInterval: 50 });
    await taskIn(info.id, 'completed');
    clock.advance(HOUR);
    await waitFor(async () => (await taskRow(info.id)) === undefined, 10_000, 'the janitor deletes it');
  });

  test('the janitor deletes expired unique locks', { timeout: 30_000 }, async () => {
    await reset();
    await client.enqueue(new Task('u', 1), { unique: 60_000, processIn: 60_000 });
    await db.query("UPDATE {{schema}}.unique_locks SET expires_at = now() - interval '1 second'");
    const server = await startServer(() => {}, { janitorInterval: 50 });
    await waitFor(async () => (await db.query('SELECT * FROM {{schema}}.unique_locks')).length === 0);
    await server.shutdown();
  });
});

describe('claim loop', () => {
  test('with every slot busy, a notification does not spin the loop: timers of running handlers still fire', { timeout: 30_000 }, async () => {
    await reset();
    await client.enqueue(new Task('busy'));
    const started = deferred();
    const timerFired = deferred();
    const server = await startServer(
      async (t) => {
        if (t.type !== 'busy') return;
        started.resolve();
        // A real timer, not the server's: what it shows is that the event loop still runs them.
        await new Promise((r) => setTimeout(r, 300));
        timerFired.resolve();
      },
      { concurrency: 1, taskCheckInterval: 10_000 },
    );
    await started.promise;
    // A notification arrives while the only slot is busy.
    await client.enqueue(new Task('second'));
    await timerFired.promise;
    await waitFor(async () => (await countByState(db)).pending === undefined && (await countByState(db)).active === undefined);
    await server.shutdown();
  });
});
