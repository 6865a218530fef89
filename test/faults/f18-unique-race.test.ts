/**
 * F18 unique-race (reliability plan §5.2, R12, I7).
 *
 * Phase 1: for each of KEYS unique keys, 16 producers enqueue the same unique
 * task at once: 6 autocommit, 2 autocommit with a fixed taskId, 5 inside a
 * transaction that rolls back after 0–200 ms, 3 inside a transaction that
 * commits after 0–50 ms. A sampler checks I7 (at most one non-final task per
 * unique key) every 100 ms. Checked at the end: every committing producer got
 * a TaskInfo or an explicit DuplicateTaskError / TaskIdConflictError; each key
 * has exactly one task, the one its single committed winner was told about
 * (no phantom "duplicate" with zero tasks, Oban #1093); no rolled-back
 * success left a task or a lock behind.
 *
 * Phase 2, release semantics (asynq's): a task that completes releases its
 * lock, so the key can be enqueued again at once; a task deleted through the
 * Inspector releases it too; a task that failed into the archive keeps the
 * lock until its TTL (asynq releases on success or delete only).
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import pg from 'pg';
import { Client, DuplicateTaskError, Inspector, migrate, Server, SkipRetry, Task, TaskIdConflictError } from '../../src/index.js';
import { startCluster, type Cluster } from './cluster.js';
import { recordFigures } from './harness.js';

const SCHEMA = 'f18';
const KEYS = 150;
const KEYS_IN_FLIGHT = 20;
const UNIQUE_TTL_MS = 300_000;
/** Producers per key in the second race. */
const RACE2 = 4;
type Role = 'auto' | 'auto-id' | 'rollback' | 'commit';
const ROLES: Role[] = [...Array(6).fill('auto'), 'auto-id', 'auto-id', ...Array(5).fill('rollback'), ...Array(3).fill('commit')];
type Outcome = 'ok' | 'dup' | 'idconflict' | 'other';

interface Attempt {
  key: number;
  role: Role;
  outcome: Outcome;
  /** The task id the producer was told about (ok only). */
  id?: string;
  /** Whether its transaction committed (autocommit: true when ok). */
  committed: boolean;
  error?: string;
}

let cluster: Cluster;
let pool: pg.Pool;
let txPool: pg.Pool;
let clientPool: pg.Pool;
let client: Client;
let inspector: Inspector;
let server: Server | undefined;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const q = async <R extends pg.QueryResultRow = any>(text: string, values?: unknown[]): Promise<R[]> =>
  (await pool.query<R>(text.replaceAll('{{schema}}', `"${SCHEMA}"`), values)).rows;

/** Keys of group 0 complete, 1 are archived by their handler, 2 sit in an unserved queue and are deleted by the Inspector. */
const group = (key: number) => key % 3;
const queueOf = (key: number) => (group(key) === 2 ? 'f18_held' : 'f18');
const taskOf = (key: number) => new Task('uniq', { key, group: group(key) });

function classify(err: unknown): { outcome: Outcome; error?: string } {
  if (err instanceof DuplicateTaskError) return { outcome: 'dup' };
  if (err instanceof TaskIdConflictError) return { outcome: 'idconflict' };
  return { outcome: 'other', error: String((err as Error)?.stack ?? err) };
}

/**
 * One producer. `gate`: what it waits for before it starts; `enqueued`: called once its
 * enqueue statement returned (inside its transaction, if it has one).
 */
async function produce(key: number, role: Role, gate: Promise<unknown> = Promise.resolve(), enqueued: () => void = () => {}): Promise<Attempt> {
  await gate;
  await sleep(Math.random() * 30);
  const opts = { queue: queueOf(key), unique: UNIQUE_TTL_MS, ...(role === 'auto-id' ? { taskId: `k${key}-fixed` } : {}) };
  if (role === 'auto' || role === 'auto-id') {
    try {
      const info = await client.enqueue(taskOf(key), opts);
      return { key, role, outcome: 'ok', id: info.id, committed: true };
    } catch (err) {
      return { key, role, committed: false, ...classify(err) };
    }
  }
  let conn: pg.PoolClient;
  try {
    conn = await txPool.connect();
  } catch (err) {
    enqueued();
    return { key, role, committed: false, ...classify(err) };
  }
  try {
    await conn.query('BEGIN');
    let attempt: Attempt;
    try {
      const info = await client.enqueue(taskOf(key), { ...opts, tx: conn });
      attempt = { key, role, outcome: 'ok', id: info.id, committed: false };
    } catch (err) {
      attempt = { key, role, committed: false, ...classify(err) };
    }
    enqueued();
    await sleep(role === 'rollback' ? Math.random() * 200 : Math.random() * 50);
    if (role === 'commit' && attempt.outcome === 'ok') {
      await conn.query('COMMIT');
      attempt.committed = true;
    } else {
      await conn.query('ROLLBACK');
    }
    return attempt;
  } catch (err) {
    await conn.query('ROLLBACK').catch(() => {});
    return { key, role, committed: false, ...classify(err) };
  } finally {
    enqueued(); // never leave the key's other producers waiting
    conn.release();
  }
}

