/**
 * A running task's lease (issue "core engine, part 2"): heartbeats that keep
 * it, a lease taken away from outside, and ctx.transaction, whose writes
 * commit with the completion only while the lease holds.
 */
import assert from 'node:assert/strict';
import { describe } from 'node:test';
import { sql } from 'kysely';
import pg from 'pg';
import { FailedPreconditionError, LeaseExpiredError, Server, Task } from '../src/index.js';
import { Db } from '../src/broker/db.js';
import { completeHeld } from '../src/broker/leases.js';
import { DatabaseClock } from '../src/internal/clock.js';
import { startCommitProxy } from './faults/commit-proxy.js';
import { claim } from './broker-helpers.js';
import { deferred, test, waitFor } from './helpers.js';
import { FAST_LEASES, leasesFile } from './shared.js';

const { db, client, broker, running, startServer, reset, taskRow, taskIn, recordsEffect } = leasesFile('t_leases_running');

describe('heartbeats', () => {
  test('heartbeats keep a long task alive across many lease durations', { timeout: 30_000 }, async () => {
    await reset();
    const clock = new DatabaseClock();
    const info = await client.enqueue(new Task('long'));
    let aborted = false;
    const release = deferred();
    // Leases of 6 s, extended every 200 ms; the recoverer runs every 200 ms with a 300 ms cutoff.
    // The worker trusts a lease 5 s past its last extension, so a loaded machine (the whole
    // suite runs in parallel on two cores) cannot make it give the task up on its own.
    const server = await startServer(
      async (_t, ctx) => {
        ctx.signal.addEventListener('abort', () => (aborted = true));
        await release.promise;
      },
      { leaseDuration: 6000, heartbeatInterval: 200, clock },
    );
    await waitFor(async () => (await taskRow(info.id))?.state === 'active', 10_000, 'task claimed');
    // Three lease durations pass on the database's clock, 2 s at a time, each step once a
    // heartbeat has extended the lease past it: the task is never recovered.
    for (let step = 0; step < 9; step++) {
      clock.advance(2000);
      await waitFor(
        async () =>
          (
            await db.query(
              "SELECT count(*)::int AS n FROM {{schema}}.tasks WHERE id = $1 AND state = 'active' AND lease_expires_at > now() + ($2::float8 + 5500) * interval '1 millisecond'",
              [info.id, clock.offsetMs],
            )
          )[0]!.n === 1,
        10_000,
        `the lease extended after step ${step}`,
      );
    }
    release.resolve();
    await waitFor(async () => (await taskRow(info.id)) === undefined, 30_000, 'task completes');
    assert.equal(aborted, false);
    assert.equal(server.metrics().leasesLost, 0);
    assert.equal(server.metrics().recovered, 0);
  });

  test('a lease taken away from outside aborts the handler with LeaseExpiredError; its writes are fenced', { timeout: 30_000 }, async () => {
    await reset();
    const info = await client.enqueue(new Task('revoked'));
    const started = deferred();
    const reason = deferred<unknown>();
    const release = deferred();
    let resultError: unknown;
    // No one extends the thief's lease: a recoverer with the fast cutoff could take the task
    // back before the test reads it on a loaded machine, so this one waits a minute.
    const server = await startServer(
      async (_t, ctx) => {
        ctx.signal.addEventListener('abort', () => reason.resolve(ctx.signal.reason));
        started.resolve();
        await release.promise;
        await ctx.writeResult('too late').catch((err) => (resultError = err));
      },
      { recoverCutoff: 60_000 },
    );
    // The lease is taken once the handler runs: a claim whose reply came past the lease's
    // trust (a loaded machine) gives its task back unstarted, and the next claim's lease is
    // the one to take.
    await started.promise;
    const row = await taskIn(info.id, 'active');
    await db.query("UPDATE {{schema}}.tasks SET lease_token = gen_random_uuid(), lease_owner = 'thief' WHERE id = $1", [info.id]);
    const r = await reason.promise;
    assert.ok(r instanceof LeaseExpiredError);
    assert.equal((r as Error).message, 'task lease expired');
    release.resolve();
    await waitFor(() => resultError !== undefined);
    assert.ok(resultError instanceof LeaseExpiredError);
    const now = await taskRow(info.id);
    assert.equal(now.state, 'active');
    assert.equal(now.lease_owner, 'thief');
    assert.equal(now.result, null);
    assert.notEqual(now.lease_token, row.lease_token);
    assert.ok(server.metrics().leasesLost >= 1);
    await server.shutdown();
  });

  test('a held task whose lease is taken before it starts never runs, and counts as a lost lease', { timeout: 30_000 }, async () => {
    await reset();
    const first = await client.enqueue(new Task('first'));
    const held = await client.enqueue(new Task('held'));
    const release = deferred();
    const ran: string[] = [];
    // One slot and one task held ahead: the first task runs and blocks the slot, the second waits in the server's hand.
    const server = await startServer(
      async (t) => {
        ran.push(t.type);
        if (t.type === 'first') await release.promise;
      },
      { concurrency: 1, prefetch: 1, leaseDuration: 30_000, recoverCutoff: 60_000 },
    );
    await taskIn(first.id, 'active');
    await taskIn(held.id, 'active');
    // Both rows are active once the claim commits; the handler is called a moment later.
    await waitFor(() => ran.length > 0, 10_000, 'the first task started');
    assert.deepEqual(ran, ['first']);
    await db.query("UPDATE {{schema}}.tasks SET lease_token = gen_random_uuid(), lease_owner = 'thief' WHERE id = $1", [held.id]);
    // A heartbeat misses the row: the held lease is lost before its task starts.
    await waitFor(() => server.metrics().fencedWrites >= 1, 10_000, 'a heartbeat missed the taken lease');
    assert.equal(server.metrics().leasesLost, 0);
    release.resolve();
    // The slot frees: the held task is given back, which its new owner's token fences.
    await waitFor(() => server.metrics().leasesLost === 1, 10_000, 'the held lease counted as lost');
    assert.deepEqual(ran, ['first']);
    const row = await taskRow(held.id);
    assert.equal(row.state, 'active');
    assert.equal(row.lease_owner, 'thief');
    await server.shutdown();
  });
});

