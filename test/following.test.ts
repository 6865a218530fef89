/**
 * Following a task (migration 0013): every run recorded with how it ended,
 * ctx.progress() and ctx.log() fenced by the lease, their bounds, and the
 * bounds the SQL holds to against any caller.
 */
import assert from 'node:assert/strict';
import { describe } from 'node:test';
import pg from 'pg';
import { LeaseExpiredError, Snooze, SkipRetry, Task, ValidationError, type TaskContext } from '../src/index.js';
import { MAX_ATTEMPTS_KEPT, MAX_LOG_BYTES, MAX_LOG_LINE_BYTES, MAX_LOG_LINES, MAX_PROGRESS_BYTES, logLine, progressJson } from '../src/model/following.js';
import { caught, deferred, exited, setupDb, spawnFixture, test, waitFor } from './helpers.js';

const { db, client, inspector, startServer } = setupDb('t_following', {
  resetEach: true,
  server: { concurrency: 2, taskCheckInterval: 50, delayedTaskCheckInterval: 50, retryDelay: () => 0 },
});

/** Waits until task `id` of `queue` is in `state`. */
const until = (queue: string, id: string, state: string) =>
  waitFor(async () => (await inspector.getTaskInfo(queue, id).catch(() => undefined))?.state === state, 20_000, `${queue}/${id} ${state}`);