/** Runs `fn` over `items` with at most `limit` in flight. */
async function pooled<T, R>(items: T[], limit: number, fn: (item: T) => Promise<R>): Promise<R[]> {
  const out: R[] = new Array(items.length);
  let next = 0;
  await Promise.all(
    Array.from({ length: limit }, async () => {
      while (next < items.length) {
        const i = next++;
        out[i] = await fn(items[i] as T);
      }
    }),
  );
  return out;
}

/** I7, sampled: keys with more than one non-final task. */
function startSampler(): { stop: () => Promise<{ samples: number; maxViolations: number }> } {
  let running = true;
  let samples = 0;
  let maxViolations = 0;
  const loop = (async () => {
    while (running) {
      const [r] = await q<{ n: number }>(`
        SELECT count(*)::int AS n FROM (SELECT queue, unique_key FROM {{schema}}.tasks
        WHERE unique_key IS NOT NULL AND state IN ('pending', 'scheduled', 'active', 'retry') GROUP BY 1, 2 HAVING count(*) > 1) d`);
      samples++;
      maxViolations = Math.max(maxViolations, r!.n);
      await sleep(100);
    }
  })();
  return {
    async stop() {
      running = false;
      await loop;
      return { samples, maxViolations };
    },
  };
}

before(async () => {
  cluster = await startCluster();
  await migrate({ connectionString: cluster.connectionString, schema: SCHEMA });
  pool = new pg.Pool({ connectionString: cluster.connectionString, max: 3, application_name: 'harness' });
  txPool = new pg.Pool({ connectionString: cluster.connectionString, max: 80, application_name: 'pgq:producer-tx' });
  // Autocommit producers wait on a key's uncommitted lock with a connection held: the
  // Client's own pool (10) would serialise every key behind a few waits.
  clientPool = new pg.Pool({ connectionString: cluster.connectionString, max: 50, application_name: 'pgq:producer' });
  client = new Client({ pool: clientPool, schema: SCHEMA });
  inspector = new Inspector({ connectionString: cluster.connectionString, schema: SCHEMA });
});

after(async () => {
  await server?.shutdown().catch(() => {});
  await client?.close().catch(() => {});
  await inspector?.close().catch(() => {});
  await txPool?.end().catch(() => {});
  await clientPool?.end().catch(() => {});
  await pool?.end().catch(() => {});
  cluster?.destroy();
});

