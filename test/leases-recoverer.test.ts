/**
 * Leases at claim, fencing by token, and the recoverer (issue "core engine,
 * part 2"): which expired leases it takes back, once, and what it leaves.
 */
import assert from 'node:assert/strict';
import { describe } from 'node:test';
import { Task } from '../src/index.js';
import { Db } from '../src/broker/db.js';
import { complete, extendLeases, fail, requeue, writeResult } from '../src/broker/leases.js';
import { findExpired, recoverLeases } from '../src/broker/maintenance.js';
import { Recoverer } from '../src/server/recoverer.js';
import { StatsCollector } from '../src/server/stats.js';
import { silentLogger } from '../src/internal/logger.js';
import { claimLimited } from '../src/broker/claim.js';
import { claim, selectTask } from './broker-helpers.js';
import { test } from './helpers.js';
import { leasesFile, noLockWaitPool } from './shared.js';

const { db, client, broker, reset, taskRow, activeTask } = leasesFile('t_leases_recoverer');

function recoverer(cutoffMs: number, on: Db = broker): Recoverer {
  return new Recoverer(
    on,
    silentLogger,
    { recoverInterval: 60_000, recoverCutoff: cutoffMs, leaseDuration: 30_000, retryDelay: () => 5000 },
    new StatsCollector(on),
  );
}

describe('lease at claim', () => {
  test('a claim sets active, a lease on the database clock, the owner and a new token each time', { timeout: 30_000 }, async () => {
    await reset();
    const info = await client.enqueue(new Task('c'));
    // The database's clock on either side of the claim bounds its lease: a
    // loaded machine may take a second between the claim and a later read.
    const [{ before }] = await db.query('SELECT clock_timestamp() AS before');
    const [row] = await claim(broker, ['default'], 10, 'server-a', 30_000);
    const [{ after }] = await db.query('SELECT clock_timestamp() AS after');
    assert.equal(row?.id, info.id);
    const r1 = await taskRow(info.id);
    assert.equal(r1.state, 'active');
    assert.equal(r1.lease_owner, 'server-a');
    const expires = new Date(r1.lease_expires_at).getTime();
    assert.ok(expires >= new Date(before).getTime() + 30_000 && expires <= new Date(after).getTime() + 30_000, 'the lease runs 30 s from the claim');
    await requeue(broker, [{ queue: 'default', id: info.id, seq: row.seq, token: r1.lease_token }]);
    const [again] = await claim(broker, ['default'], 10, 'server-b', 30_000);
    assert.notEqual(again?.lease_token, r1.lease_token, 'a new token on every claim');
  });

  test("the tasks of one claim, plain or limited, each hold a token of their own that fences the others' writes", { timeout: 30_000 }, async () => {
    await reset();
    const tasks = await client.enqueueMany(Array.from({ length: 4 }, (_, i) => new Task('c', i)));
    const limited = await client.enqueueMany(
      Array.from({ length: 3 }, (_, i) => new Task('c', i)),
      { queue: 'lim' },
    );
    await db.query("UPDATE {{schema}}.queues SET concurrency = 10 WHERE name = 'lim'");
    const plain = await claim(broker, ['default'], 10, 'server-a', 30_000);
    const { rows: capped } = await claimLimited(broker, ['lim'], [10], 10, 'server-a', 30_000);
    assert.deepEqual(plain.map((r) => r.id).sort(), tasks.map((t) => t.id).sort());
    assert.deepEqual(capped.map((r) => r.id).sort(), limited.map((t) => t.id).sort());
    const tokens = [...plain, ...capped].map((r) => r.lease_token);
    assert.equal(new Set(tokens).size, tokens.length, 'no two tasks share a token');
    for (const r of [...plain, ...capped]) assert.equal((await taskRow(r.id)).lease_token, r.lease_token);
    // One task's token does not complete another task of the same claim.
    const [a, b] = plain;
    assert.deepEqual(await complete(broker, [{ queue: a!.queue, id: a!.id, seq: a!.seq, token: b!.lease_token, keep: false }]), []);
    assert.equal((await taskRow(a!.id)).state, 'active');
    assert.equal((await complete(broker, [{ queue: a!.queue, id: a!.id, seq: a!.seq, token: a!.lease_token, keep: false }])).length, 1);
  });

  test('an active row without a lease is impossible (CHECK constraint)', { timeout: 30_000 }, async () => {
    await reset();
    const info = await client.enqueue(new Task('c'));
    await assert.rejects(db.query("UPDATE {{schema}}.tasks SET state = 'active' WHERE id = $1", [info.id]), /tasks_active_has_lease/);
  });

  test('a task moved out of active holds no lease, whoever moves it (the table, the view, a repair in SQL)', { timeout: 30_000 }, async () => {
    await reset();
    await client.enqueueMany([new Task('a', null, { taskId: 'by-table' }), new Task('a', null, { taskId: 'by-view' })]);
    assert.equal((await claim(broker, ['default'], 10, 'server-a', 30_000)).length, 2);
    await db.query(
      "UPDATE {{schema}}.task_states s SET state = 'retry', run_at = now() FROM {{schema}}.task_inputs i WHERE i.seq = s.seq AND i.id = 'by-table'",
    );
    await db.query("UPDATE {{schema}}.tasks SET state = 'archived' WHERE id = 'by-view'");
    for (const id of ['by-table', 'by-view']) {
      const r = await taskRow(id);
      assert.deepEqual([r.lease_owner, r.lease_token, r.lease_expires_at], [null, null, null], id);
    }
    // The lease of an active task is left as it is: an extension is not a move.
    await client.enqueue(new Task('a', null, { taskId: 'running' }));
    const [row] = await claim(broker, ['default'], 10, 'server-a', 30_000);
    assert.equal((await extendLeases(broker, [{ queue: 'default', id: 'running', seq: row!.seq, token: row!.lease_token }], 60_000)).length, 1);
    assert.equal((await taskRow('running')).lease_token, row!.lease_token);
  });

  test('TaskInfo.isOrphaned: active with an expired lease, not yet recovered', { timeout: 30_000 }, async () => {
    await reset();
    const fresh = await activeTask(0, 5, "now() + interval '10 seconds'");
    const orphan = await activeTask(0, 5, "now() - interval '1 second'");
    assert.equal((await selectTask(broker, 'default', fresh))?.isOrphaned, false);
    assert.equal((await selectTask(broker, 'default', orphan))?.isOrphaned, true);
  });
});

