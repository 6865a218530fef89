/**
 * The database is the trust boundary (see trust-roles-kit.ts): a producer
 * writes tasks only through the owner's functions, which check what they are
 * given and decide from the database: no row it can plant, no edge it can
 * forge, no lock it can hold or delete; and the monitor cannot read a cron
 * entry's headers.
 */
import assert from 'node:assert/strict';
import { describe } from 'node:test';
import { Client, Inspector, Server, Task } from '../src/index.js';
import { test, waitFor } from './helpers.js';
import { as, db, refused, setupTrustRoles, url } from './trust-roles-kit.js';

setupTrustRoles('trust_roles_producer', 't26p');

/** One task's state row, as the owner reads it. */
async function stateOf(queue: string, id: string): Promise<{ state: string; waiting_for: number | null; has_dependents: boolean } | undefined> {
  const rows = await db.query(
    'SELECT s.state, s.waiting_for, s.has_dependents FROM {{schema}}.task_states s JOIN {{schema}}.task_inputs i USING (seq) WHERE i.queue = $1 AND i.id = $2',
    [queue, id],
  );
  return rows[0] as never;
}

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
    // enqueue_tasks() checks each row as it reads it, in the statement that writes them (0015):
    // a bad third row, after two good ones (one holding a unique key), leaves nothing either.
    const locksBefore = (await db.query('SELECT count(*)::int AS n FROM {{schema}}.unique_locks'))[0]!.n as number;
    const mixed = JSON.stringify([
      { ...row, i: 'ok1', u: 'k1', ut: 60_000 },
      { ...row, i: 'ok2' },
      { ...row, i: 'bad3', pr: 1000 },
    ]);
    const e3 = await refused(as('producer', 'SELECT * FROM {{S}}.enqueue_tasks($1::json, now(), false)', [mixed]), 'a bad third row', '22023');
    assert.equal(e3.column, 'priority');
    // With dependencies, the rows are checked before their dependencies are read from them.
    const deps = JSON.stringify([
      { ...row, i: 'ok4', dp: [['tenant', 'dep']] },
      { ...row, i: 'bad5', dp: { not: 'an array' } },
    ]);
    const e4 = await refused(as('producer', 'SELECT * FROM {{S}}.enqueue_tasks($1::json, now(), false)', [deps]), 'dependsOn not an array', '22023');
    assert.equal(e4.column, 'dependsOn');
    assert.equal((await db.query('SELECT count(*)::int AS n FROM {{schema}}.unique_locks'))[0]!.n, locksBefore, 'no unique lock left');
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

  test('a producer waits for its tasks and watches their events; the monitor reads no log line', async () => {
    const producer = new Client({ connectionString: url('producer'), schema: db.schema, logger: false });
    const watcher = new Inspector({ connectionString: url('producer'), schema: db.schema, logger: false });
    const server = new Server({ connectionString: db.connectionString, schema: db.schema, logger: false, queues: { follow: 1 }, taskCheckInterval: 50 });
    const abort = new AbortController();
    const kinds: string[] = [];
    const watching = (async () => {
      for await (const e of watcher.watch({ queue: 'follow', signal: abort.signal })) {
        kinds.push(e.kind);
        if (e.kind === 'completed') abort.abort();
      }
    })();
    try {
      await waitFor(async () => (await db.query('SELECT count(*)::int AS n FROM {{schema}}.watchers'))[0].n === 1);
      await server.start(async (_task, ctx) => {
        ctx.log('secret');
        await ctx.writeResult('done');
      });
      const done = await producer.enqueueAndWait(new Task('f', null, { queue: 'follow', taskId: 'followed' }));
      assert.equal(done.result, 'done');
      await watching;
      assert.deepEqual(kinds, ['started', 'completed']);
    } finally {
      abort.abort();
      await server.shutdown();
      await Promise.all([producer.close(), watcher.close()]);
    }
    await refused(as('monitor', 'SELECT message FROM {{S}}.task_logs'), 'monitor: log lines');
    assert.equal((await as('inspector', 'SELECT message FROM {{S}}.task_logs')).rows[0]?.message, 'secret');
    await refused(as('producer', "SELECT {{S}}.record_attempts('[]', now())"), 'producer: record attempts');
  });

  test('the monitor cannot read a cron entry’s options (its headers)', async () => {
    await refused(as('monitor', 'SELECT options FROM {{S}}.scheduler_entries'), 'monitor: scheduler_entries.options');
    await as('monitor', 'SELECT id, spec FROM {{S}}.scheduler_entries');
  });
});
