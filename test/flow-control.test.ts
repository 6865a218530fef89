/**
 * Flow control: Snooze (a handler's "not now").
 */
import assert from 'node:assert/strict';
import { after, afterEach, before, beforeEach, describe, test } from 'node:test';
import { Client, InvalidOptionError, Server, Snooze, Task, type ServerConfig, type TaskContext } from '../src/index.js';
import { caught, testDb, waitFor, type TestDb } from './helpers.js';

let db: TestDb;
let client: Client;
const running: Server[] = [];

before(async () => {
  db = await testDb('t_flow_control');
  client = new Client({ connectionString: db.connectionString, schema: db.schema });
});

beforeEach(async () => {
  await db.query('TRUNCATE {{schema}}.task_states, {{schema}}.task_inputs, {{schema}}.queues, {{schema}}.daily_stats');
});

afterEach(async () => {
  await Promise.all(running.splice(0).map((s) => s.shutdown()));
});

after(async () => {
  await client.close();
  await db.close();
});

async function startServer(handle: (task: Task, ctx: TaskContext) => Promise<void> | void, config: ServerConfig = {}): Promise<Server> {
  const server = new Server({
    connectionString: db.connectionString,
    schema: db.schema,
    logger: false,
    concurrency: 2,
    taskCheckInterval: 50,
    delayedTaskCheckInterval: 60_000,
    ...config,
  });
  running.push(server);
  await server.start(handle);
  return server;
}

const row = async (id: string) =>
  (
    await db.query<{ state: string; retried: number; due_in_ms: number | null; error_msg: string | null }>(
      `SELECT state, retried, error_msg, (extract(epoch FROM run_at - now()) * 1000)::float8 AS due_in_ms FROM {{schema}}.tasks WHERE id = $1`,
      [id],
    )
  )[0];

describe('Snooze', () => {
  test('back to scheduled, due in its delay, retry count unchanged, counted neither processed nor failed', { timeout: 30_000 }, async () => {
    await client.enqueue(new Task('later', null, { taskId: 'sleepy', maxRetry: 0 }));
    const attempts: { retryCount: number; at: number }[] = [];
    const errors: Error[] = [];
    // The forwarder sleeps a minute unless woken: the snooze's own notification must wake it.
    const server = await startServer(
      (_task, ctx) => {
        attempts.push({ retryCount: ctx.retryCount, at: performance.now() });
        if (attempts.length < 3) throw new Snooze(attempts.length === 1 ? 60_000 : 400);
      },
      { errorHandler: (err) => void errors.push(err) },
    );
    await waitFor(async () => (await row('sleepy'))?.state === 'scheduled', 10_000, 'snoozed');
    const snoozed = (await row('sleepy'))!;
    assert.equal(snoozed.retried, 0);
    assert.equal(snoozed.error_msg, null);
    assert.ok(snoozed.due_in_ms! > 50_000 && snoozed.due_in_ms! <= 60_000, `due in ${snoozed.due_in_ms} ms`);
    // Run it now by hand; the second snooze (400 ms) must then wake the forwarder itself.
    await db.query(`UPDATE {{schema}}.tasks SET state = 'pending' WHERE id = 'sleepy'`);
    await waitFor(() => attempts.length === 3, 15_000, 'the third attempt');
    assert.deepEqual(
      attempts.map((a) => a.retryCount),
      [0, 0, 0],
      'maxRetry 0, and never archived: snoozes use no retry',
    );
    assert.ok(attempts[2]!.at - attempts[1]!.at >= 350, `the 400 ms snooze waited ${Math.round(attempts[2]!.at - attempts[1]!.at)} ms`);
    await waitFor(async () => (await row('sleepy')) === undefined, 10_000, 'completed');
    await server.shutdown();
    assert.deepEqual(errors, [], 'no errorHandler call');
    const [stats] = await db.query('SELECT processed::int, failed::int FROM {{schema}}.daily_stats');
    assert.deepEqual(stats, { processed: 1, failed: 0 });
  });

  test('a Snooze wrapped as the cause of another error still snoozes', { timeout: 30_000 }, async () => {
    await client.enqueue(new Task('wrapped', null, { taskId: 'w' }));
    let n = 0;
    await startServer(() => {
      n++;
      throw new Error('upstream busy', { cause: new Snooze(3_600_000) });
    });
    await waitFor(async () => (await row('w'))?.state === 'scheduled', 10_000, 'snoozed');
    assert.equal(n, 1);
    assert.equal((await row('w'))!.retried, 0);
  });

  for (const bad of [-1, Number.NaN, Number.POSITIVE_INFINITY, 2_147_483_648, '5' as unknown as number, undefined as unknown as number]) {
    test(`new Snooze(${String(bad)}) is an InvalidOptionError naming delayMs`, async () => {
      const err = await caught(() => new Snooze(bad));
      assert.ok(err instanceof InvalidOptionError, String(err));
      assert.match(err.message, /^delayMs must be a finite duration in ms/);
    });
  }
});
