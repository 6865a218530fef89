/**
 * The database is the trust boundary: what a login that is not the owner can
 * do to other tenants' tasks through its grants, tried as the roles of
 * `pgasynq roles` (prefixed, on the test database) with the exploits a
 * security review found. A producer writes tasks only through the owner's
 * functions, which check what they are given and decide from the database:
 * no row it can plant, no edge it can forge, no lock it can hold or delete;
 * and code planted on a login's search_path never runs in the library's
 * statements.
 */
import assert from 'node:assert/strict';
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe } from 'node:test';
import pg from 'pg';
import { Client, Inspector, Server, Snooze, Task, roleSetupSql } from '../src/index.js';
import { Db } from '../src/broker/db.js';
import { forwardDue } from '../src/broker/maintenance.js';
import { silentLogger } from '../src/internal/logger.js';
import { Aggregator } from '../src/server/aggregator.js';
import { Janitor } from '../src/server/janitor.js';
import { Recoverer } from '../src/server/recoverer.js';
import { StatsCollector } from '../src/server/stats.js';
import { deferred, dsnWith, REPO, test, testDb, waitFor, type TestDb } from './helpers.js';

const PREFIX = `t26${process.env.TEST_SCHEMA_SUFFIX ?? ''}`;
const KINDS = ['owner', 'producer', 'worker', 'monitor', 'inspector', 'admin'] as const;
type Kind = (typeof KINDS)[number];

let db: TestDb;
const pools = new Map<Kind, pg.Pool>();
/** The logins' password: a server that asks for one (the embedded PostgreSQL) gets it; trust ignores it. */
const PASSWORD = 'trust-roles-pw';
const url = (kind: Kind) => dsnWith({ user: `${PREFIX}_${kind}_login`, password: PASSWORD });
const as = (kind: Kind, text: string, values?: unknown[]) => pools.get(kind)!.query(text.replaceAll('{{S}}', `"${db.schema}"`), values);

/** Rejects with SQLSTATE `code`, and nothing else. */
async function refused(p: Promise<unknown>, what: string, code = '42501'): Promise<Error & { column?: string }> {
  let error: unknown;
  await assert.rejects(p, (err: { code?: string; message?: string }) => {
    assert.equal(err?.code, code, `${what}: expected SQLSTATE ${code}, got ${err?.code}: ${err?.message}`);
    error = err;
    return true;
  });
  return error as Error & { column?: string };
}

async function dropRoles(): Promise<void> {
  for (const kind of KINDS) {
    for (const role of [`${PREFIX}_${kind}_login`, `${PREFIX}_${kind}`]) {
      const exists = await db.pool.query('SELECT 1 FROM pg_roles WHERE rolname = $1', [role]);
      if (exists.rowCount === 0) continue;
      await db.pool.query(`DROP OWNED BY "${role}" CASCADE`);
      await db.pool.query(`DROP ROLE "${role}"`);
    }
  }
}

/** One task's state row, as the owner reads it. */
async function stateOf(queue: string, id: string): Promise<{ state: string; waiting_for: number | null; has_dependents: boolean } | undefined> {
  const rows = await db.query(
    'SELECT s.state, s.waiting_for, s.has_dependents FROM {{schema}}.task_states s JOIN {{schema}}.task_inputs i USING (seq) WHERE i.queue = $1 AND i.id = $2',
    [queue, id],
  );
  return rows[0] as never;
}

before(async () => {
  db = await testDb('trust_roles');
  await db.pool.query(`DROP SCHEMA IF EXISTS public_trap CASCADE`);
  await dropRoles();
  await db.pool.query(roleSetupSql({ schema: db.schema, prefix: PREFIX, logins: true }));
  for (const kind of KINDS) await db.pool.query(`ALTER ROLE "${PREFIX}_${kind}_login" PASSWORD '${PASSWORD}'`);
  for (const kind of KINDS) pools.set(kind, new pg.Pool({ connectionString: url(kind), max: 4 }));
});

