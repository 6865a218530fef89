/**
 * A cancel notification is a hint (issue #26, finding 1): anyone who can
 * connect may NOTIFY the cancel channel, so the server aborts a task only
 * when the database marks it cancel-requested (Inspector.cancelProcessing).
 */
import assert from 'node:assert/strict';
import { performance } from 'node:perf_hooks';
import { describe } from 'node:test';
import pg from 'pg';
import { Task, TaskCanceledError, type ServerConfig, type TaskContext } from '../src/index.js';
import { deferred, dsnWith, setupDb, test, waitFor } from './helpers.js';

/** A login with no grants at all: it may connect, and so NOTIFY, and nothing else. */
const NOBODY = `hc_nobody${(process.env.TEST_SCHEMA_SUFFIX ?? '').replace(/\W/g, '')}`;

/** Drops NOBODY and the grants it holds (DROP OWNED BY revokes those on the database too), if it exists. */
async function dropNobody(pool: pg.Pool): Promise<void> {
  if ((await pool.query('SELECT 1 FROM pg_roles WHERE rolname = $1', [NOBODY])).rowCount === 0) return;
  await pool.query(`DROP OWNED BY ${NOBODY}`);
  await pool.query(`DROP ROLE ${NOBODY}`);
}

/** A session of NOBODY's. */
let nobody: pg.Client;

const {
  db,
  client,
  inspector,
  startServer: serve,
} = setupDb('t_trust_cancel', {
  setup: async (db) => {
    // A run that died before its teardown left the role with its grants: DROP ROLE alone would refuse.
    await dropNobody(db.pool);
    // A password: a server that asks for one (the embedded PostgreSQL) gets it; trust ignores it.
    await db.pool.query(`CREATE ROLE ${NOBODY} LOGIN PASSWORD 'nobody-pw'`);
    const database = new URL(db.connectionString).pathname.slice(1);
    await db.pool.query(`GRANT CONNECT ON DATABASE "${database}" TO ${NOBODY}`);
    nobody = new pg.Client({ connectionString: dsnWith({ user: NOBODY, password: 'nobody-pw' }) });
    await nobody.connect();
  },
  teardown: async () => {
    await nobody?.end();
    await dropNobody(db.pool);
  },
  // Each test starts from no tasks: one left by an earlier test would hold a slot of the next server.
  resetEach: true,
  server: { concurrency: 4, taskCheckInterval: 50, delayedTaskCheckInterval: 50, retryDelay: () => 0 },
});

/** A forged cancellation, sent by the login with no grants. */
const forge = (id: string) => nobody.query(`NOTIFY "${db.schema}_cancel", '${id}'`);

/** A pool of the server's own that counts the cancel lookups it sends. */
function countingPool(): { pool: pg.Pool; lookups: () => number } {
  const pool = new pg.Pool({ connectionString: db.connectionString, max: 10 });
  let n = 0;
  const query = pool.query.bind(pool) as (...args: unknown[]) => unknown;
  (pool as { query: unknown }).query = (...args: unknown[]) => {
    const statement = args[0] as { name?: string } | undefined;
    if (typeof statement?.name === 'string' && statement.name.endsWith(':cancel-requested')) n++;
    return query(...args);
  };
  return { pool, lookups: () => n };
}

/** A server whose handler waits for `release(id)` and records each attempt and its abort reason. */
async function startServer(config: Partial<ServerConfig> = {}) {
  const attempts: { id: string; retryCount: number; aborted?: unknown }[] = [];
  type Gate = ReturnType<typeof deferred<void>>;
  const releases = new Map<string, Gate>();
  const started = new Map<string, Gate>();
  const gate = (m: Map<string, Gate>, id: string) => {
    let d = m.get(id);
    if (!d) m.set(id, (d = deferred()));
    return d;
  };
  const server = await serve(async (_task: Task, ctx: TaskContext) => {
    const attempt: (typeof attempts)[number] = { id: ctx.taskId, retryCount: ctx.retryCount };
    attempts.push(attempt);
    ctx.signal.addEventListener('abort', () => (attempt.aborted = ctx.signal.reason), { once: true });
    gate(started, ctx.taskId).resolve();
    await Promise.race([gate(releases, ctx.taskId).promise, new Promise((r) => ctx.signal.addEventListener('abort', r, { once: true }))]);
  }, config);
  return {
    server,
    attempts,
    started: (id: string) => gate(started, id).promise,
    release: (id: string) => gate(releases, id).resolve(),
  };
}