describe('attempts', () => {
  test('each run is recorded when it ends: failed twice, then completed and kept; the running one shows as running', async () => {
    const running = deferred();
    const release = deferred();
    await startServer(async (_task, ctx) => {
      if (ctx.attempt <= 2) throw new Error(`boom ${ctx.attempt}`);
      running.resolve();
      await release.promise;
    });
    await client.enqueue(new Task('t', null), { taskId: 'a1', retention: 60_000, maxRetry: 5 });
    await running.promise;
    const during = await inspector.listAttempts('default', 'a1');
    assert.deepEqual(
      during.map((a) => [a.attempt, a.outcome, a.error, a.finishedAt === null]),
      [
        [1, 'failed', 'boom 1', false],
        [2, 'failed', 'boom 2', false],
        [3, 'running', null, true],
      ],
    );
    assert.ok(during.every((a) => a.serverId !== null && a.startedAt instanceof Date));
    assert.ok(during[0]!.finishedAt! >= during[0]!.startedAt! && during[1]!.startedAt! >= during[0]!.finishedAt!, 'in order, on the database clock');
    release.resolve();
    await until('default', 'a1', 'completed');
    const after = await inspector.listAttempts('default', 'a1');
    assert.deepEqual(
      after.map((a) => [a.attempt, a.outcome]),
      [
        [1, 'failed'],
        [2, 'failed'],
        [3, 'completed'],
      ],
    );
  });

  test('a snooze, a SkipRetry archive, and a task completed without retention takes its record with it', async () => {
    await startServer(async (task, ctx) => {
      if (task.type === 'snooze' && ctx.attempt === 1 && (await inspector.listAttempts('default', 'z1')).length === 1) throw new Snooze(10);
      if (task.type === 'skip') throw new SkipRetry('no point');
      if (task.type === 'flaky' && ctx.retryCount === 0) throw new Error('once');
    });
    await client.enqueue(new Task('snooze', null), { taskId: 'z1', retention: 60_000 });
    await client.enqueue(new Task('skip', null), { taskId: 's1' });
    await client.enqueue(new Task('flaky', null), { taskId: 'f1' });
    await until('default', 'z1', 'completed');
    await until('default', 's1', 'archived');
    await waitFor(async () => (await inspector.getTaskInfo('default', 'f1').catch(() => null)) === null, 20_000, 'f1 gone');
    // A snoozed run and the run after it share attempt 1: both are listed.
    assert.deepEqual(
      (await inspector.listAttempts('default', 'z1')).map((a) => [a.attempt, a.outcome]),
      [
        [1, 'snoozed'],
        [1, 'completed'],
      ],
    );
    assert.deepEqual(
      (await inspector.listAttempts('default', 's1')).map((a) => [a.attempt, a.outcome, a.error]),
      [[1, 'failed', 'no point']],
    );
    const left = await db.query(
      'SELECT count(*)::int AS n FROM {{schema}}.task_attempts a WHERE NOT EXISTS (SELECT 1 FROM {{schema}}.task_states s WHERE s.seq = a.seq)',
    );
    assert.equal(left[0].n, 0, "the deleted task's failed run went with it");
  });

  test('a timeout and a cancellation are recorded as such', async () => {
    const started = deferred();
    await startServer(async (task, ctx) => {
      if (task.type === 'cancel') started.resolve();
      await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve));
      throw ctx.signal.reason;
    });
    await client.enqueue(new Task('slow', null), { taskId: 'to1', timeout: 100, maxRetry: 0 });
    await client.enqueue(new Task('cancel', null), { taskId: 'c1', maxRetry: 0 });
    await started.promise;
    await waitFor(async () => (await inspector.cancelProcessing('c1')) === 1 || (await inspector.getTaskInfo('default', 'c1')).state === 'archived');
    await until('default', 'to1', 'archived');
    await until('default', 'c1', 'archived');
    assert.deepEqual(
      (await inspector.listAttempts('default', 'to1')).map((a) => a.outcome),
      ['timeout'],
    );
    assert.deepEqual(
      (await inspector.listAttempts('default', 'c1')).map((a) => a.outcome),
      ['canceled'],
    );
  });

  test('a worker killed with -9 mid-task: its run is recorded as lost, with its server, once another server recovers the task', async () => {
    const worker = spawnFixture('test/fixtures/worker.ts', {
      DATABASE_URL: db.connectionString,
      SCHEMA: db.schema,
      MODE: 'hang',
      LEASE: '600',
      HEARTBEAT: '100',
    });
    await worker.next('ready');
    await client.enqueue(new Task('t', null), { taskId: 'k9', maxRetry: 3, retention: 60_000 });
    await worker.next('started');
    const [{ owner }] = await db.query("SELECT lease_owner AS owner FROM {{schema}}.tasks WHERE id = 'k9'");
    worker.child.kill('SIGKILL');
    await exited(worker.child);
    await startServer(() => {}, { recoverInterval: 50, recoverCutoff: 0, leaseDuration: 600, heartbeatInterval: 100 });
    await until('default', 'k9', 'completed');
    // A claim whose reply came after the lease's trust (400 ms here; a loaded machine) is given
    // back before it starts, recorded as a 'shutdown' run: only the runs that started count here.
    const attempts = (await inspector.listAttempts('default', 'k9')).filter((a) => a.outcome !== 'shutdown');
    assert.deepEqual(
      attempts.map((a) => [a.attempt, a.outcome, a.error]),
      [
        [1, 'lost', 'task lease expired'],
        [2, 'completed', null],
      ],
    );
    assert.equal(attempts[0]!.serverId, owner, 'the killed server ran it');
    assert.notEqual(attempts[1]!.serverId, owner);
  });

  test('a task keeps its last 100 runs', async () => {
    const [{ seq }] = await client
      .enqueue(new Task('t', null), { taskId: 'many', processIn: 3_600_000 })
      .then(async () => db.query("SELECT seq FROM {{schema}}.tasks WHERE id = 'many'"));
    const ended = (from: number, to: number) =>
      JSON.stringify(Array.from({ length: to - from + 1 }, (_, i) => ({ seq, run: from + i, attempt: 1, outcome: 'snoozed' })));
    await db.query('SELECT {{schema}}.record_attempts($1::jsonb, now())', [ended(1, 100)]);
    await db.query('SELECT {{schema}}.record_attempts($1::jsonb, now())', [ended(101, 103)]);
    const runs = await db.query('SELECT min(run)::int AS lo, max(run)::int AS hi, count(*)::int AS n FROM {{schema}}.task_attempts WHERE seq = $1', [seq]);
    assert.deepEqual(runs[0], { lo: 4, hi: 103, n: MAX_ATTEMPTS_KEPT });
  });

  test('unknown queue or task', async () => {
    await client.enqueue(new Task('t', null), { taskId: 'x' });
    await assert.rejects(inspector.listAttempts('nope', 'x'), { name: 'QueueNotFoundError' });
    await assert.rejects(inspector.listAttempts('default', 'nope'), { name: 'TaskNotFoundError' });
    await assert.rejects(inspector.getTaskLogs('default', 'nope'), { name: 'TaskNotFoundError' });
    await assert.rejects(inspector.listAttempts('default', ''), ValidationError);
  });
});