describe('ctx.transaction', () => {
  test("the handler's writes and the completion commit together", { timeout: 30_000 }, async () => {
    await reset();
    const info = await client.enqueue(new Task('charge'), { retention: 60_000 });
    const server = await startServer(recordsEffect('a'));
    await waitFor(async () => (await taskRow(info.id))?.state === 'completed');
    assert.equal((await db.query('SELECT * FROM {{schema}}.side_effects')).length, 1);
    await server.shutdown();
  });

  test("the server's own statements commit asynchronously; ctx.transaction waits for the WAL flush", { timeout: 30_000 }, async () => {
    await reset();
    await client.enqueue(new Task('durable'));
    const seen = deferred<string>();
    await startServer(async (_t, ctx) => {
      await ctx.transaction(async (trx) => {
        const { rows } = await sql<{ synchronous_commit: string }>`SHOW synchronous_commit`.execute(trx);
        seen.resolve(rows[0]!.synchronous_commit);
      });
    });
    assert.equal(await seen.promise, 'on');
    const serverSession = new Db({ connectionString: db.connectionString, schema: db.schema }, 'pgasynq:server:test', { asyncCommit: true });
    const [row] = await serverSession.run(sql<{ synchronous_commit: string }>`SHOW synchronous_commit`);
    await serverSession.close();
    assert.equal(row?.synchronous_commit, 'off');
  });

  test("the library's statements inside ctx.transaction are prepared once per connection; the handler's are sent as written", { timeout: 30_000 }, async () => {
    await reset();
    await client.enqueue(new Task('prepared'));
    const seen = deferred<string[]>();
    await startServer(async (_t, ctx) => {
      await ctx.transaction(async (trx) => {
        const { rows } = await sql<{ name: string }>`SELECT name FROM pg_prepared_statements ORDER BY name`.execute(trx);
        seen.resolve(rows.map((r) => r.name));
      });
    });
    const names = await seen.promise;
    // The transaction's opening and its lease lock ran before the handler's code, on this session.
    for (const statement of ['durable-begin', 'lock-lease'])
      assert.ok(names.includes(`pgasynq:${db.schema}:${statement}`), `${statement} in ${names.join(', ')}`);
    assert.ok(
      names.every((n) => n.startsWith('pgasynq:')),
      `only pgasynq's statements are named: ${names.join(', ')}`,
    );
  });

  test('a named statement in a Kysely transaction runs as one prepared statement, planned from its cache', { timeout: 30_000 }, async () => {
    const counts = await broker.kysely.transaction().execute(async (trx) => {
      for (let i = 0; i < 3; i++) await broker.run(sql`SELECT count(*) FROM ${broker.table('task_states')} WHERE seq = ${String(i)}::bigint`, trx, 'probe');
      return broker.run(
        sql<{
          name: string;
          runs: number;
        }>`SELECT name, (generic_plans + custom_plans)::int AS runs FROM pg_prepared_statements WHERE name LIKE 'pgasynq:%probe'`,
        trx,
      );
    });
    assert.deepEqual(counts, [{ name: `pgasynq:${db.schema}:probe`, runs: 3 }]);
  });

  test('the completion inside ctx.transaction runs from a generic plan, never planned afresh per task', { timeout: 30_000 }, async () => {
    await reset();
    await client.enqueueMany(Array.from({ length: 12 }, (_, i) => new Task('generic', {}, { retention: i % 2 === 0 ? 60_000 : 0 })));
    // One connection, so every completion below runs on the session whose plans are shown.
    const one = new pg.Pool({ connectionString: db.connectionString, max: 1 });
    // auto_explain shows each plan complete_tasks() runs, as a notice: a generic plan
    // names the function's arrays as parameters ($n), a custom one spells out their values.
    const plans: string[] = [];
    one.on('connect', (c) => c.on('notice', (n) => plans.push(n.message ?? '')));
    const session = new Db({ pool: one, schema: db.schema });
    try {
      await session.run(sql`LOAD 'auto_explain'`);
      await session.run(sql`SELECT set_config('auto_explain.log_min_duration', '0', false), set_config('auto_explain.log_nested_statements', 'on', false),
        set_config('auto_explain.log_level', 'notice', false)`);
      for (const row of await claim(session, ['default'], 12, 'me', 30_000)) {
        const done = await session.kysely
          .transaction()
          .execute((trx) => completeHeld(session, trx, { queue: row.queue, id: row.id, seq: row.seq, token: row.lease_token, keep: row.retention_ms > 0 }));
        assert.equal(done, true);
      }
      const fenced = plans.filter((p) => p.includes('lease_token = tokens['));
      assert.equal(fenced.length, 12, 'one fenced statement per completion');
      for (const plan of fenced) assert.match(plan, /seq = ANY \(\$\d+\)/, plan);
      const statements = await session.run(
        sql<{ name: string; generic: number; custom: number }>`SELECT name, generic_plans::int AS generic, custom_plans::int AS custom
          FROM pg_prepared_statements WHERE name LIKE 'pgasynq:%:complete%' ORDER BY name`,
      );
      assert.deepEqual(statements, [{ name: `pgasynq:${db.schema}:complete`, generic: 12, custom: 0 }]);
      assert.equal((await db.query("SELECT count(*)::int AS n FROM {{schema}}.tasks WHERE state = 'completed'"))[0]?.n, 6);
    } finally {
      await session.close();
      await one.end();
    }
  });

  test('a lost lease rolls the transaction back: nothing of it commits', { timeout: 30_000 }, async () => {
    await reset();
    const info = await client.enqueue(new Task('charge'));
    const go = deferred();
    const outcome = deferred<unknown>();
    const server = await startServer(
      async (_t, ctx) => {
        await go.promise;
        await ctx
          .transaction(async (trx) => {
            await trx.insertInto(`${db.schema}.side_effects`).values({ task_id: ctx.taskId, worker: 'a' }).execute();
          })
          .then(
            () => outcome.resolve('committed'),
            (err) => outcome.resolve(err),
          );
      },
      { heartbeatInterval: 5000, leaseDuration: 30_000 },
    );
    await waitFor(async () => (await taskRow(info.id))?.state === 'active');
    await db.query('UPDATE {{schema}}.tasks SET lease_token = gen_random_uuid() WHERE id = $1', [info.id]);
    go.resolve();
    assert.ok((await outcome.promise) instanceof LeaseExpiredError);
    assert.equal((await db.query('SELECT * FROM {{schema}}.side_effects')).length, 0);
    assert.equal((await taskRow(info.id)).state, 'active');
    await server.shutdown();
  });

  test('a transaction that commits after its trust ran out stands: the task completes, and no lease counts as lost', { timeout: 30_000 }, async () => {
    await reset();
    const info = await client.enqueue(new Task('charge'), { retention: 60_000 });
    const outcome = deferred<unknown>();
    const clock = new DatabaseClock();
    const server = await startServer(
      async (_t, ctx) => {
        await ctx
          .transaction(async (trx) => {
            await trx.insertInto(`${db.schema}.side_effects`).values({ task_id: ctx.taskId, worker: 'a' }).execute();
            // A handler that blocked its event loop past the trust (667 ms) inside the transaction: the worker
            // gives the lease up, but the row stayed locked, and the commit is the database's word that it held.
            clock.advance(2000);
          })
          .then(
            () => outcome.resolve('committed'),
            (err: unknown) => outcome.resolve(err),
          );
      },
      { clock },
    );
    assert.equal(await outcome.promise, 'committed');
    await waitFor(async () => (await taskRow(info.id))?.state === 'completed');
    assert.equal((await db.query('SELECT * FROM {{schema}}.side_effects')).length, 1);
    await server.shutdown();
    assert.deepEqual([server.metrics().leasesLost, server.metrics().fencedWrites, server.metrics().recovered], [0, 0, 0]);
  });

  test('a transaction PostgreSQL ended past its trust fails with LeaseExpiredError, the connection error as its cause', { timeout: 30_000 }, async () => {
    await reset();
    const info = await client.enqueue(new Task('charge'), { maxRetry: 3, retention: 60_000 });
    const outcome = deferred<unknown>();
    const clock = new DatabaseClock();
    const server = await startServer(
      async (_t, ctx) => {
        if (ctx.retryCount > 0) return;
        await ctx
          .transaction(async (trx) => {
            // 2 s pass on the clock (not slept through): past the 667 ms trust, and past the lease and the
            // cutoff in the database; then the session ends, as PostgreSQL ends a frozen worker's idle one.
            clock.advance(2000);
            await sql`SELECT pg_terminate_backend(pg_backend_pid())`.execute(trx);
          })
          .catch((err: unknown) => outcome.resolve(err));
      },
      { clock },
    );
    const err = await outcome.promise;
    assert.ok(err instanceof LeaseExpiredError, `the handler saw ${String(err)}`);
    assert.equal((err.cause as { code?: string } | undefined)?.code, '57P01', `cause: ${String(err.cause)}`);
    // Not a failed attempt of the handler's: the recoverer's rescue runs it again.
    await waitFor(async () => (await taskRow(info.id))?.state === 'completed');
    assert.equal(server.metrics().recovered, 1);
  });

  test('a COMMIT whose reply was lost after it committed: ctx.transaction returns, the task completes once', { timeout: 30_000 }, async () => {
    await reset();
    // Drops the reply to the COMMIT of the transaction that completes the task, and resets the socket.
    const proxy = await startCommitProxy({
      targetPort: Number(new URL(db.connectionString).port || 5432),
      p: 1,
      match: /complete_tasks"?\(/,
    });
    let server: Server | undefined;
    try {
      const info = await client.enqueue(new Task('charge'), { retention: 60_000 });
      const outcome = deferred<unknown>();
      server = new Server({ connectionString: proxy.url(db.connectionString), schema: db.schema, logger: false, ...FAST_LEASES });
      running.push(server);
      await server.start(async (_t, ctx) => {
        await ctx
          .transaction(async (trx) => {
            await trx.insertInto(`${db.schema}.side_effects`).values({ task_id: ctx.taskId, worker: 'a' }).execute();
            return 'charged';
          })
          .then(
            (value) => outcome.resolve(value),
            (err: unknown) => outcome.resolve(err),
          );
      });
      assert.equal(await outcome.promise, 'charged');
      assert.equal(proxy.cuts.filter((c) => c.kind === 'explicit').length, 1, 'the COMMIT reply was cut');
      await waitFor(async () => (await taskRow(info.id))?.state === 'completed');
      assert.equal((await taskRow(info.id)).retried, 0);
      assert.equal((await db.query('SELECT * FROM {{schema}}.side_effects')).length, 1);
      // Not lost either, even if the lookup outlasted the 667 ms trust: the commit stands.
      assert.deepEqual([server.metrics().fencedWrites, server.metrics().leasesLost], [0, 0]);
    } finally {
      // The server first: the proxy's close waits for the connections through it.
      await server?.shutdown();
      await proxy.close();
    }
  });

  test('a user error inside the transaction rolls it back and fails the task', { timeout: 30_000 }, async () => {
    await reset();
    const info = await client.enqueue(new Task('charge'), { maxRetry: 0 });
    // A lease of 5 s: inside ctx.transaction the heartbeats skip the task (its row is locked), so with the file's
    // 1 s lease (trusted 667 ms) a loaded machine's slow transaction gave the lease up before the failure was written.
    const server = await startServer(
      recordsEffect('a', () => {
        throw new Error('card declined');
      }),
      { leaseDuration: 5000, heartbeatInterval: 500 },
    );
    await waitFor(async () => (await taskRow(info.id))?.state === 'archived');
    assert.equal((await taskRow(info.id)).error_msg, 'card declined');
    assert.equal((await db.query('SELECT * FROM {{schema}}.side_effects')).length, 0);
    await server.shutdown();
  });

  test(
    'ctx.writeResult and ctx.progress inside the transaction are refused at once (they would wait for its lock), and nothing of it commits',
    { timeout: 30_000 },
    async () => {
      await reset();
      const info = await client.enqueue(new Task('charge'), { maxRetry: 0, retention: 60_000 });
      const refused: unknown[] = [];
      // A lease of 60 s: the write used to wait for the row the transaction holds until PostgreSQL ended the idle transaction.
      const server = await startServer(
        async (_t, ctx) => {
          for (const write of [() => ctx.writeResult({ n: 1 }), () => ctx.progress(50)]) {
            await ctx
              .transaction(async (trx) => {
                await trx.insertInto(`${db.schema}.side_effects`).values({ task_id: ctx.taskId, worker: 'a' }).execute();
                await write();
              })
              .catch((err: unknown) => refused.push(err));
          }
          await ctx.writeResult({ n: 2 }); // before a transaction, as the error says
        },
        { leaseDuration: 60_000, heartbeatInterval: 1000 },
      );
      const row = await taskIn(info.id, 'completed');
      assert.equal(refused.length, 2);
      for (const err of refused) assert.ok(err instanceof FailedPreconditionError && /inside ctx.transaction/.test(err.message), String(err));
      assert.deepEqual(row.result, { n: 2 });
      assert.equal((await db.query('SELECT * FROM {{schema}}.side_effects')).length, 0);
      await server.shutdown();
    },
  );
});