after(async () => {
  await Promise.all([...pools.values()].map((p) => p.end().catch(() => {})));
  await db.pool.query(`DROP SCHEMA IF EXISTS "${db.schema}" CASCADE`);
  await db.pool.query('DROP TABLE IF EXISTS public.t26_calls').catch(() => {});
  await db.pool.query('DROP FUNCTION IF EXISTS public.unnest(text[]), public.unnest(bigint[]), public.unnest(uuid[])').catch(() => {});
  await db.pool.query('DROP OPERATOR IF EXISTS public.* (integer, interval)').catch(() => {});
  await db.pool.query('DROP FUNCTION IF EXISTS public.t26_times(integer, interval)').catch(() => {});
  await dropRoles();
  await db.close();
});

describe('a producer writes tasks only through the library', () => {
  test('no INSERT, UPDATE, DELETE or row lock on the task tables, edges or unique locks', async () => {
    const client = new Client({ connectionString: url('producer'), schema: db.schema, logger: false });
    try {
      await client.enqueue(new Task('victim', null), { queue: 'other', taskId: 'v1', unique: 3_600_000 });
    } finally {
      await client.close();
    }
    const seq = (await db.query('SELECT last_value FROM {{schema}}.task_seq'))[0]!.last_value as string;
    for (const stmt of [
      // Planted rows ahead of the sequence: every later enqueue would fail on them.
      `INSERT INTO {{S}}.task_inputs (seq, queue, id, type) VALUES (${seq} + 5, 'q', 'plant', 't')`,
      `INSERT INTO {{S}}.task_states (seq, queue, state, pending_seq, run_at) VALUES (${seq} + 5, 'q', 'pending', ${seq} + 5, now())`,
      `INSERT INTO {{S}}.tasks (seq, queue, id, type, state) VALUES (${seq} + 6, 'q', 'plant', 't', 'pending')`,
      // Forged edges and marks.
      "INSERT INTO {{S}}.task_dependencies (dependent_seq, dependency_seq, dependency_queue, dependency_id, outcome) VALUES (1, 2, 'q', 'x', 'completed')",
      'UPDATE {{S}}.task_states SET has_dependents = false',
      // Other producers' live locks.
      'DELETE FROM {{S}}.unique_locks WHERE expires_at > now()',
      // Row locks that would stop every claim of the queue.
      "SELECT seq FROM {{S}}.task_states WHERE queue = 'other' FOR NO KEY UPDATE",
      "SELECT id FROM {{S}}.tasks WHERE queue = 'other' FOR UPDATE",
      "SELECT id FROM {{S}}.tasks WHERE queue = 'other' FOR KEY SHARE",
    ]) {
      await refused(as('producer', stmt), `producer: ${stmt}`);
    }
    // Reading tasks stays allowed, as the README says.
    assert.equal((await as('producer', "SELECT count(*)::int AS n FROM {{S}}.tasks WHERE queue = 'other'")).rows[0].n, 1);
    assert.equal((await db.query('SELECT count(*)::int AS n FROM {{schema}}.unique_locks'))[0]!.n, 1);
  });

  test("enqueue_tasks() called directly: the database plans the edges, the caller's plan keys are ignored", async () => {
    const client = new Client({ connectionString: url('producer'), schema: db.schema, logger: false });
    try {
      // Another tenant's workflow: `after` waits for `dep`, due an hour from now.
      await client.enqueue(new Task('dep', null), { queue: 'tenant', taskId: 'dep', processIn: 3_600_000 });
      await client.enqueue(new Task('after', null), { queue: 'tenant', taskId: 'after', dependsOn: ['dep'] });
    } finally {
      await client.close();
    }
    assert.deepEqual(await stateOf('tenant', 'after'), { state: 'waiting', waiting_for: 1, has_dependents: false });
    // The attacker's own task claims, in keys the library never sends, to be settled already
    // and to have the other tenant's task for a dependent.
    const forged = JSON.stringify([
      { i: 'mine', q: 'attacker', t: 't', m: 0, to: 1000, dp: [['tenant', 'dep']], w: 0, o: 'completed', result: { forged: true }, hd: true },
    ]);
    await as('producer', 'SELECT * FROM {{S}}.enqueue_tasks($1::json, now(), false)', [forged]);
    assert.deepEqual(await stateOf('attacker', 'mine'), { state: 'waiting', waiting_for: 1, has_dependents: false });
    const edges = await db.query(
      "SELECT dependency_queue, dependency_id, outcome, d.result FROM {{schema}}.task_dependencies d JOIN {{schema}}.tasks t ON t.seq = d.dependent_seq WHERE t.id = 'mine'",
    );
    assert.deepEqual(edges, [{ dependency_queue: 'tenant', dependency_id: 'dep', outcome: null, result: null }]);
    // The other tenant's task still waits for its real dependency, with the same one edge.
    assert.deepEqual(await stateOf('tenant', 'after'), { state: 'waiting', waiting_for: 1, has_dependents: false });
    assert.equal((await stateOf('tenant', 'dep'))!.has_dependents, true);
  });

  test('enqueue_tasks() and replace_tasks() called directly refuse what the library refuses (22023 naming the field)', async () => {
    const before = (await db.query('SELECT count(*)::int AS n FROM {{schema}}.tasks'))[0]!.n as number;
    const row = { i: 'x1', q: 'tenant', t: 't', m: 1, to: 1000 };
    const bad: [object, string][] = [
      [{ t: 'bad\u0001type' }, 'type'],
      [{ m: 1_000_000 }, 'maxRetry'],
      [{ to: -1 }, 'timeout'],
      [{ pr: 100_0 }, 'priority'],
      [{ q: 'no spaces' }, 'queue'],
      [{ i: '../x' }, 'taskId'],
      [{ r: 1e300 }, 'retention'],
      [{ at: '280000-01-01T00:00:00Z' }, 'processAt'],
      [{ h: { a: 1 } }, 'headers'],
      [{ g: 'a b' }, 'group'],
      [{ u: 'k', ut: 1e300 }, 'unique'],
    ];
    for (const [fields, column] of bad) {
      const tasks = JSON.stringify([{ ...row, ...fields }]);
      const e1 = await refused(as('producer', 'SELECT * FROM {{S}}.enqueue_tasks($1::json, now(), false)', [tasks]), `enqueue_tasks ${column}`, '22023');
      assert.equal(e1.column, column);
      assert.match(e1.message, new RegExp(`^pgasynq: invalid ${column}: `));
      const e2 = await refused(
        as('producer', 'SELECT * FROM {{S}}.replace_tasks($1::json, now(), $2)', [tasks, db.schema]),
        `replace_tasks ${column}`,
        '22023',
      );
      assert.equal(e2.column, column);
    }
    assert.equal((await db.query('SELECT count(*)::int AS n FROM {{schema}}.tasks'))[0]!.n, before, 'nothing written');
    // The review's replace: another tenant's scheduled task rewritten with a control-character type.
    const tasks = JSON.stringify([{ i: 'dep', q: 'tenant', t: '\u001b]0;x\u0007', m: 1_000_000, to: -5, pr: 100 }]);
    await refused(as('producer', 'SELECT * FROM {{S}}.replace_tasks($1::json, now(), $2)', [tasks, db.schema]), 'replace_tasks', '22023');
    assert.deepEqual(await db.query("SELECT type, max_retry FROM {{schema}}.tasks WHERE id = 'dep'"), [{ type: 'dep', max_retry: 25 }]);
  });

  test('20 concurrent replace enqueues of an id not yet stored: all succeed, one task, the last one wins', async () => {
    const clients = Array.from({ length: 4 }, () => new Client({ connectionString: url('producer'), schema: db.schema, logger: false }));
    try {
      const results = await Promise.allSettled(
        Array.from({ length: 20 }, (_, n) =>
          clients[n % 4]!.enqueue(new Task('debounced', { n }), { queue: 'replace', taskId: 'new-id', replace: true, processIn: 60_000 }),
        ),
      );
      const failures = results.flatMap((r) => (r.status === 'rejected' ? [String(r.reason)] : []));
      assert.deepEqual(failures, []);
    } finally {
      await Promise.all(clients.map((c) => c.close()));
    }
    assert.equal((await db.query("SELECT count(*)::int AS n FROM {{schema}}.tasks WHERE queue = 'replace'"))[0]!.n, 1);
  });

  test('the monitor cannot read a cron entry’s options (its headers)', async () => {
    await refused(as('monitor', 'SELECT options FROM {{S}}.scheduler_entries'), 'monitor: scheduler_entries.options');
    await as('monitor', 'SELECT id, spec FROM {{S}}.scheduler_entries');
  });
});

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
      leaseDuration: 600,
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
          // Past two lease lengths: only the heartbeats keep it, until shutdown gives it back.
          await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve));
          throw ctx.signal.reason;
        }
        await ctx.writeResult({ ok: ctx.taskId });
      });
      await producer.enqueueMany(['kept', 'fails', 'snoozes', 'tx', 'hold'].map((id) => new Task('w', null, { queue: 'work', taskId: id, retention: 60_000 })));
      await holding.promise;
      await waitFor(async () => (await db.query("SELECT count(*)::int AS n FROM {{schema}}.tasks WHERE state = 'completed'"))[0]!.n === 4, 20_000);
      await new Promise((resolve) => setTimeout(resolve, 1300));
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

