/**
 * F16 recoverer-concurrency and boundaries (reliability plan §5.2, R6, R8, R9, R11, R20).
 *
 * 10,000 `active` rows are seeded straight into the tasks table on both sides
 * of every boundary the recoverer decides on — lease expired more or less
 * than the cutoff ago, retries left or spent, leases impossibly far in the
 * future (R8) or just inside the bound — next to finished and waiting rows
 * that nobody may touch. Then 8 servers start at once, each running its
 * recoverer every 100 ms against the same rows (their processors serve a
 * queue with no work). River's RescuesStuckJobs table, at scale and raced.
 *
 * Checked: every row ends exactly as the boundary table says (retried + 1 on
 * the retry branch, unchanged on the archive branch, R9/R20), each row is
 * rescued once (an audit trigger logs every active → not-active transition),
 * rows that must stay are byte-identical (their row text), and PostgreSQL
 * counted no deadlock.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { recordFigures } from './harness.js';
import { logTrigger, ownedSchema } from './kit.js';

const SCHEMA = 'f16';
const LEASE_MS = 30_000;
const CUTOFF_MS = 60_000;
/** Rows whose lease expired less than the cutoff ago stay for this long after seeding; the test must finish its checks before. */
const KEEP_WINDOW_S = 30;
const SERVERS = 8;

type Expect = 'retry' | 'archived' | 'keep';
interface Category {
  name: string;
  n: number;
  retried: number;
  maxRetry: number;
  /** lease_expires_at as SQL over the seeding transaction's now(). */
  expires: string;
  expect: Expect;
}

const cutoff = `interval '${CUTOFF_MS} milliseconds'`;
const lease = `interval '${LEASE_MS} milliseconds'`;
/** The boundary table: 10,000 active rows. */
const CATEGORIES: Category[] = [
  { name: 'exp_retry', n: 3000, retried: 2, maxRetry: 3, expires: `now() - ${cutoff} - interval '1 second'`, expect: 'retry' },
  { name: 'exp_archive', n: 2000, retried: 3, maxRetry: 3, expires: `now() - ${cutoff} - interval '1 second'`, expect: 'archived' },
  { name: 'exp_archive_max0', n: 500, retried: 0, maxRetry: 0, expires: `now() - ${cutoff} - interval '5 minutes'`, expect: 'archived' },
  { name: 'keep_cutoff_retry', n: 1500, retried: 2, maxRetry: 3, expires: `now() - ${cutoff} + interval '${KEEP_WINDOW_S} seconds'`, expect: 'keep' },
  { name: 'keep_cutoff_archive', n: 500, retried: 3, maxRetry: 3, expires: `now() - ${cutoff} + interval '${KEEP_WINDOW_S} seconds'`, expect: 'keep' },
  // R8: a lease beyond now() + L + 1 min is corrupt or clock abuse, and treated as expired.
  { name: 'far_retry', n: 1000, retried: 2, maxRetry: 3, expires: `now() + interval '10 years'`, expect: 'retry' },
  {
    name: 'far_archive',
    n: 500,
    retried: 3,
    maxRetry: 3,
    expires: `now() + ${lease} + interval '1 minute' + interval '${KEEP_WINDOW_S} seconds'`,
    expect: 'archived',
  },
  { name: 'keep_r8_edge', n: 500, retried: 1, maxRetry: 3, expires: `now() + ${lease} + interval '1 minute' - interval '5 seconds'`, expect: 'keep' },
  { name: 'keep_live', n: 500, retried: 0, maxRetry: 3, expires: `now() + ${lease}`, expect: 'keep' },
];
const RESCUED = CATEGORIES.filter((c) => c.expect !== 'keep').reduce((s, c) => s + c.n, 0);

const db = ownedSchema(SCHEMA);
const q = db.q;

