/**
 * Leases when a server stops or its process dies, freezes or starves (issue
 * "core engine, part 2"): graceful shutdown gives unfinished tasks back, and
 * another server recovers what a dead or stalled worker held, fenced.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { describe } from 'node:test';
import { Task } from '../src/index.js';
import { DatabaseClock, type ClockTimer } from '../src/internal/clock.js';
import { deferred, exited, spawnFixture, test, waitFor, type Fixture } from './helpers.js';
import { HOUR, LONG_LEASE, MINUTE, leasesFile, moveClock } from './shared.js';

const { db, client, startServer, reset, taskRow, taskIn, recordsEffect, activeTask } = leasesFile('t_leases_processes');

/** A DatabaseClock that keeps the delay of every timer set on it: a test sees when the server waits on one. */
class WatchedClock extends DatabaseClock {
  readonly armed: number[] = [];
  override setTimeout(fn: () => void, ms: number, unref?: boolean): ClockTimer {
    this.armed.push(ms);
    return super.setTimeout(fn, ms, unref);
  }
}

describe('graceful shutdown', () => {
  test(
    'an unfinished task goes back to the front of pending with its retry count unchanged, once the shutdown timeout passed',
    { timeout: 30_000 },
    async () => {
      await reset();
      const info = await client.enqueue(new Task('stuck'), { maxRetry: 5 });
      await db.query('UPDATE {{schema}}.tasks SET retried = 2 WHERE id = $1', [info.id]);
      // The shutdown timeout runs on the server's clock: the test moves it once the shutdown waits on it,
      // and real time alone (seconds) never reaches it.
      const clock = new WatchedClock();
      const SHUTDOWN_MS = 10 * MINUTE;
      let reason: unknown;
      let abortedAt: number | undefined;
      const server = await startServer(
        (_t, ctx) => {
          ctx.signal.addEventListener('abort', () => ((reason = ctx.signal.reason), (abortedAt = clock.offsetMs)));
          return new Promise(() => {}); // ignores its signal
        },
        { concurrency: 1, shutdownTimeout: SHUTDOWN_MS, clock, ...LONG_LEASE },
      );
      await waitFor(async () => (await taskRow(info.id))?.state === 'active');
      const other = await client.enqueue(new Task('later'));
      const shutdown = server.shutdown();
      await waitFor(() => clock.armed.includes(SHUTDOWN_MS), 20_000, 'the shutdown waiting for the handler');
      assert.equal(abortedAt, undefined, 'not aborted before the timeout');
      clock.advance(SHUTDOWN_MS);
      // It returns although the handler never does.
      await shutdown;
      assert.equal((reason as Error).name, 'ServerClosedError');
      assert.equal(abortedAt, SHUTDOWN_MS, 'aborted once the clock passed the timeout');
      const row = await taskRow(info.id);
      assert.equal(row.state, 'pending');
      assert.equal(row.retried, 2);
      assert.equal(row.lease_token, null);
      const order = await db.query("SELECT id FROM {{schema}}.tasks WHERE state = 'pending' ORDER BY pending_seq");
      assert.deepEqual(
        order.map((r) => r.id),
        [info.id, other.id],
        'requeued to the front',
      );
    },
  );

  test('a handler that finishes within shutdownTimeout completes normally', { timeout: 30_000 }, async () => {
    await reset();
    const info = await client.enqueue(new Task('quick'));
    const started = deferred();
    const release = deferred();
    const server = await startServer(
      async () => {
        started.resolve();
        await release.promise;
      },
      { shutdownTimeout: HOUR },
    );
    await started.promise;
    // It finishes while the shutdown waits for it: long before the hour it would wait.
    const shutdown = server.shutdown();
    release.resolve();
    await shutdown;
    assert.equal(await taskRow(info.id), undefined);
  });
});

// ---- processes that die, freeze or starve ---------------------------------------------------

/** How long a test of processes may take. */
const PROCESS_TEST_MS = 240_000;

/** The state letter of process `pid` in /proc (R running, S sleeping, T stopped, …). */
const processState = (pid: number) => readFileSync(`/proc/${pid}/stat`, 'utf8').replace(/^.*\) /s, '')[0];

/** A worker process of test/fixtures/worker.ts in `mode` (hang, zombie, block), on this file's schema. */
const spawnWorker = (mode: string, env: Record<string, string> = {}): Fixture =>
  spawnFixture('test/fixtures/worker.ts', { DATABASE_URL: db.connectionString, SCHEMA: db.schema, MODE: mode, ...env });