describe("the schema's clock (task_now(), 0011) is the database's for every login but the owner", () => {
  test('each role reads the views on the database time; a shift set on its session is refused, in a view and in SQL enqueue()', async () => {
    await db.query(`INSERT INTO {{schema}}.queues (name) VALUES ('clocked') ON CONFLICT DO NOTHING`);
    for (const kind of ['monitor', 'inspector', 'admin'] as const) {
      const [row] = (await as(kind, "SELECT extract(epoch FROM now() - timestamp) AS behind FROM {{S}}.queue_stats WHERE queue = 'clocked'")).rows as {
        behind: string;
      }[];
      assert.equal(Number(row!.behind), 0, `${kind}: queue_stats' timestamp is the transaction's now()`);
      await as(kind, 'SELECT orphaned FROM {{S}}.active_tasks');
    }
    for (const [kind, stmt] of [
      ['monitor', 'SELECT * FROM {{S}}.queue_stats'],
      ['admin', 'SELECT latency FROM {{S}}.queue_stats'],
      ['producer', "SELECT {{S}}.enqueue('t', queue => 'clocked')"],
    ] as const) {
      const session = await pools.get(kind)!.connect();
      try {
        await session.query("SET pgasynq.clock_shift_ms = '3600000'");
        const err = await refused(session.query(stmt.replaceAll('{{S}}', `"${db.schema}"`)), `${kind} an hour ahead: ${stmt}`);
        assert.equal(err.column, 'clock');
      } finally {
        await session.query('RESET pgasynq.clock_shift_ms');
        session.release();
      }
    }
    assert.deepEqual(await db.query(`SELECT 1 FROM {{schema}}.tasks WHERE queue = 'clocked'`), [], 'the refused enqueue wrote nothing');
  });
});

