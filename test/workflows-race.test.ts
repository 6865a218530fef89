/**
 * Workflows under contention and faults, with worker processes
 * (test/fixtures/workflow-worker.ts): 200 dependencies of one task finished
 * by 8 processes at the same instant release it exactly once; a worker
 * killed -9 inside the transaction that completes the last dependency
 * releases nothing, and the task rescued from it releases the dependent once.
 */
import assert from 'node:assert/strict';
import { afterEach, describe } from 'node:test';
import { Task, type TaskContext } from '../src/index.js';
import { sql } from 'kysely';
import { countReleases, exited, setupDb, spawnFixture, test, waitFor, type Fixture } from './helpers.js';

let releases: () => Promise<Record<string, string[]>>;
const children: Fixture[] = [];
// The worker processes are killed before the file's afterEach shuts the servers down.
afterEach(async () => {
  for (const c of children.splice(0)) {
    c.child.kill('SIGKILL');
    await exited(c.child);
  }
});

const { db, client, startServer } = setupDb('t_workflows_race', {
  setup: async (db) => {
    releases = await countReleases(db);
    await db.query(`
      CREATE TABLE {{schema}}.t_gate (go boolean NOT NULL);
      CREATE TABLE {{schema}}.t_final_runs (id text, worker text, results int);
      CREATE TABLE {{schema}}.t_effects (id text, worker text);`);
  },
  resetEach: true,
  tables: { also: ['t_releases', 't_gate', 't_final_runs', 't_effects'] },
});

const PROCESS_TEST_MS = 240_000;

function spawnWorker(name: string, env: Record<string, string> = {}): Fixture {
  const child = spawnFixture('test/fixtures/workflow-worker.ts', { DATABASE_URL: db.connectionString, SCHEMA: db.schema, NAME: name, ...env });
  children.push(child);
  return child;
}

const count = async (sqlText: string) => (await db.query<{ n: number }>(sqlText))[0]!.n;

describe('workflows across worker processes', () => {
  test('200 dependencies finished by 8 processes at once: the dependent is released once and runs once', { timeout: PROCESS_TEST_MS }, async (t) => {
    await db.query('INSERT INTO {{schema}}.t_gate VALUES (false)');
    const deps = Array.from({ length: 200 }, (_, i) => `dep-${i}`);
    // Half complete through ctx.transaction, half through the batched completion.
    await client.enqueueMany([
      ...deps.map((id, i) => new Task('dep', { tx: i % 2 === 0 }, { taskId: id })),
      new Task('final', null, { taskId: 'final', dependsOn: deps }),
    ]);
    // Leases long enough that a loaded machine does not lose one while the gate is shut.
    const workers = Array.from({ length: 8 }, (_, i) => spawnWorker(`w${i}`, { LEASE: '30000' }));
    await Promise.all(workers.map((w) => w.next('ready')));
    // 8 × 25 slots and no prefetch: 200 active means every process holds 25 running handlers.
    await waitFor(() => count("SELECT count(*)::int AS n FROM {{schema}}.task_states WHERE state = 'active'").then((n) => n === 200), 120_000, '200 active');
    const opened = performance.now();
    await db.query('UPDATE {{schema}}.t_gate SET go = true');
    await waitFor(() => count('SELECT count(*)::int AS n FROM {{schema}}.t_final_runs').then((n) => n > 0), 60_000, 'the dependent ran');
    const ranAfterMs = performance.now() - opened;
    await waitFor(() => count('SELECT count(*)::int AS n FROM {{schema}}.task_inputs').then((n) => n === 0), 30_000, 'every task done');
    for (const w of workers) w.child.kill('SIGTERM');
    await Promise.all(workers.map((w) => w.next('metrics')));
    const perWorker = workers.map((w) => w.events.filter((e) => e.event === 'completed').length);
    const counted = await releases();
    const runs = await db.query('SELECT id, results FROM {{schema}}.t_final_runs');
    t.diagnostic(
      `200 dependencies completed by 8 processes (${perWorker.join(', ')}); the dependent released ${counted.final?.length ?? 0} time(s), ` +
        `ran ${runs.length} time(s), ${Math.round(ranAfterMs)} ms after the gate opened`,
    );
    assert.ok(
      perWorker.every((n) => n > 0),
      'every process finished dependencies',
    );
    assert.ok(perWorker.reduce((a, b) => a + b, 0) >= 200, 'every dependency completed');
    assert.deepEqual(counted, { final: ['pending'] }, 'released exactly once');
    assert.deepEqual(runs, [{ id: 'final', results: 200 }], 'ran once, with every dependency’s result');
    assert.equal(await count('SELECT count(*)::int AS n FROM {{schema}}.task_dependencies'), 0);
  });

  test('kill -9 inside the transaction that completes the last dependency: released once, by the rescue', { timeout: PROCESS_TEST_MS }, async () => {
    await client.enqueueMany([new Task('hang', null, { taskId: 'last' }), new Task('final', null, { taskId: 'after', dependsOn: ['last'] })]);
    const worker = spawnWorker('victim', { LEASE: '1000' });
    await worker.next('ready');
    await worker.next('in-transaction');
    worker.child.kill('SIGKILL');
    await exited(worker.child);
    // The dying connection's transaction is rolled back: its effect and any release with it.
    assert.deepEqual(await releases(), {});
    await startServer(
      async (task: Task, ctx: TaskContext) => {
        await ctx.transaction(async (trx) => {
          const table = task.type === 'hang' ? 't_effects' : 't_final_runs';
          await sql`INSERT INTO ${sql.id(db.schema, table)} (id, worker) VALUES (${ctx.taskId}, 'rescuer')`.execute(trx);
        });
      },
      { taskCheckInterval: 50, recoverInterval: 100, recoverCutoff: 0, retryDelay: () => 0 },
    );
    await waitFor(() => count('SELECT count(*)::int AS n FROM {{schema}}.t_final_runs').then((n) => n > 0), 30_000, 'the dependent ran');
    assert.deepEqual(await db.query('SELECT id, worker FROM {{schema}}.t_effects'), [{ id: 'last', worker: 'rescuer' }]);
    assert.deepEqual(await releases(), { after: ['pending'] });
    assert.deepEqual(await db.query('SELECT id, worker FROM {{schema}}.t_final_runs'), [{ id: 'after', worker: 'rescuer' }]);
  });
});