describe('progress and logs', () => {
  test('progress is stored and read back; lines ride on the next write, dated on the database clock, in order', async () => {
    const hold = deferred();
    const reported = deferred();
    await startServer(async (_task, ctx) => {
      ctx.log('starting');
      await ctx.progress(10);
      ctx.log('half way');
      await ctx.progress({ done: 5, total: 10 });
      reported.resolve();
      await hold.promise;
      ctx.log('done');
    });
    await client.enqueue(new Task('t', null), { taskId: 'p1', retention: 60_000 });
    await reported.promise;
    const info = await inspector.getTaskInfo('default', 'p1');
    assert.deepEqual(info.progress, { done: 5, total: 10 });
    assert.deepEqual(
      (await inspector.getTaskLogs('default', 'p1')).map((l) => [l.attempt, l.message]),
      [
        [1, 'starting'],
        [1, 'half way'],
      ],
    );
    hold.resolve();
    await until('default', 'p1', 'completed');
    const lines = await inspector.getTaskLogs('default', 'p1');
    assert.deepEqual(
      lines.map((l) => l.message),
      ['starting', 'half way', 'done'],
    );
    assert.ok(lines[0]!.at <= lines[1]!.at && lines[1]!.at <= lines[2]!.at);
    assert.deepEqual(
      (await inspector.getTaskLogs('default', 'p1', { tail: 1 })).map((l) => l.message),
      ['done'],
    );
    assert.equal((await inspector.getTaskInfo('default', 'p1')).progress !== null, true);
  });

  test('the heartbeat carries the lines of a handler that writes nothing else', async () => {
    const hold = deferred();
    await startServer(
      async (_task, ctx) => {
        ctx.log('working');
        await hold.promise;
      },
      { heartbeatInterval: 50, leaseDuration: 1_000 },
    );
    await client.enqueue(new Task('t', null), { taskId: 'hb' });
    await waitFor(async () => (await inspector.getTaskLogs('default', 'hb')).length === 1, 20_000, 'the line, before the task ends');
    hold.resolve();
  });

  test('the last lines, taken by a heartbeat as the handler returned, are kept: the completion waits for that heartbeat', async () => {
    // Another session holds task_logs, so that the heartbeat carrying the line is held up
    // before its statement reads the task; without the wait, the completion would commit
    // first and the heartbeat, finding the task no longer active, would drop the line.
    const locker = new pg.Client({ connectionString: db.connectionString });
    await locker.connect();
    try {
      const [running, log, finish] = [deferred(), deferred(), deferred()];
      await startServer(
        async (_task, ctx) => {
          running.resolve();
          await log.promise;
          ctx.log('last');
          await finish.promise;
        },
        { heartbeatInterval: 50, leaseDuration: 10_000 },
      );
      await client.enqueue(new Task('t', null), { taskId: 'hb-last', retention: 60_000 });
      await running.promise;
      await locker.query('BEGIN');
      await locker.query(`LOCK TABLE ${db.schema}.task_logs IN EXCLUSIVE MODE`);
      log.resolve();
      // (pg_stat_activity may show a session's previous statement: its prepared ones are parsed ahead.)
      const heldUp = `SELECT 1 FROM pg_locks WHERE relation = '${db.schema}.task_logs'::regclass AND NOT granted`;
      await waitFor(async () => (await locker.query(heldUp)).rowCount === 1, 20_000, 'a heartbeat held up by the lock');
      finish.resolve();
      const completedMeanwhile = await waitFor(
        async () => (await inspector.getTaskInfo('default', 'hb-last')).state === 'completed',
        500,
        'completed while the heartbeat was held up',
      ).then(
        () => true,
        () => false,
      );
      assert.equal(completedMeanwhile, false, 'the completion waited for the heartbeat that carried the last line');
      await locker.query('COMMIT');
      await until('default', 'hb-last', 'completed');
      assert.deepEqual(
        (await inspector.getTaskLogs('default', 'hb-last')).map((l) => l.message),
        ['last'],
      );
    } finally {
      await locker.end();
    }
  });

  test('bad values: a ValidationError naming the field, nothing written; a lost lease refuses both', async () => {
    const results: unknown[] = [];
    const done = deferred();
    await startServer(async (_task, ctx: TaskContext) => {
      for (const bad of [Number.NaN, -1, 101, 'half', [1], null, { big: 'x'.repeat(MAX_PROGRESS_BYTES) }]) {
        results.push(await caught(() => ctx.progress(bad as never)));
      }
      results.push(await caught(() => ctx.log(42 as never)));
      done.resolve();
    });
    await client.enqueue(new Task('t', null), { taskId: 'bad', retention: 60_000 });
    await done.promise;
    for (const err of results.slice(0, -1)) {
      assert.ok(err instanceof ValidationError, String(err));
      assert.equal(err.field, 'progress');
    }
    assert.ok(results.at(-1) instanceof ValidationError);
    assert.equal((results.at(-1) as ValidationError).field, 'message');
    await until('default', 'bad', 'completed');
    assert.equal((await inspector.getTaskInfo('default', 'bad')).progress, null);
  });

  test('after the lease is lost, progress and log reject with LeaseExpiredError and write nothing', async () => {
    const lost = deferred<unknown[]>();
    await startServer(async (_task, ctx) => {
      await db.query("UPDATE {{schema}}.task_states SET lease_token = gen_random_uuid() WHERE seq = (SELECT seq FROM {{schema}}.tasks WHERE id = 'lost')");
      const errors = [await caught(() => ctx.progress(50))];
      errors.push(await caught(() => ctx.log('after')));
      lost.resolve(errors);
    });
    await client.enqueue(new Task('t', null), { taskId: 'lost' });
    const [progress, log] = await lost.promise;
    assert.ok(progress instanceof LeaseExpiredError, String(progress));
    assert.ok(log instanceof LeaseExpiredError, String(log));
    const row = await db.query("SELECT progress FROM {{schema}}.tasks WHERE id = 'lost'");
    assert.equal(row[0]?.progress ?? null, null);
  });

  test('the SQL holds any caller to the same bounds: progress refused, lines cut and trimmed to 1,000 and 64 KiB', async () => {
    await client.enqueue(new Task('t', null), { taskId: 'sql', processIn: 3_600_000 });
    const [{ seq }] = await db.query("SELECT seq FROM {{schema}}.tasks WHERE id = 'sql'");
    await db.query(
      "UPDATE {{schema}}.tasks SET state = 'active', lease_owner = 'me', lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 hour' WHERE id = 'sql'",
    );
    const [{ token }] = await db.query('SELECT lease_token AS token FROM {{schema}}.task_states WHERE seq = $1', [seq]);
    for (const bad of ['-1', '101', '"x"', '[1]', JSON.stringify({ big: 'x'.repeat(MAX_PROGRESS_BYTES) })]) {
      const err = (await caught(() => db.query('SELECT {{schema}}.write_progress($1, $2, $3::jsonb, NULL, 0)', [seq, token, bad]))) as {
        code?: string;
        column?: string;
      };
      assert.deepEqual([err.code, err.column], ['22023', 'progress'], bad);
    }
    const lines = Array.from({ length: 1200 }, (_, i) => [1, 0, `line ${i} ${'y'.repeat(40)}`]);
    await db.query('SELECT {{schema}}.append_task_logs($1::jsonb, now())', [JSON.stringify({ [seq]: { t: token, l: lines } })]);
    const kept = await db.query(
      'SELECT count(*)::int AS n, sum(octet_length(message))::int AS bytes, max(length(message))::int AS longest FROM {{schema}}.task_logs WHERE seq = $1',
      [seq],
    );
    assert.ok(kept[0].n <= MAX_LOG_LINES && kept[0].bytes <= MAX_LOG_BYTES, JSON.stringify(kept[0]));
    const newest = await inspector.getTaskLogs('default', 'sql', { tail: 1 });
    assert.match(newest[0]!.message, /^line 1199 /);
    await db.query('SELECT {{schema}}.append_task_logs($1::jsonb, now())', [JSON.stringify({ [seq]: { t: token, l: [[1, 0, 'z'.repeat(10_000)]] } })]);
    assert.equal((await inspector.getTaskLogs('default', 'sql', { tail: 1 }))[0]!.message.length, MAX_LOG_LINE_BYTES);
    // Another lease's token writes nothing.
    await db.query('SELECT {{schema}}.append_task_logs($1::jsonb, now())', [
      JSON.stringify({ [seq]: { t: '00000000-0000-0000-0000-000000000000', l: [[1, 0, 'forged']] } }),
    ]);
    assert.notEqual((await inspector.getTaskLogs('default', 'sql', { tail: 1 }))[0]!.message, 'forged');
  });

  test("the library's own checks: progress values and log lines", async () => {
    assert.equal(progressJson(0), '0');
    assert.equal(progressJson(100), '100');
    assert.equal(progressJson({ stage: 'copy' }), '{"stage":"copy"}');
    for (const bad of [Number.NaN, Infinity, -0.1, 100.5, '1', true, [], null, undefined, new Uint8Array(1)]) {
      assert.throws(
        () => progressJson(bad),
        (e: unknown) => e instanceof ValidationError && e.field === 'progress',
        String(bad),
      );
    }
    assert.equal(logLine('short'), 'short');
    const long = logLine('é'.repeat(MAX_LOG_LINE_BYTES));
    assert.ok(Buffer.byteLength(long) <= MAX_LOG_LINE_BYTES && long.length === MAX_LOG_LINE_BYTES / 2, 'cut on a character');
    assert.throws(() => logLine({}), ValidationError);
    await assert.rejects(inspector.getTaskLogs('default', 'x', { tail: 0 }), ValidationError);
  });
});