describe("code planted on a login's search_path never runs in the library's statements", () => {
  test('a public.unnest(text[]) and an operator *(integer, interval): no call from claims, limited claims, enqueues, replaces or the Inspector', async () => {
    // What PostgreSQL up to 14 allows every role, and upgraded databases keep.
    await db.pool.query(`GRANT CREATE ON SCHEMA public TO "${PREFIX}_producer_login"`);
    // Who called, too: other test files share the database (and its public schema), and
    // their own statements may call an unqualified unnest; only this file's logins count.
    await db.pool.query('DROP TABLE IF EXISTS public.t26_calls');
    await db.pool.query('CREATE TABLE public.t26_calls (fn text, who text DEFAULT session_user, at timestamptz DEFAULT now())');
    await db.pool.query('GRANT INSERT, SELECT ON public.t26_calls TO PUBLIC');
    for (const type of ['text[]', 'bigint[]', 'uuid[]']) {
      await as(
        'producer',
        `CREATE FUNCTION public.unnest(a ${type}) RETURNS SETOF ${type.slice(0, -2)} LANGUAGE plpgsql AS $$
         BEGIN INSERT INTO public.t26_calls (fn) VALUES ('unnest(${type})'); RETURN QUERY SELECT pg_catalog.unnest(a); END $$`,
      );
    }
    await as(
      'producer',
      `CREATE FUNCTION public.t26_times(n integer, i interval) RETURNS interval LANGUAGE plpgsql AS $$
       BEGIN INSERT INTO public.t26_calls (fn) VALUES ('*(integer, interval)'); RETURN n::float8 * i; END $$;
       CREATE OPERATOR public.* (LEFTARG = integer, RIGHTARG = interval, FUNCTION = public.t26_times)`,
    );
    const calls = async () =>
      (
        await db.pool.query<{ fn: string; n: number }>(
          'SELECT fn, count(*)::int AS n FROM public.t26_calls WHERE starts_with(who, $1) GROUP BY fn ORDER BY fn',
          [`${PREFIX}_`],
        )
      ).rows;
    // The trap works where nothing is pinned.
    await as('worker', "SELECT unnest(ARRAY['a']::text[])");
    assert.deepEqual(await calls(), [{ fn: 'unnest(text[])', n: 1 }]);
    await db.pool.query('TRUNCATE public.t26_calls');

    const admin = new Inspector({ connectionString: url('admin'), schema: db.schema, logger: false });
    const producer = new Client({ connectionString: url('producer'), schema: db.schema, logger: false });
    const server = new Server({
      connectionString: url('worker'),
      schema: db.schema,
      logger: false,
      queues: { plain: 1, limited: 1 },
      concurrency: 4,
      taskCheckInterval: 50,
      delayedTaskCheckInterval: 50,
      shutdownTimeout: 1000,
    });
    const done = new Set<string>();
    try {
      await producer.enqueue(new Task('x', null), { queue: 'limited', taskId: 'l0' });
      await admin.setQueueLimits('limited', { concurrency: 2, keyConcurrency: 1, rateLimit: { limit: 100, interval: 60_000 } });
      await server.start(async (_task, ctx) => {
        done.add(ctx.taskId);
        await ctx.writeResult({ ok: true });
      });
      await producer.enqueueMany([
        ...Array.from({ length: 5 }, (_, n) => new Task('x', null, { queue: 'plain', taskId: `p${n}`, retention: 60_000 })),
        ...Array.from({ length: 5 }, (_, n) => new Task('x', null, { queue: 'limited', taskId: `l${n + 1}`, concurrencyKey: `k${n}` })),
        new Task('x', null, { queue: 'plain', taskId: 'child', dependsOn: ['p0', 'p1'] }),
        new Task('x', null, { queue: 'plain', taskId: 'later', processIn: 100 }),
      ]);
      await producer.enqueue(new Task('y', null), { queue: 'plain', taskId: 'later', processIn: 100, replace: true });
      await waitFor(() => done.size === 13, 20_000, `every task run (${[...done].join(', ')})`);
      await admin.listCompletedTasks('plain');
      await admin.getTaskInfo('plain', 'p0');
      await admin.getQueueInfo('limited');
      await admin.deleteAllCompletedTasks('plain');
    } finally {
      await server.shutdown();
      await producer.close();
      await admin.close();
    }
    assert.deepEqual(await calls(), []);
  });

  test('no broker statement calls a polymorphic function unqualified', () => {
    // What a planted exact-typed overload would win over (the list the statements use, and their kin).
    const risky =
      /(?<![\w.])(unnest|array_agg|json_agg|jsonb_agg|json_build_array|jsonb_build_array|json_build_object|jsonb_build_object|to_json|to_jsonb|cardinality|array_length|array_position|format|count|min|max|sum|avg|string_agg|json_array_elements|json_to_recordset)\(/;
    const found: string[] = [];
    const dir = join(REPO, 'src', 'broker');
    for (const file of readdirSync(dir).filter((f) => f.endsWith('.ts') && f !== 'roles.ts' && f !== 'migrations.ts')) {
      readFileSync(join(dir, file), 'utf8')
        .split('\n')
        .forEach((line, n) => {
          if (!/^\s*(\*|\/\/|\/\*\*)/.test(line) && risky.test(line)) found.push(`${file}:${n + 1}: ${line.trim()}`);
        });
    }
    assert.deepEqual(found, []);
  });
});