describe('processes', () => {
  for (const signal of ['SIGTERM', 'SIGINT'] as const) {
    test(`server.run() shuts down gracefully on ${signal}: the running task goes back to pending`, { timeout: PROCESS_TEST_MS }, async () => {
      await reset();
      // A lease long enough that a loaded machine cannot make the worker give it up
      // before the shutdown's requeue: this test is about the requeue, not about trust.
      const worker = spawnWorker('hang', { RUN: '1', LEASE: '10000', HEARTBEAT: '1000' });
      await worker.next('ready');
      const info = await client.enqueue(new Task('interrupted'));
      await worker.next('started');
      worker.child.kill(signal);
      await worker.next('metrics');
      await exited(worker.child);
      assert.equal(worker.child.exitCode, 0);
      const row = await taskRow(info.id);
      assert.equal(row.state, 'pending');
      assert.equal(row.retried, 0);
      assert.equal((await db.query('SELECT * FROM {{schema}}.servers')).length, 0, 'the server row is gone');
    });
  }

  test('a run() that starts after SIGTERM came (a Scheduler after the Server) shuts down at once', { timeout: PROCESS_TEST_MS }, async () => {
    await reset();
    const worker = spawnWorker('hang', { RUN: '1', THEN_SCHEDULER: '1' });
    await worker.next('ready');
    worker.child.kill('SIGTERM');
    await worker.next('metrics');
    await worker.next('scheduler stopped');
    await exited(worker.child);
    assert.equal(worker.child.exitCode, 0);
  });

  test(
    'kill -9 mid-task: another server recovers and completes it, after the cutoff and within lease + cutoff + interval',
    { timeout: PROCESS_TEST_MS },
    async (t) => {
      await reset();
      const LEASE = 1000;
      const CUTOFF = HOUR;
      const INTERVAL = 200;
      // The recoverer's passes are the process's own timers, not the clock's: its interval is real
      // time, and so is how late a loaded machine runs one. That much is allowed on top of it.
      const ALLOWANCE = 10_000;
      const worker = spawnWorker('hang', { LEASE: String(LEASE), HEARTBEAT: '150' });
      await worker.next('ready');
      const info = await client.enqueue(new Task('victim'), { retention: 24 * HOUR });
      await worker.next('started');
      worker.child.kill('SIGKILL');
      await exited(worker.child);
      // Once the dead worker's sessions are gone, no heartbeat of its can land any more.
      const sessions = async () =>
        (await db.query('SELECT 1 FROM pg_stat_activity WHERE application_name = $1', [`pgasynq:server:${worker.child.pid}`])).length;
      await waitFor(async () => (await sessions()) === 0, 20_000, "the dead worker's sessions gone");
      const [lease] = await db.query<{ killed: Date; expires: Date; owner: string }>(
        'SELECT now() AS killed, lease_expires_at AS expires, lease_owner AS owner FROM {{schema}}.tasks WHERE id = $1',
        [info.id],
      );
      const [killed, expires] = [lease!.killed.getTime(), lease!.expires.getTime()];
      assert.ok(expires <= killed + LEASE, `the lease ran out ${expires - killed} ms after the kill, more than a lease`);

      // The rescuer's clock is moved instead of waiting out the lease and an hour's cutoff.
      const clock = new DatabaseClock();
      const done = deferred();
      const rescuer = await startServer((_t, ctx) => void (ctx.taskId === info.id && done.resolve()), {
        clock,
        recoverCutoff: CUTOFF,
        recoverInterval: INTERVAL,
      });
      // A canary leased by another dead server, 10 minutes longer dead: the pass that takes it (and
      // archives it: no retries) looks at the victim too, with the clock 5 minutes short of its cutoff.
      await activeTask(0, 0, `'${lease!.expires.toISOString()}'::timestamptz - interval '10 minutes'`);
      await moveClock(db, clock, () => expires + CUTOFF - 5 * MINUTE);
      await waitFor(() => rescuer.metrics().archivedByRecoverer === 1, 10_000, 'a pass of the recoverer that takes the canary');
      const victim = await taskRow(info.id);
      assert.deepEqual(
        [victim.state, victim.lease_owner, victim.lease_expires_at.getTime()],
        ['active', lease!.owner, expires],
        'not recovered before the cutoff has passed',
      );

      await moveClock(db, clock, () => expires + CUTOFF);
      await done.promise;
      const row = await taskIn(info.id, 'completed');
      const recovered = (row.last_failed_at as Date).getTime();
      t.diagnostic(`kill -9 recovery: ${recovered - expires - CUTOFF} ms after the lease and the cutoff had passed on the clock`);
      assert.equal(row.error_msg, 'task lease expired');
      assert.ok(recovered > expires + CUTOFF, 'recovered after the lease and the cutoff');
      assert.ok(
        recovered - killed <= LEASE + CUTOFF + INTERVAL + ALLOWANCE,
        `recovered ${recovered - killed} ms after the kill: more than lease + cutoff + interval + ${ALLOWANCE} ms`,
      );
    },
  );

  // Real time in these two: the worker is another process, and what they test is its own timers (its
  // trust in the lease, the handler's sleep, a blocked event loop) against the rescuer's recovery.

  /**
   * A worker in `mode` takes a task; a rescuer here completes it once the worker's lease ran out
   * (while the worker is frozen, a zombie: it sent itself SIGSTOP; while the handler blocks its
   * event loop, a block); then the worker goes on (SIGCONT; the file that ends the block), and is
   * stopped. Returns the task, the worker's "finished" event and its metrics.
   */
  async function rescuedFrom(mode: 'zombie' | 'block') {
    await reset();
    const freeze = mode === 'zombie';
    const unblock = join(mkdtempSync(join(tmpdir(), 'pgasynq-block-')), 'unblock');
    const worker = spawnWorker(mode, { LEASE: '1000', HEARTBEAT: '150', UNBLOCK: unblock });
    try {
      await worker.next('ready');
      const info = await client.enqueue(new Task(mode));
      await worker.next('started');
      // The zombie stopped itself as it started: frozen before anything of its could run on.
      if (freeze) await waitFor(() => processState(worker.child.pid!) === 'T', 10_000, 'the zombie frozen');
      const rescuer = await startServer(recordsEffect('rescuer'));
      await waitFor(async () => (await taskRow(info.id)) === undefined, 10_000, 'the rescuer completes the task');
      if (freeze) worker.child.kill('SIGCONT');
      else writeFileSync(unblock, '');
      const finished = await worker.next('finished');
      worker.child.kill('SIGTERM');
      const metrics = await worker.next('metrics');
      await exited(worker.child);
      await rescuer.shutdown();
      return { info, finished, metrics };
    } finally {
      // A failed test must not leave its worker serving this schema: the next test's task would go to it.
      if (worker.child.exitCode === null && worker.child.signalCode === null) worker.child.kill('SIGKILL');
      rmSync(dirname(unblock), { recursive: true, force: true });
    }
  }

  test('zombie: a worker frozen past its lease wakes to find its writes fenced off', { timeout: PROCESS_TEST_MS }, async () => {
    const { info, finished, metrics } = await rescuedFrom('zombie');
    assert.equal(finished.error, 'LeaseExpiredError', 'the zombie’s transaction is refused');
    console.log(`# zombie: fenced writes rejected = ${metrics.fencedWrites}, leases lost = ${metrics.leasesLost}`);
    const effects = await db.query('SELECT task_id, worker FROM {{schema}}.side_effects');
    assert.deepEqual(effects, [{ task_id: info.id, worker: 'rescuer' }], 'exactly one side effect, the rescuer’s');
    // Two safe outcomes, depending on what runs first after SIGCONT: the overdue trust timer
    // (the zombie aborts before writing anything), or the handler's wake-up (its transaction
    // reaches the database and the token rejects it: a fenced write).
    assert.equal(metrics.leasesLost, 1, 'the zombie knows it lost the lease');
  });

  test('a CPU-bound handler that blocks the event loop past its lease loses it; its late transaction is fenced', { timeout: PROCESS_TEST_MS }, async () => {
    const { finished, metrics } = await rescuedFrom('block');
    assert.equal(finished.error, 'LeaseExpiredError', 'the blocked handler’s late transaction is refused');
    const effects = await db.query('SELECT worker FROM {{schema}}.side_effects');
    assert.deepEqual(effects, [{ worker: 'rescuer' }]);
    assert.ok((metrics.fencedWrites as number) >= 1);
  });
});