const stateOf = async (id: string) =>
  (await db.query<{ state: string; retried: number }>('SELECT state, retried FROM {{schema}}.tasks WHERE id = $1', [id]))[0];

describe('cancel notifications are hints', () => {
  test('NOTIFY from a login with no grants, sent while the task runs, aborts nothing: the task completes', { timeout: 30_000 }, async () => {
    const s = await startServer();
    try {
      await client.enqueue(new Task('long'), { taskId: 'order-7', maxRetry: 2 });
      await client.enqueue(new Task('long'), { taskId: 'control', maxRetry: 2 });
      await Promise.all([s.started('order-7'), s.started('control')]);
      for (let i = 0; i < 3; i++) await forge('order-7');
      // A real cancellation, notified after the forged ones: once it took effect, the server
      // has heard them all and looked them up.
      assert.equal(await inspector.cancelProcessing('control'), 1);
      await waitFor(() => s.attempts.find((a) => a.id === 'control')?.aborted, 10_000, 'the real cancellation');
      assert.equal(s.attempts.find((a) => a.id === 'order-7')?.aborted, undefined, 'the forged ones aborted nothing');
      s.release('order-7');
      await waitFor(async () => (await stateOf('order-7')) === undefined, 10_000, 'order-7 completed (deleted)');
      assert.deepEqual(
        s.attempts.filter((a) => a.id === 'order-7').map((a) => a.retryCount),
        [0],
        'one attempt',
      );
    } finally {
      s.release('control');
      await s.server.shutdown();
    }
  });

  test('a flood of forged NOTIFYs costs a lookup per burst, not one each, and aborts nothing', { timeout: 30_000 }, async () => {
    const { pool, lookups } = countingPool();
    const s = await startServer({ pool });
    try {
      await client.enqueue(new Task('long'), { taskId: 'flooded', maxRetry: 2 });
      await s.started('flooded');
      const before = lookups();
      const sentAt = performance.now();
      // 200 notifications, each its own transaction (PostgreSQL folds equal ones inside one).
      for (let i = 0; i < 200; i++) await forge('flooded');
      const elapsed = performance.now() - sentAt;
      // The real cancellation of a task the server does not run, then one of its own: heard after the flood.
      await client.enqueue(new Task('long'), { taskId: 'control', maxRetry: 2 });
      await s.started('control');
      await inspector.cancelProcessing('control');
      await waitFor(() => s.attempts.find((a) => a.id === 'control')?.aborted, 10_000, 'the real cancellation');
      const n = lookups() - before;
      // One lookup at a time, 100 ms apart at least; the real cancellation's lookup counts too.
      assert.ok(n >= 1 && n <= 3 + elapsed / 100, `${n} lookups for 200 notifications sent over ${Math.round(elapsed)} ms`);
      assert.equal(s.attempts.find((a) => a.id === 'flooded')?.aborted, undefined);
      s.release('flooded');
      await waitFor(async () => (await stateOf('flooded')) === undefined, 10_000, 'flooded completed');
      assert.equal(s.attempts.filter((a) => a.id === 'flooded').length, 1);
    } finally {
      s.release('flooded');
      s.release('control');
      await s.server.shutdown();
      await pool.end();
    }
  });

  test('Inspector.cancelProcessing aborts the handler at once, long before the next heartbeat', { timeout: 30_000 }, async () => {
    const s = await startServer({ heartbeatInterval: 10_000, leaseDuration: 60_000, retryDelay: () => 3_600_000 });
    try {
      await client.enqueue(new Task('long'), { taskId: 'victim', maxRetry: 2 });
      await s.started('victim');
      const sentAt = performance.now();
      assert.equal(await inspector.cancelProcessing('victim'), 1);
      const reason = await waitFor(() => s.attempts.find((a) => a.id === 'victim')?.aborted, 5_000, 'the abort');
      const took = performance.now() - sentAt;
      assert.ok(reason instanceof TaskCanceledError);
      assert.ok(took < 2_000, `aborted ${Math.round(took)} ms after cancelProcessing (the next heartbeat is 10 s away)`);
      const r = await waitFor(async () => {
        const x = await stateOf('victim');
        return x?.state === 'retry' ? x : undefined;
      });
      assert.equal(r.retried, 1, 'the canceled attempt used a retry');
    } finally {
      s.release('victim');
      await s.server.shutdown();
    }
  });
});