test('F18: concurrent unique enqueues, committed and rolled back: one task per key, no phantom, locks released as asynq does', async () => {
  const started = performance.now();
  const sampler = startSampler();
  const keys = Array.from({ length: KEYS }, (_, i) => i);
  // Per key, the transactions that roll back go first and the others once one of them holds
  // the lock (its enqueue returned): committers then queue behind a lock that is rolled back,
  // the case where a phantom "duplicate" would show.
  const perKey = await pooled(keys, KEYS_IN_FLIGHT, (key) => {
    let open!: () => void;
    const gate = new Promise<void>((resolve) => (open = resolve));
    return Promise.all(ROLES.map((role) => (role === 'rollback' ? produce(key, role, undefined, open) : produce(key, role, gate))));
  });
  const attempts = perKey.flat();
  const phase1S = (performance.now() - started) / 1000;

  // Every committing producer got an answer it can act on.
  const committing = attempts.filter((a) => a.role !== 'rollback');
  const others = attempts.filter((a) => a.outcome === 'other');
  assert.deepEqual(
    others.slice(0, 3).map((a) => a.error),
    [],
    `${others.length} producers got an unexpected error`,
  );

  const rows = await q<{ queue: string; id: string; unique_key: string; key: number; state: string }>(
    `SELECT queue, id, unique_key, (payload->>'key')::int AS key, state FROM {{schema}}.tasks`,
  );
  const tasksByKey = new Map<number, string[]>();
  for (const r of rows) tasksByKey.set(r.key, [...(tasksByKey.get(r.key) ?? []), r.id]);
  const ids = new Set(rows.map((r) => r.id));

  let missingTasks = 0; // a committing producer was told "duplicate", yet the key has no task
  let duplicates = 0; // a key with several tasks, or several committed winners
  let wrongWinner = 0; // the task that exists is not the one the committed winner was told about
  for (const key of keys) {
    const tasks = tasksByKey.get(key) ?? [];
    const winners = committing.filter((a) => a.key === key && a.outcome === 'ok' && a.committed);
    if (tasks.length === 0) missingTasks++;
    if (tasks.length > 1 || winners.length > 1) duplicates++;
    if (winners.length !== 1 || winners[0]!.id !== tasks[0]) wrongWinner++;
  }
  // Rolled-back successes left nothing behind; committed ones did.
  const rolledBackOk = attempts.filter((a) => a.outcome === 'ok' && !a.committed);
  const phantomSuccesses =
    rolledBackOk.filter((a) => ids.has(a.id!) && !committing.some((c) => c.committed && c.id === a.id)).length +
    attempts.filter((a) => a.committed && !ids.has(a.id!)).length;
  const [locks] = await q<{ n: number; dangling: number }>(`
    SELECT count(*)::int AS n,
           count(*) FILTER (WHERE NOT EXISTS (SELECT 1 FROM {{schema}}.tasks t WHERE t.queue = l.queue AND t.id = l.task_id AND t.unique_key = l.key))::int AS dangling
    FROM {{schema}}.unique_locks l`);

  assert.equal(missingTasks, 0, 'keys with no task although committing producers were told "duplicate" (phantom duplicate)');
  assert.equal(duplicates, 0, 'keys with more than one task or winner');
  assert.equal(wrongWinner, 0, 'keys whose task is not the one its committed producer was told about');
  assert.equal(phantomSuccesses, 0, 'rolled-back successes that left a task, or committed ones that did not');
  assert.equal(rows.length, KEYS);
  assert.deepEqual([locks!.n, locks!.dangling], [KEYS, 0], 'one unique lock per key, each held by its task');
  assert.ok(rolledBackOk.length > 0 && committing.some((a) => a.outcome === 'dup'), 'the race happened: rollbacks won locks, committers were refused');

  // Phase 2: release semantics. Group 0 completes (released), group 1 is archived by
  // SkipRetry (held until the TTL), group 2 is deleted through the Inspector (released).
  server = new Server({
    connectionString: cluster.connectionString,
    schema: SCHEMA,
    queues: { f18: 1 },
    concurrency: 16,
    taskCheckInterval: 100,
  });
  await server.start((task) => {
    if ((task.payload as { group: number }).group === 1) throw new SkipRetry('archive me');
  });
  for (const deadline = performance.now() + 20_000; ;) {
    const [r] = await q<{ n: number }>(`SELECT count(*)::int AS n FROM {{schema}}.tasks WHERE queue = 'f18' AND state <> 'archived'`);
    if (r!.n === 0) break;
    assert.ok(performance.now() < deadline, `${r!.n} tasks not processed in 20 s`);
    await sleep(100);
  }
  await server.shutdown();
  const processedS = (performance.now() - started) / 1000 - phase1S;
  const deleted = await inspector.deleteAllPendingTasks('f18_held');
  assert.equal(deleted, keys.filter((k) => group(k) === 2).length);

  const again = await pooled(keys, KEYS_IN_FLIGHT, (key) => Promise.all(Array.from({ length: RACE2 }, () => produce(key, 'auto'))));
  const releaseErrors: string[] = [];
  for (const key of keys) {
    const results = again[key]!;
    const ok = results.filter((a) => a.outcome === 'ok').length;
    const dup = results.filter((a) => a.outcome === 'dup').length;
    const want = group(key) === 1 ? 0 : 1;
    if (ok !== want || ok + dup !== RACE2) releaseErrors.push(`key ${key} (group ${group(key)}): ${ok} ok, ${dup} duplicate`);
  }
  assert.deepEqual(releaseErrors.slice(0, 5), [], `${releaseErrors.length} keys broke the release semantics`);

  const i7 = await sampler.stop();
  assert.ok(i7.samples >= 3, 'the I7 sampler ran');
  assert.equal(i7.maxViolations, 0, 'I7: more than one non-final task per unique key at some sample');
  const wallS = (performance.now() - started) / 1000;

  recordFigures({
    test: 'F18',
    profile: 'fast',
    tasks: attempts.length,
    lost: 0,
    dup_effects: 0,
    orphan_effects: 0,
    dup_external: 0,
    stuck_max_s: null,
    recovery_s: null,
    leases_lost: 0,
    fenced_rejections: 0,
    deadlocks: null,
    p50_ms: null,
    p99_ms: null,
    phantom_successes: phantomSuccesses,
    missing_tasks: missingTasks,
    duplicates,
    i7_samples: i7.samples,
    i7_max_violations: i7.maxViolations,
    rolled_back_successes: rolledBackOk.length,
    committed_duplicates: committing.filter((a) => a.outcome === 'dup').length,
    committed_id_conflicts: committing.filter((a) => a.outcome === 'idconflict').length,
    notes:
      `${KEYS} keys x ${ROLES.length} producers (5 tx rolling back after 0-200 ms go first; once one holds the lock: 6 auto, 2 auto+taskId, 3 tx commit) in ${phase1S.toFixed(1)} s; processing ${processedS.toFixed(1)} s; ` +
      `release: completed and deleted tasks release the lock, archived keep it until the TTL (asynq); total ${wallS.toFixed(1)} s`,
  });
});