describe('fencing', () => {
  test('every write about a claimed task carries the token: a stale token changes nothing', { timeout: 30_000 }, async () => {
    await reset();
    const info = await client.enqueue(new Task('f'), { retention: 60_000 });
    const [row] = await claim(broker, ['default'], 1, 'a', 30_000);
    assert.ok(row);
    // Someone else claims it: the lease moves on to a new token.
    await db.query("UPDATE {{schema}}.tasks SET lease_token = gen_random_uuid(), lease_owner = 'b' WHERE id = $1", [info.id]);
    const before = await taskRow(info.id);
    const stale = { queue: 'default', id: info.id, seq: row.seq, token: row.lease_token };
    assert.deepEqual(await complete(broker, [{ ...stale, keep: false }]), []);
    assert.deepEqual(await complete(broker, [{ ...stale, keep: true }]), []);
    assert.deepEqual(await fail(broker, [{ ...stale, archive: false, counts: true, delayMs: 0, error: 'x', outcome: 'failed' }]), []);
    assert.deepEqual(await fail(broker, [{ ...stale, archive: true, counts: true, delayMs: 0, error: 'x', outcome: 'failed' }]), []);
    assert.deepEqual(await requeue(broker, [stale]), []);
    assert.deepEqual(await extendLeases(broker, [stale], 30_000), []);
    assert.equal(await writeResult(broker, stale, '{"r":1}', null), false);
    assert.deepEqual(await taskRow(info.id), before, 'the row is exactly as it was');
  });
});

