/**
 * The database is the trust boundary (see trust-roles-kit.ts): a worker
 * writes tasks only through the owner's functions, and with the grants the
 * roles script gives, a Server, the forwarder, recoverer, janitor and
 * aggregator still do all their work.
 */
import assert from 'node:assert/strict';
import { describe } from 'node:test';
import { Client, Server, Snooze, Task } from '../src/index.js';
import { Db } from '../src/broker/db.js';
import { forwardDue } from '../src/broker/maintenance.js';
import { silentLogger } from '../src/internal/logger.js';
import { Aggregator } from '../src/server/aggregator.js';
import { Janitor } from '../src/server/janitor.js';
import { Recoverer } from '../src/server/recoverer.js';
import { StatsCollector } from '../src/server/stats.js';
import { deferred, test, waitFor } from './helpers.js';
import { as, db, refused, setupTrustRoles, url } from './trust-roles-kit.js';

setupTrustRoles('trust_roles_worker', 't26w');

describe("a worker writes tasks only through the owner's functions", () => {
  test('no INSERT, UPDATE, DELETE or row lock on the task tables, the view, the sequence or the rate log; no moved clock', async () => {
    for (const stmt of [
      "UPDATE {{S}}.task_states SET state = 'archived'",
      'DELETE FROM {{S}}.task_states',
      'DELETE FROM {{S}}.task_inputs',
      "INSERT INTO {{S}}.task_states (seq, queue, state) VALUES (-1, 'q', 'active')",
      'DELETE FROM {{S}}.task_dependencies',
      'DELETE FROM {{S}}.unique_locks',
      "UPDATE {{S}}.tasks SET state = 'archived'",
      'DELETE FROM {{S}}.tasks',
      // Row locks that would stop claims, the recoverer or the Inspector.
      'SELECT 1 FROM {{S}}.task_states FOR NO KEY UPDATE SKIP LOCKED',
      'SELECT 1 FROM {{S}}.tasks FOR UPDATE',
      'SELECT 1 FROM {{S}}.unique_locks FOR UPDATE',
      // Another server's lease token: with it, a worker could finish, fail, extend or lock its task.
      'SELECT lease_token FROM {{S}}.task_states',
      'SELECT lease_token FROM {{S}}.tasks',
      'SELECT * FROM {{S}}.tasks',
      // Positions are the owner's functions' to draw; the rate log is claim_limited()'s.
      "SELECT nextval('{{S}}.task_seq')",
      "INSERT INTO {{S}}.queue_starts (queue, started_at, tasks) VALUES ('q', now(), -100)",
      'DELETE FROM {{S}}.queue_starts',
      // A claim or extension an hour ahead of the database's clock.
      "SELECT * FROM {{S}}.claim_limited(ARRAY['q'], ARRAY[1], 1, 'me', 30000, 3600000)",
      "SELECT * FROM {{S}}.extend_leases('{}', '{}', 30000, NULL, 3600000)",
    ]) {
      await refused(as('worker', stmt), `worker: ${stmt}`);
    }
    // The claim the worker did call before 0010, which took its time and schema from the caller, is gone.
    await refused(
      as('worker', "SELECT * FROM {{S}}.claim_limited(ARRAY['q'], ARRAY[1], 1, 'me', 30000, now() + interval '1 hour', 'x')"),
      'old claim_limited',
      '42883',
    );
    // Bounds a function checks: a negative cutoff (which would hand out the tokens of live
    // leases), a lease of no length, arrays that do not pair up.
    const cutoff = await refused(as('worker', 'SELECT * FROM {{S}}.expired_leases(10, false, -1, 30000, 0)'), 'cutoff', '22023');
    assert.equal(cutoff.column, 'recoverCutoff');
    const lease = await refused(as('worker', "SELECT * FROM {{S}}.extend_leases('{1}', ARRAY[gen_random_uuid()], 0, NULL, 0)"), 'lease 0', '22023');
    assert.equal(lease.column, 'leaseDuration');
    const pairs = await refused(
      as('worker', "SELECT * FROM {{S}}.fail_tasks('{1,2}', ARRAY[gen_random_uuid()], '{t}', '{t}', '{0}', '{x}', '{failed}', NULL, 0)"),
      'pairs',
      '22023',
    );
    assert.equal(pairs.column, 'leases');
    const delay = await refused(
      as('worker', "SELECT * FROM {{S}}.snooze_tasks('{1}', ARRAY[gen_random_uuid()], ARRAY['NaN'::float8], NULL, 0)"),
      'delay',
      '22023',
    );
    assert.equal(delay.column, 'delayMs');
  });

  test('a Server as the worker claims, extends, completes, fails, snoozes, writes results, locks and gives back its leases', async () => {
    await db.query('TRUNCATE {{schema}}.task_states, {{schema}}.task_inputs, {{schema}}.unique_locks');
    const producer = new Client({ connectionString: url('producer'), schema: db.schema, logger: false });
    const server = new Server({
      connectionString: url('worker'),
      schema: db.schema,
      logger: false,
      queues: { work: 1 },
      concurrency: 4,
      taskCheckInterval: 50,
      delayedTaskCheckInterval: 50,
      // Trusted 1 s after each extension: a loaded CI machine stalled 400 ms (a 600 ms lease) often enough to lose it.
      leaseDuration: 1500,
      heartbeatInterval: 50,
      shutdownTimeout: 300,
      retryDelay: () => 10,
    });
    const runs = new Map<string, number>();
    const holding = deferred();
    try {
      await server.start(async (_task, ctx) => {
        const n = (runs.get(ctx.taskId) ?? 0) + 1;
        runs.set(ctx.taskId, n);
        if (ctx.taskId === 'fails' && n === 1) throw new Error('once');
        if (ctx.taskId === 'snoozes' && n === 1) throw new Snooze(10);
        if (ctx.taskId === 'tx') {
          await ctx.transaction(async () => 'in a transaction');
          return;
        }
        if (ctx.taskId === 'hold') {
          holding.resolve();
          // Past its lease length: only the heartbeats keep it, until shutdown gives it back.
          await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve));
          throw ctx.signal.reason;
        }
        ctx.log(`run ${n}`);
        await ctx.progress(100);
        await ctx.writeResult({ ok: ctx.taskId });
      });
      await producer.enqueueMany(['kept', 'fails', 'snoozes', 'tx', 'hold'].map((id) => new Task('w', null, { queue: 'work', taskId: id, retention: 60_000 })));
      await holding.promise;
      await waitFor(async () => (await db.query("SELECT count(*)::int AS n FROM {{schema}}.tasks WHERE state = 'completed'"))[0]!.n === 4, 20_000);
      await new Promise((resolve) => setTimeout(resolve, 1700));
      assert.equal((await db.query("SELECT state FROM {{schema}}.tasks WHERE id = 'hold'"))[0]!.state, 'active', 'heartbeats kept the lease');
    } finally {
      await server.shutdown();
      await producer.close();
    }
    const rows = await db.query<{ id: string; state: string; retried: number; result: unknown }>(
      "SELECT id, state, retried, result FROM {{schema}}.tasks WHERE queue = 'work' ORDER BY id",
    );
    assert.deepEqual(rows, [
      { id: 'fails', state: 'completed', retried: 1, result: { ok: 'fails' } },
      { id: 'hold', state: 'pending', retried: 0, result: null },
      { id: 'kept', state: 'completed', retried: 0, result: { ok: 'kept' } },
      { id: 'snoozes', state: 'completed', retried: 0, result: { ok: 'snoozes' } },
      { id: 'tx', state: 'completed', retried: 0, result: null },
    ]);
    assert.deepEqual(Object.fromEntries(runs), { kept: 1, fails: 2, snoozes: 2, tx: 1, hold: 1 });
    // What the worker recorded through the owner's functions: every run that ended, progress and log lines.
    const attempts = await db.query<{ id: string; outcomes: string[] }>(
      `SELECT i.id, array_agg(a.outcome ORDER BY a.run) AS outcomes FROM {{schema}}.task_attempts a JOIN {{schema}}.task_inputs i USING (seq)
       GROUP BY i.id ORDER BY i.id`,
    );
    // 'hold' may also have been given back once before it ran (a shutdown run too): claimed
    // ahead of a free slot, its lease's trust can run out on a loaded machine before it starts.
    const hold = attempts.find((a) => a.id === 'hold')!;
    assert.ok(hold.outcomes.length >= 1 && hold.outcomes.every((o) => o === 'shutdown'), `hold: ${hold.outcomes.join(', ')}`);
    assert.deepEqual(
      attempts.map((a) => (a.id === 'hold' ? { ...a, outcomes: ['shutdown'] } : a)),
      [
        { id: 'fails', outcomes: ['failed', 'completed'] },
        { id: 'hold', outcomes: ['shutdown'] },
        { id: 'kept', outcomes: ['completed'] },
        { id: 'snoozes', outcomes: ['snoozed', 'completed'] },
        { id: 'tx', outcomes: ['completed'] },
      ],
    );
    const kept = await db.query(
      "SELECT t.progress, (SELECT array_agg(l.message ORDER BY l.line) FROM {{schema}}.task_logs l WHERE l.seq = t.seq) AS lines FROM {{schema}}.tasks t WHERE t.id = 'kept'",
    );
    assert.deepEqual(kept, [{ progress: 100, lines: ['run 1'] }]);
  });

  test('with the grants the script gives, the forwarder, recoverer, janitor and aggregator still do their work', async () => {
    const producer = new Client({ connectionString: url('producer'), schema: db.schema, logger: false });
    const worker = new Db({ connectionString: url('worker'), schema: db.schema, logger: false });
    try {
      await db.query('TRUNCATE {{schema}}.task_states, {{schema}}.task_inputs, {{schema}}.unique_locks');
      await producer.enqueue(new Task('m', null), { queue: 'maint', taskId: 'due', processIn: 60_000 });
      await producer.enqueue(new Task('m', null), { queue: 'maint', taskId: 'leased' });
      await producer.enqueue(new Task('m', null), { queue: 'maint', taskId: 'done' });
      await producer.enqueue(new Task('m', null), { queue: 'maint', taskId: 'dead' });
      await producer.enqueue(new Task('m', 'u'), { queue: 'maint', taskId: 'unique', unique: 60_000 });
      await producer.enqueueMany([new Task('m', 1), new Task('m', 2)], { queue: 'maint', group: 'g' });
      // As the owner: each row as time and other servers would have left it.
      await db.query(
        `UPDATE {{schema}}.task_states s SET run_at = now() - interval '1 second' FROM {{schema}}.task_inputs i WHERE i.seq = s.seq AND i.id = 'due'`,
      );
      await db.query(`UPDATE {{schema}}.tasks SET state = 'active', run_at = NULL, lease_owner = 'gone', lease_token = gen_random_uuid(),
                      lease_expires_at = now() - interval '1 hour' WHERE id = 'leased'`);
      await db.query(`INSERT INTO {{schema}}.task_states (seq, queue, state, lease_owner, lease_token, lease_expires_at)
                      VALUES (nextval('{{schema}}.task_seq'), 'maint', 'active', 'gone', gen_random_uuid(), now() - interval '1 hour')`);
      await db.query("UPDATE {{schema}}.tasks SET state = 'completed', completed_at = now(), run_at = now() - interval '1 second' WHERE id = 'done'");
      await db.query("UPDATE {{schema}}.tasks SET state = 'archived', run_at = now() - interval '91 days' WHERE id = 'dead'");
      await db.query("UPDATE {{schema}}.unique_locks SET expires_at = now() - interval '1 second'");
      await db.query("UPDATE {{schema}}.task_states SET updated_at = now() - interval '1 minute' WHERE group_key = 'g'");
      assert.equal(await forwardDue(worker, 10), 1);
      const recoverer = new Recoverer(
        worker,
        silentLogger,
        { recoverInterval: 60_000, recoverCutoff: 1000, leaseDuration: 30_000, retryDelay: undefined },
        new StatsCollector(worker),
      );
      assert.deepEqual(await recoverer.runOnce(), { retried: 1, archived: 0 });
      const janitor = new Janitor(worker, silentLogger, { janitorInterval: 60_000, janitorBatchSize: 100 });
      assert.deepEqual(await janitor.runOnce(), { completed: 1, locks: 1, archived: 1 });
      const aggregator = new Aggregator(worker, silentLogger, {
        queues: ['maint'],
        groupGracePeriod: 1000,
        groupMaxDelay: 0,
        groupMaxSize: 0,
        groupAggregator: (_group, tasks) => new Task('batch', tasks.length),
      });
      await aggregator.runOnce();

      // What is left: the forwarded task, the retried one, the one whose lock went, and the aggregate.
      const rows = await db.query<{ id: string; type: string; state: string }>(
        "SELECT i.id, i.type, s.state FROM {{schema}}.task_states s LEFT JOIN {{schema}}.task_inputs i USING (seq) WHERE s.queue = 'maint'",
      );
      assert.deepEqual(rows.map((r) => `${r.type === 'batch' ? 'batch' : r.id} ${r.state}`).sort(), [
        'batch pending',
        'due pending',
        'leased retry',
        'unique pending',
      ]);
      assert.deepEqual(await db.query('SELECT * FROM {{schema}}.unique_locks'), []);
    } finally {
      await worker.close();
      await producer.close();
    }
  });
});