test('F16: 8 recoverers at once over 10,000 boundary rows rescue each row once, exactly as the table says', async () => {
  // Audit: every transition out of active, with the values before and after, logged in the same transaction.
  // A state change rewrites the task's state row (task_states); its id is in task_inputs, which a rescue leaves alone.
  await q(
    logTrigger({
      name: 'f16_audit',
      table: `{{schema}}.f16_log (queue text, id text, new_state text, old_retried int, new_retried int,
        at timestamptz NOT NULL DEFAULT clock_timestamp(), backend int NOT NULL DEFAULT pg_backend_pid())`,
      insert: `INSERT INTO {{schema}}.f16_log (queue, id, new_state, old_retried, new_retried)
        VALUES (NEW.queue, (SELECT i.id FROM {{schema}}.task_inputs i WHERE i.seq = NEW.seq), NEW.state, OLD.retried, NEW.retried)`,
      on: 'AFTER UPDATE ON {{schema}}.task_states',
      when: "OLD.state = 'active' AND NEW.state IS DISTINCT FROM 'active'",
    }),
  );

  // Seed, in one transaction: one now() for every boundary.
  const client = await db.pool.connect();
  let seededAt: Date;
  try {
    await client.query('BEGIN');
    for (const c of CATEGORIES) {
      await client.query(
        `INSERT INTO "${SCHEMA}".tasks (queue, id, type, payload, state, max_retry, retried, run_at, lease_owner, lease_token, lease_expires_at, started_at)
         SELECT 'q' || (i % 4), $1 || '-' || i, 'f16', jsonb_build_object('i', i), 'active', $2, $3, NULL,
                'dead-worker', gen_random_uuid(), ${c.expires}, now() - interval '10 minutes'
         FROM generate_series(1, $4) i`,
        [c.name, c.maxRetry, c.retried, c.n],
      );
    }
    // Rows in other states, which no recoverer may touch.
    const others: [string, string][] = [
      ['completed', `'completed', 3, 0, now() + interval '1 day', now() - interval '1 minute', '{"ok":true}'::jsonb, NULL`],
      ['archived', `'archived', 3, 3, now() - interval '1 hour', NULL, NULL, 'boom'`],
      ['pending', `'pending', 3, 0, now(), NULL, NULL, NULL`],
      ['scheduled', `'scheduled', 3, 0, now() + interval '1 day', NULL, NULL, NULL`],
      ['retry', `'retry', 3, 1, now() + interval '1 day', NULL, NULL, 'earlier failure'`],
    ];
    for (const [state, cols] of others) {
      await client.query(
        `INSERT INTO "${SCHEMA}".tasks (queue, id, type, payload, state, max_retry, retried, run_at, completed_at, result, error_msg)
         SELECT CASE WHEN '${state}' = 'pending' THEN 'unserved' ELSE 'q' || (i % 4) END, '${state}-' || i, 'f16', jsonb_build_object('i', i), ${cols}
         FROM generate_series(1, ${state === 'completed' || state === 'archived' ? 1000 : 500}) i`,
      );
    }
    await client.query(`INSERT INTO "${SCHEMA}".queues (name) VALUES ('q0'), ('q1'), ('q2'), ('q3'), ('unserved') ON CONFLICT DO NOTHING`);
    seededAt = (await client.query<{ now: Date }>('SELECT now()')).rows[0]!.now;
    await client.query('COMMIT');
  } finally {
    client.release();
  }
  const total = (await q<{ n: number }>('SELECT count(*)::int AS n FROM {{schema}}.tasks WHERE state = $1', ['active']))[0]!.n;
  assert.equal(total, 10_000);

  const keepNames = CATEGORIES.filter((c) => c.expect === 'keep').map((c) => c.name);
  const untouchedSql = `SELECT queue || '/' || id AS k, t::text AS row FROM {{schema}}.tasks t
                        WHERE t.state <> 'active' OR split_part(t.id, '-', 1) = ANY($1::text[])`;
  const before = new Map((await q<{ k: string; row: string }>(untouchedSql, [keepNames])).map((r) => [r.k, r.row]));
  const deadlocksBefore = await db.deadlocks();

  // 8 servers at once: their recoverers start immediately and tick every 100 ms.
  let handled = 0;
  // R8: the recoverers warn about the far-future leases they rescue, with how many.
  let implausibleWarned = 0;
  const noop = () => {};
  const logger = {
    debug: noop,
    info: noop,
    error: noop,
    warn: (obj: object, msg?: string) => {
      if (msg?.includes('impossibly far in the future')) implausibleWarned += (obj as { tasks: number }).tasks;
    },
    child: () => logger,
  };
  const started = performance.now();
  const servers = await db.startServers(
    SERVERS,
    () => ({
      queues: { f16_idle: 1 },
      concurrency: 1,
      leaseDuration: LEASE_MS,
      heartbeatInterval: 5_000,
      recoverInterval: 100,
      recoverCutoff: CUTOFF_MS,
      retryDelay: () => 3_600_000,
      logger,
    }),
    () => void handled++,
  );

  let rescuedSoFar: number;
  for (;;) {
    rescuedSoFar = (await q<{ n: number }>('SELECT count(*)::int AS n FROM {{schema}}.f16_log'))[0]!.n;
    if (rescuedSoFar >= RESCUED) break;
    assert.ok(performance.now() - started < 25_000, `recoverers rescued only ${rescuedSoFar} of ${RESCUED} rows in 25 s`);
    await new Promise((r) => setTimeout(r, 50));
  }
  const wallRescueS = (performance.now() - started) / 1000;
  // Let every recoverer run another ten rounds over the result: a second rescue would show now.
  await new Promise((r) => setTimeout(r, 1000));
  const metrics = servers.map((s) => s.metrics());
  await Promise.all(servers.map((s) => s.shutdown()));
  const checkedAt = (await q<{ now: Date }>('SELECT now()'))[0]!.now;
  // The keep rows near the cutoff become recoverable KEEP_WINDOW_S after seeding: the checks must be done by then.
  assert.ok(checkedAt.getTime() - seededAt.getTime() < KEEP_WINDOW_S * 1000, 'the test ran too slowly for its keep window');
  const deadlockDelta = (await db.deadlocks()) - deadlocksBefore;

  // Each row rescued once.
  const [log] = await q<{ n: number; ids: number; doubles: number; span_s: number; backends: number }>(`
    SELECT count(*)::int AS n, count(DISTINCT (queue, id))::int AS ids,
           (SELECT count(*)::int FROM (SELECT 1 FROM {{schema}}.f16_log GROUP BY queue, id HAVING count(*) > 1) d) AS doubles,
           extract(epoch FROM max(at) - min(at))::float8 AS span_s, count(DISTINCT backend)::int AS backends
    FROM {{schema}}.f16_log`);
  const doubleRescues = log!.n - log!.ids;
  assert.equal(doubleRescues, 0, `${log!.doubles} rows were rescued more than once`);
  assert.equal(log!.ids, RESCUED);
  const byServers = metrics.reduce((s, m) => s + m.recovered + m.archivedByRecoverer, 0);
  assert.equal(byServers, RESCUED, 'the servers counted a different number of recoveries');
  assert.equal(handled, 0, 'no handler may run: the servers serve an empty queue');
  const farRows = CATEGORIES.filter((c) => c.name.startsWith('far_')).reduce((n, c) => n + c.n, 0);
  assert.equal(implausibleWarned, farRows, 'every far-future lease was reported as such, once');

  // The boundary table, per category.
  for (const c of CATEGORIES) {
    const rows = await q<{ state: string; retried: number; n: number; err: number; leased: number; due_later: number }>(
      `SELECT state, retried, count(*)::int AS n,
              count(*) FILTER (WHERE error_msg = 'task lease expired' AND last_failed_at IS NOT NULL)::int AS err,
              count(*) FILTER (WHERE lease_token IS NOT NULL OR lease_owner IS NOT NULL OR lease_expires_at IS NOT NULL)::int AS leased,
              count(*) FILTER (WHERE run_at > now() + interval '50 minutes')::int AS due_later
       FROM {{schema}}.tasks WHERE split_part(id, '-', 1) = $1 GROUP BY state, retried`,
      [c.name],
    );
    assert.equal(rows.length, 1, `${c.name}: rows ended in several states: ${JSON.stringify(rows)}`);
    const r = rows[0]!;
    assert.equal(r.n, c.n, c.name);
    if (c.expect === 'keep') {
      assert.deepEqual([r.state, r.retried], ['active', c.retried], c.name);
      continue;
    }
    assert.equal(r.state, c.expect, c.name);
    assert.equal(r.retried, c.expect === 'retry' ? c.retried + 1 : c.retried, `${c.name}: retried`);
    assert.equal(r.err, c.n, `${c.name}: last error "task lease expired"`);
    assert.equal(r.leased, 0, `${c.name}: lease fields cleared`);
    if (c.expect === 'retry') assert.equal(r.due_later, c.n, `${c.name}: retried after retryDelay`);
  }

  // Untouched rows: byte-identical.
  const afterRows = new Map((await q<{ k: string; row: string }>(untouchedSql, [keepNames])).map((r) => [r.k, r.row]));
  let changed = 0;
  for (const [k, row] of before) if (afterRows.get(k) !== row) changed++;
  assert.equal(changed, 0, `${changed} rows that no recoverer may touch changed`);
  assert.equal(before.size, 3000 + 3500, 'keep + untouched rows compared');

  assert.equal(deadlockDelta, 0, 'PostgreSQL detected deadlocks');
  const rowsPerS = RESCUED / Math.max(log!.span_s, 0.001);
  recordFigures({
    test: 'F16',
    profile: 'fast',
    tasks: 10_000,
    lost: 0,
    dup_effects: 0,
    orphan_effects: 0,
    dup_external: 0,
    stuck_max_s: null,
    recovery_s: wallRescueS,
    leases_lost: 0,
    fenced_rejections: 0,
    deadlocks: deadlockDelta,
    p50_ms: null,
    p99_ms: null,
    double_rescues: doubleRescues,
    rescued_rows: RESCUED,
    rescue_rows_per_s: Math.round(rowsPerS),
    recoverer_backends: log!.backends,
    notes: `${SERVERS} servers, recoverInterval 100 ms, batch 100; ${RESCUED} rescued in ${log!.span_s.toFixed(2)} s (DB clock, first to last), ${wallRescueS.toFixed(2)} s wall from start; ${log!.backends} backends did rescues`,
  });
});