describe('heartbeat', () => {
  test('an extension never waits for a row lock: a row another transaction holds is busy, neither extended nor lost', { timeout: 30_000 }, async () => {
    await reset();
    await client.enqueueMany([new Task('h', null, { taskId: 'free' }), new Task('h', null, { taskId: 'held' })]);
    const rows = await claim(broker, ['default'], 10, 'server-a', 30_000);
    const lease = (id: string) => {
      const r = rows.find((x) => x.id === id)!;
      return { queue: 'default', id, seq: r.seq, token: r.lease_token };
    };
    const before = (await taskRow('held')).lease_expires_at;
    // Another transaction holds one row (a completion batch under way, an admin's write).
    const holder = await broker.pool.connect();
    // The extension's session may not wait for a lock: waiting for the held row would be an error, not a delay.
    const pool = noLockWaitPool();
    const noWait = new Db({ pool, schema: db.schema });
    try {
      await holder.query('BEGIN');
      await holder.query(`SELECT 1 FROM "${db.schema}".task_states WHERE seq = $1 FOR UPDATE`, [lease('held').seq]);
      const extended = await extendLeases(noWait, [lease('free'), lease('held')], 60_000);
      assert.deepEqual(
        extended.map((e) => [e.lease.id, e.cancelRequested]),
        [
          ['free', false],
          ['held', null],
        ],
      );
      await holder.query('COMMIT');
    } finally {
      holder.release();
      await noWait.close();
      await pool.end();
    }
    assert.deepEqual((await taskRow('held')).lease_expires_at, before, 'the held row was not extended');
    // Once the lock is gone, the next extension takes it as any other.
    assert.deepEqual(
      (await extendLeases(broker, [lease('held')], 60_000)).map((e) => e.cancelRequested),
      [false],
    );
    assert.ok((await taskRow('held')).lease_expires_at > before);
  });
});

describe('recoverer', () => {
  test('boundaries: just past the cutoff is recovered, just short of it is not', { timeout: 30_000 }, async () => {
    await reset();
    const past = await activeTask(0, 5, "now() - interval '30 seconds' - interval '1 second'");
    const short = await activeTask(0, 5, "now() - interval '30 seconds' + interval '2 seconds'");
    const live = await activeTask(0, 5, "now() + interval '10 seconds'");
    const result = await recoverer(30_000).runOnce();
    assert.deepEqual(result, { retried: 1, archived: 0 });
    const p = await taskRow(past);
    assert.equal(p.state, 'retry');
    assert.equal(p.retried, 1);
    assert.equal(p.error_msg, 'task lease expired');
    assert.equal(p.lease_token, null);
    const [{ secs }] = await db.query('SELECT extract(epoch FROM run_at - last_failed_at)::float8 AS secs FROM {{schema}}.tasks WHERE id = $1', [past]);
    assert.equal(secs, 5, 'next run by the retry delay');
    assert.equal((await taskRow(short)).state, 'active');
    assert.equal((await taskRow(live)).state, 'active');
  });

  test('retried = maxRetry − 1 is retried; retried = maxRetry is archived', { timeout: 30_000 }, async () => {
    await reset();
    const oneLeft = await activeTask(2, 3, "now() - interval '1 minute'");
    const spent = await activeTask(3, 3, "now() - interval '1 minute'");
    assert.deepEqual(await recoverer(30_000).runOnce(), { retried: 1, archived: 1 });
    assert.equal((await taskRow(oneLeft)).state, 'retry');
    assert.equal((await taskRow(oneLeft)).retried, 3);
    const s = await taskRow(spent);
    assert.equal(s.state, 'archived');
    assert.equal(s.retried, 3, 'the recoverer never resets or bumps retried on archive');
  });

  test('rows in other states are untouched; recoverCutoff 0 means no cutoff', { timeout: 30_000 }, async () => {
    await reset();
    await client.enqueue(new Task('pending'));
    await client.enqueue(new Task('scheduled'), { processIn: 60_000 });
    const justExpired = await activeTask(0, 5, "now() - interval '10 milliseconds'");
    const before = await db.query("SELECT * FROM {{schema}}.tasks WHERE state <> 'active' ORDER BY id");
    assert.deepEqual(await recoverer(0).runOnce(), { retried: 1, archived: 0 });
    assert.equal((await taskRow(justExpired)).state, 'retry');
    assert.deepEqual(await db.query("SELECT * FROM {{schema}}.tasks WHERE state <> 'active' AND id <> $1 ORDER BY id", [justExpired]), before);
  });

  test('a lease impossibly far in the future is treated as expired', { timeout: 30_000 }, async () => {
    await reset();
    const corrupt = await activeTask(0, 5, "now() + interval '1 day'");
    assert.deepEqual(await recoverer(30_000).runOnce(), { retried: 1, archived: 0 });
    assert.equal((await taskRow(corrupt)).state, 'retry');
  });

  test('a lease extended, or a task recovered, between the read and the write is left as it is', { timeout: 30_000 }, async () => {
    await reset();
    const bounds = { cutoffMs: 30_000, leaseMs: 30_000 };
    const extended = await activeTask(0, 5, "now() - interval '1 minute'");
    const taken = await activeTask(0, 5, "now() - interval '1 minute'");
    const expired = await findExpired(broker, bounds, 10);
    assert.deepEqual(expired.map((e) => e.id).sort(), [extended, taken].sort());
    // Meanwhile a heartbeat lands on one, and another recoverer (same decisions) takes the other.
    await db.query("UPDATE {{schema}}.tasks SET lease_expires_at = now() + interval '30 seconds' WHERE id = $1", [extended]);
    const decisions = expired.map((e) => ({ seq: e.seq, token: e.lease_token, archive: false, delayMs: 0 }));
    const other = await recoverLeases(
      broker,
      decisions.filter((d) => d.seq === expired.find((e) => e.id === taken)!.seq),
      bounds,
    );
    assert.equal(other.length, 1);
    const before = await db.query('SELECT * FROM {{schema}}.tasks ORDER BY id');
    assert.deepEqual(await recoverLeases(broker, decisions, bounds), [], 'nothing left to recover');
    assert.deepEqual(await db.query('SELECT * FROM {{schema}}.tasks ORDER BY id'), before, 'neither row changed');
    assert.equal((await taskRow(extended)).state, 'active');
    assert.equal((await taskRow(taken)).retried, 1, 'recovered once');
  });

  test('recover_leases() and drop_orphans() called directly keep their fence; bounds out of range are refused', { timeout: 30_000 }, async () => {
    await reset();
    const lease = async (id: string) =>
      (
        await db.query<{ seq: string; token: string }>(
          'SELECT s.seq::text AS seq, s.lease_token AS token FROM {{schema}}.task_states s JOIN {{schema}}.task_inputs i USING (seq) WHERE i.id = $1',
          [id],
        )
      )[0]!;
    const live = await lease(await activeTask(0, 5, "now() + interval '1 minute'"));
    const expired = await lease(await activeTask(0, 5, "now() - interval '1 minute'"));
    // An active state row without inputs, its lease run out.
    const [orphan] = await db.query<{ seq: string; token: string }>(
      `INSERT INTO {{schema}}.task_states (seq, queue, state, lease_owner, lease_token, lease_expires_at)
       VALUES (nextval('{{schema}}.task_seq'), 'default', 'active', 'gone', gen_random_uuid(), now() - interval '1 minute')
       RETURNING seq::text AS seq, lease_token AS token`,
    );
    const other = '00000000-0000-4000-8000-000000000000';
    // As the owner, on the statements' own terms: seqs, tokens, decisions, cutoff, lease, shift.
    const recover = (t: { seq: string; token: string }, cutoffMs: number | null = 30_000, leaseMs: number | null = 30_000) =>
      db.query('SELECT * FROM {{schema}}.recover_leases(ARRAY[$1]::bigint[], ARRAY[$2]::uuid[], ARRAY[false], ARRAY[0]::float8[], $3, $4, 0)', [
        t.seq,
        t.token,
        cutoffMs,
        leaseMs,
      ]);
    const drop = (t: { seq: string; token: string }, cutoffMs: number | null = 30_000, leaseMs: number | null = 30_000) =>
      db.query('SELECT * FROM {{schema}}.drop_orphans(ARRAY[$1]::bigint[], ARRAY[$2]::uuid[], $3, $4, 0)', [t.seq, t.token, cutoffMs, leaseMs]);
    const before = await db.query('SELECT * FROM {{schema}}.task_states ORDER BY seq');

    // A token that no longer matches (the lease moved on): nothing.
    assert.deepEqual(await recover({ ...expired, token: other }), []);
    assert.deepEqual(await drop({ ...orphan!, token: other }), []);
    // The right token, on a lease that has not run out, or not by the cutoff: nothing.
    assert.deepEqual(await recover(live), []);
    assert.deepEqual(await recover(expired, 120_000), []);
    assert.deepEqual(await drop(orphan!, 120_000), []);
    // A task with inputs is no orphan, however expired its lease.
    assert.deepEqual(await drop(expired), []);
    // Bounds the config would refuse: a negative cutoff or a lease of no length would make every live lease recoverable.
    for (const [cutoffMs, leaseMs, column] of [
      [-3_600_000, 30_000, 'recoverCutoff'],
      [Number.NaN, 30_000, 'recoverCutoff'],
      [null, 30_000, 'recoverCutoff'],
      [30_000, 0, 'leaseDuration'],
      [30_000, Number.POSITIVE_INFINITY, 'leaseDuration'],
    ] as const) {
      for (const call of [() => recover(live, cutoffMs, leaseMs), () => drop(orphan!, cutoffMs, leaseMs)]) {
        await assert.rejects(call, (err: { code?: string; column?: string }) => err.code === '22023' && err.column === column);
      }
    }
    assert.deepEqual(await db.query('SELECT * FROM {{schema}}.task_states ORDER BY seq'), before, 'no row changed');

    assert.deepEqual(await recover(expired), [{ task_seq: expired.seq, archived: false }]);
    assert.deepEqual(await drop(orphan!), [{ drop_orphans: orphan!.seq }]);
  });

  test('a row locked by a running transaction is skipped, not waited for, and rescued once it is free', { timeout: 30_000 }, async () => {
    await reset();
    const busy = await activeTask(0, 5, "now() - interval '1 minute'");
    const free = await activeTask(0, 5, "now() - interval '1 minute'");
    // A ctx.transaction in the middle of a long statement holds the row (no idle timeout ends it).
    const holder = await broker.pool.connect();
    // The recoverer's sessions may not wait for a lock: waiting for the held row would be an error, not a delay.
    const pool = noLockWaitPool();
    const noWait = new Db({ pool, schema: db.schema });
    try {
      await holder.query('BEGIN');
      await holder.query(`SELECT 1 FROM "${db.schema}".task_states s JOIN "${db.schema}".task_inputs i USING (seq) WHERE i.id = $1 FOR UPDATE OF s`, [busy]);
      assert.deepEqual(await recoverer(30_000, noWait).runOnce(), { retried: 1, archived: 0 });
      assert.equal((await taskRow(free)).state, 'retry');
      assert.equal((await taskRow(busy)).state, 'active');
      await holder.query('ROLLBACK');
    } finally {
      holder.release();
      await noWait.close();
      await pool.end();
    }
    assert.deepEqual(await recoverer(30_000).runOnce(), { retried: 1, archived: 0 });
    assert.equal((await taskRow(busy)).state, 'retry');
  });

  test('several recoverers at once recover each task exactly once', { timeout: 30_000 }, async () => {
    await reset();
    await client.enqueueMany(Array.from({ length: 250 }, (_, i) => new Task('orphan', i, { maxRetry: 5, processIn: 3_600_000 })));
    await db.query(
      `UPDATE {{schema}}.tasks SET state = 'active', run_at = NULL, lease_owner = 'gone',
         lease_token = gen_random_uuid(), lease_expires_at = now() - interval '1 minute'`,
    );
    const recoverers = Array.from({ length: 4 }, () => recoverer(30_000));
    const results = await Promise.all(recoverers.map((r) => r.runOnce()));
    assert.equal(
      results.reduce((n, r) => n + r.retried, 0),
      250,
    );
    const rows = await db.query('SELECT retried, count(*)::int AS n FROM {{schema}}.tasks GROUP BY retried');
    assert.deepEqual(rows, [{ retried: 1, n: 250 }], 'no task recovered twice');
  });
});
