/**
 * F20 long-transaction: the MVCC horizon held under load (plan §5.2).
 *
 * Injected: under a steady load (a producer at RATE tasks/s, 4 workers × 8
 * slots, `tx` tasks of 5–30 ms), a harness session runs
 * `BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM tasks;` and
 * then sits idle in that transaction for HOLD_S seconds, holding the
 * cluster's xmin horizon: vacuum can remove no row version that died after
 * its snapshot. (The test clusters end idle transactions after 10 s,
 * `idle_in_transaction_session_timeout`; the holder turns that off for its
 * own session, as a forgotten BEGIN in a psql would have it.) Phases:
 * BEFORE_S of load, the hold, AFTER_S of load after the release.
 *
 * Must hold:
 *   - I1–I4 (and I5, I6) as always: nothing lost, effects once, attempts
 *     bounded, nothing stuck active;
 *   - the fault took effect: task_states' dead tuples grow during the hold
 *     (at least half a dead version per task completed in it);
 *   - the library names the holder: every server's horizon watch (every
 *     healthCheckInterval, 15 s by default, src/server/horizon-watch.ts) logs
 *     "xmin horizon held by pid N for … s" with the holder's pid within 90 s
 *     of the hold's start, and says it has ended within 30 s of the release;
 *   - claims do not step over the dead entries (README: each server claims
 *     above a floor): during the hold, the library's claim statement reads
 *     fewer buffers per call than the claim-shaped read from the head below
 *     (pg_stat_statements' shared_blks_hit + read, which the machine's load
 *     does not change, unlike a latency or a throughput);
 *   - the backlog drains: everything completes once the producer stops.
 *     drain_s (recorded): from the release until the pending backlog is back
 *     to max(its level when the hold began, one second of load).
 *
 * Claim latency, per phase (before / during / after), three ways:
 *   - pickup_p50/p99_ms: enqueue → first start of each task enqueued in the
 *     phase, database clock (what a user sees);
 *   - claim_mean_ms / claim_max_ms / claim_buffers_per_call: the library's
 *     claim statement as the server executed it, from pg_stat_statements
 *     (loaded on this test's cluster, reset at every phase boundary; it
 *     keeps no percentiles, so mean and max, not p99: claim_p99_ms is null);
 *   - head_scan_p50/p99_ms (timed by the harness, round trip included) and
 *     head_scan_server_mean_ms / head_scan_buffers_per_call: a claim-shaped
 *     read from the head of the pending index (`… WHERE queue = 'default'
 *     AND state = 'pending' ORDER BY priority DESC, pending_seq LIMIT 8`),
 *     every second: what a claim that starts from the head pays for the dead
 *     entries the hold keeps (the library claims above a floor, and from
 *     the head only in its sweep every 10 s).
 * Also: n_dead_tup peak, backlog peak, table size, throughput per phase,
 * and when the README's query (`pg_stat_activity WHERE backend_xmin IS NOT
 * NULL ORDER BY xact_start`), run by the harness each second, first showed
 * the holder with more than 60 s.
 *
 * CI (short profile): HOLD_S = 90 s; 15 s + 90 s + 15 s of load, then the
 * drain: about 3 min (2 min 53 s here, where the shared 2-core machine
 * reached ~135 of the 200 tasks/s and so drained a backlog):
 *   node --import tsx test/faults/run.ts test/faults/f20-long-transaction.test.ts
 * Long profile (the plan's 10 min): run the file directly, as run.ts caps a
 * test at 5 min; about 11 min when the machine keeps up with the rate, more
 * when it has a backlog to drain:
 *   F20_HOLD_S=600 node --import tsx test/faults/f20-long-transaction.test.ts
 * F20_RATE sets the producer's rate (200 tasks/s).
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import pg from 'pg';
import { sleep } from './harness.js';
import { faultTest, report } from './kit.js';

const MAX_RETRY = 3;
const RATE = Number(process.env.F20_RATE ?? 200);
const BEFORE_S = 15;
const HOLD_S = Number(process.env.F20_HOLD_S ?? 90);
const AFTER_S = 15;
const HORIZON_NAMED_WITHIN_S = 90;
const HORIZON_ENDED_WITHIN_S = 30;
/** The claim is one call of claim_tasks() (migration 0010); pg_stat_statements counts the call, its statement inside included. */
const CLAIM_SQL_LIKE = '%claim_tasks"(%';
/** pg_stat_statements shows constants as $n: the head scan's text ends `ORDER BY priority DESC, pending_seq LIMIT $2`. */
const HEAD_SQL_LIKE = '%ORDER BY priority DESC, pending_seq LIMIT $%';

type Phase = 'before' | 'during' | 'after';
interface Sample {
  t: number;
  phase: Phase;
  pending: number;
  dead: number;
  autovacuums: number;
  sizeMb: number;
  holderPid: number | null;
  holderAgeS: number | null;
  headScanMs: number;
}

const pct = (xs: number[], q: number): number | null => {
  if (xs.length === 0) return null;
  const s = [...xs].sort((a, b) => a - b);
  return Math.round(s[Math.min(s.length - 1, Math.floor(q * s.length))]! * 10) / 10;
};

faultTest(
  `F20 long-transaction: a REPEATABLE READ snapshot held ${HOLD_S} s under ${RATE} tasks/s; invariants hold, the backlog drains`,
  {
    schema: 'f20',
    timeout: (2 * (BEFORE_S + HOLD_S + AFTER_S) + 180) * 1000,
    cluster: { settings: { shared_preload_libraries: "'pg_stat_statements'", 'pg_stat_statements.max': 1000 } },
  },
  async (h) => {
    await h.query('CREATE EXTENSION IF NOT EXISTS pg_stat_statements');
    const workers = await h.spawnWorkers(4, { concurrency: 8, sleepMin: 5, sleepMax: 30, env: { LOG_LEVEL: 'info' } });
    h.startSampler();
    const total = RATE * (BEFORE_S + HOLD_S + AFTER_S);
    const producer = await h.spawnProducer({ count: total, rate: RATE, inflight: 16, maxRetry: MAX_RETRY });
    const t0 = performance.now();
    const elapsed = () => (performance.now() - t0) / 1000;

    // ---- sampling: every second, backlog, dead tuples, the oldest xmin holder, a head scan ----
    let phase: Phase = 'before';
    const samples: Sample[] = [];
    let sampling = true;
    const statsSql = `
    SELECT (SELECT count(*)::int FROM {{schema}}.task_states WHERE state = 'pending') AS pending,
           coalesce(st.n_dead_tup, 0)::int AS dead, coalesce(st.autovacuum_count, 0)::int AS autovacuums,
           (pg_total_relation_size('{{schema}}.task_states') / 1e6)::float8 AS size_mb,
           o.pid AS holder_pid, o.age_s AS holder_age_s
    FROM (SELECT 1) one
    LEFT JOIN pg_stat_user_tables st ON st.relid = '{{schema}}.task_states'::regclass
    LEFT JOIN LATERAL (
      SELECT pid, extract(epoch FROM clock_timestamp() - xact_start)::float8 AS age_s FROM pg_stat_activity
      WHERE backend_xmin IS NOT NULL AND pid <> pg_backend_pid() ORDER BY xact_start LIMIT 1) o ON true`;
    const headSql = `SELECT seq FROM {{schema}}.task_states WHERE queue = 'default' AND state = 'pending' ORDER BY priority DESC, pending_seq LIMIT 8`;
    const sampler = (async () => {
      while (sampling) {
        const tick = performance.now();
        try {
          const [s] = await h.query(statsSql);
          const q0 = performance.now();
          await h.query(headSql);
          const headScanMs = performance.now() - q0;
          samples.push({
            t: elapsed(),
            phase,
            pending: s.pending,
            dead: s.dead,
            autovacuums: s.autovacuums,
            sizeMb: Math.round(s.size_mb * 10) / 10,
            holderPid: s.holder_pid,
            holderAgeS: s.holder_age_s,
            headScanMs,
          });
        } catch {
          // a missed sample is not an error
        }
        await sleep(Math.max(0, 1000 - (performance.now() - tick)));
      }
    })();

    // pg_stat_statements: the claim statement's calls, mean and max per phase (reset at each boundary).
    const claimStats = async () => {
      const rows = await h.query<{
        which: string;
        calls: number;
        mean_ms: number | null;
        max_ms: number | null;
        blks: number | null;
        rows_per_call: number | null;
      }>(
        `SELECT CASE WHEN query LIKE $1 THEN 'claim' ELSE 'head' END AS which, coalesce(sum(calls), 0)::int AS calls,
                (sum(total_exec_time) / nullif(sum(calls), 0))::float8 AS mean_ms, max(max_exec_time)::float8 AS max_ms,
                (sum(shared_blks_hit + shared_blks_read) / nullif(sum(calls), 0))::float8 AS blks, (sum(rows) / nullif(sum(calls), 0))::float8 AS rows_per_call
         FROM pg_stat_statements WHERE query LIKE $1 OR query LIKE $2 GROUP BY 1`,
        [CLAIM_SQL_LIKE, HEAD_SQL_LIKE],
      );
      await h.query('SELECT pg_stat_statements_reset()');
      const of = (which: string) => {
        const r = rows.find((x) => x.which === which);
        const round = (v: number | null | undefined, d: number) => (v === null || v === undefined ? null : Math.round(v * 10 ** d) / 10 ** d);
        return { calls: r?.calls ?? 0, mean_ms: round(r?.mean_ms, 2), max_ms: round(r?.max_ms, 1), blks: round(r?.blks, 1), rows: round(r?.rows_per_call, 1) };
      };
      return { claim: of('claim'), head: of('head') };
    };

    await sleep(BEFORE_S * 1000);
    const claimBefore = await claimStats();

    // ---- the fault: a snapshot held idle in a transaction ----
    const holder = new pg.Client({ connectionString: h.connectionString, application_name: 'harness:horizon' });
    let holding = true;
    h.defer(() => holding && holder.end());
    await holder.connect();
    holder.on('error', () => {});
    const holderPid = (await holder.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;
    await holder.query('SET idle_in_transaction_session_timeout = 0');
    await holder.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
    const counted = (await holder.query<{ n: string }>(`SELECT count(*) AS n FROM "${h.schema}".tasks`)).rows[0]!.n;
    const holdStart = await h.dbNow();
    const holdStartS = elapsed();
    const holdStartWall = Date.now();
    phase = 'during';
    await sleep(HOLD_S * 1000);
    const claimDuring = await claimStats();
    await holder.query('COMMIT');
    await holder.end();
    holding = false;
    const release = await h.dbNow();
    const releaseS = elapsed();
    const releaseWall = Date.now();
    phase = 'after';

    // ---- after: load goes on for AFTER_S; drain = the backlog back to where it was when the hold began ----
    const atHold = samples.filter((x) => x.phase === 'before').at(-1)?.pending ?? 0;
    const baseline = Math.max(atHold, RATE);
    let drainS: number | null = null;
    const drained = (async () => {
      while (drainS === null && sampling) {
        const x = samples.at(-1);
        if (x && x.phase === 'after' && x.pending <= baseline) drainS = Math.round((x.t - releaseS) * 10) / 10;
        await sleep(200);
      }
    })();
    await producer.exited;
    await h.waitDrained(Math.max(120_000, HOLD_S * 1000));
    const claimAfter = await claimStats();
    await sleep(1500); // a last sample with the queue empty
    sampling = false;
    await Promise.all([sampler, drained]);
    await sleep(700);
    await h.stopSampler();

    const c = await h.check({ maxRetry: MAX_RETRY });

    // Pickup and throughput per phase, database clock.
    const perPhase = await h.query<{ phase: Phase; tasks: number; p50: number | null; p99: number | null }>(
      `SELECT CASE WHEN t.enqueued_at < $1 THEN 'before' WHEN t.enqueued_at < $2 THEN 'during' ELSE 'after' END AS phase, count(*)::int AS tasks,
            percentile_cont(0.5) WITHIN GROUP (ORDER BY x.ms)::float8 AS p50, percentile_cont(0.99) WITHIN GROUP (ORDER BY x.ms)::float8 AS p99
     FROM {{schema}}.tasks t JOIN (SELECT task_id, extract(epoch FROM min(at)) * 1000 AS ms0 FROM {{schema}}.h_exec WHERE phase = 'start' GROUP BY 1) s ON s.task_id = t.id
     CROSS JOIN LATERAL (SELECT s.ms0 - extract(epoch FROM t.enqueued_at) * 1000 AS ms) x
     GROUP BY 1`,
      [holdStart, release],
    );
    // Completions per second: before = first completion → hold start; during = the hold; after = release → last completion.
    const completedPerS = await h.query<{ phase: Phase; rate: number }>(
      `WITH c AS (SELECT CASE WHEN completed_at < $1 THEN 'before' WHEN completed_at < $2 THEN 'during' ELSE 'after' END AS phase, completed_at
                  FROM {{schema}}.tasks WHERE state = 'completed')
       SELECT phase, (count(*) / greatest(extract(epoch FROM CASE phase WHEN 'before' THEN $1 - min(completed_at) WHEN 'during' THEN $2::timestamptz - $1
                                                            ELSE max(completed_at) - $2 END), 1))::float8 AS rate
       FROM c GROUP BY phase`,
      [holdStart, release],
    );
    const completedDuring = (
      await h.one<{ n: number }>(`SELECT count(*)::int AS n FROM {{schema}}.tasks WHERE completed_at >= $1 AND completed_at < $2`, [holdStart, release])
    ).n;
    const byPhase = <T>(rows: ({ phase: Phase } & T)[], p: Phase) => rows.find((r) => r.phase === p);
    const round0 = (v: number | null | undefined) => (v === null || v === undefined ? null : Math.round(v));
    const inPhase = (p: Phase) => samples.filter((s) => s.phase === p);
    const deadBefore = Math.max(0, ...inPhase('before').map((s) => s.dead));
    const deadPeak = Math.max(0, ...samples.map((s) => s.dead));
    const backlogPeak = Math.max(0, ...samples.map((s) => s.pending));
    const backlogPeakDuring = Math.max(0, ...inPhase('during').map((s) => s.pending));
    const namedAt = samples.find((s) => s.phase === 'during' && s.holderPid === holderPid && (s.holderAgeS ?? 0) > 60);
    const sqlNamedS = namedAt ? Math.round((namedAt.t - holdStartS) * 10) / 10 : null;

    // The library's own view: each server's horizon watch (pino lines of component 'horizon', this host's clock).
    const lines = workers.flatMap((w) =>
      readFileSync(join(h.logDir, `${w.name}.stderr.log`), 'utf8')
        .split('\n')
        .flatMap((l) => {
          try {
            return [JSON.parse(l) as { component?: string; pid?: number; msg?: string; time: number; worker: string }];
          } catch {
            return [];
          }
        })
        .filter((l) => l.component === 'horizon' && l.pid === holderPid),
    );
    const named = lines.filter((l) => l.msg?.startsWith(`xmin horizon held by pid ${holderPid} `));
    const ended = lines.filter((l) => l.msg === 'the transaction holding back vacuum has ended' && l.time >= releaseWall);
    const firstS = (ls: typeof lines, from: number) => (ls.length ? Math.round((Math.min(...ls.map((l) => l.time)) - from) / 100) / 10 : null);
    const libraryNamedS = firstS(named, holdStartWall);
    const libraryEndedS = firstS(ended, releaseWall);
    const workersNaming = new Set(named.map((l) => l.worker.split(':')[0])).size;
    const workersEnded = new Set(ended.map((l) => l.worker.split(':')[0])).size;

    const phases = ['before', 'during', 'after'] as const;
    const fig = report(h, c, 'F20 long-transaction', {
      hold_s: HOLD_S,
      rate_target: RATE,
      rate_reached: Object.fromEntries(phases.map((p) => [p, round0(byPhase(completedPerS, p)?.rate)])),
      pickup_p50_ms: Object.fromEntries(phases.map((p) => [p, round0(byPhase(perPhase, p)?.p50)])),
      pickup_p99_ms: Object.fromEntries(phases.map((p) => [p, round0(byPhase(perPhase, p)?.p99)])),
      claim_p99_ms: null,
      claim_calls: { before: claimBefore.claim.calls, during: claimDuring.claim.calls, after: claimAfter.claim.calls },
      claim_mean_ms: { before: claimBefore.claim.mean_ms, during: claimDuring.claim.mean_ms, after: claimAfter.claim.mean_ms },
      claim_max_ms: { before: claimBefore.claim.max_ms, during: claimDuring.claim.max_ms, after: claimAfter.claim.max_ms },
      claim_buffers_per_call: { before: claimBefore.claim.blks, during: claimDuring.claim.blks, after: claimAfter.claim.blks },
      claim_rows_per_call: { before: claimBefore.claim.rows, during: claimDuring.claim.rows, after: claimAfter.claim.rows },
      head_scan_server_mean_ms: { before: claimBefore.head.mean_ms, during: claimDuring.head.mean_ms, after: claimAfter.head.mean_ms },
      head_scan_buffers_per_call: { before: claimBefore.head.blks, during: claimDuring.head.blks, after: claimAfter.head.blks },
      head_scan_p50_ms: Object.fromEntries(
        phases.map((p) => [
          p,
          pct(
            inPhase(p).map((s) => s.headScanMs),
            0.5,
          ),
        ]),
      ),
      head_scan_p99_ms: Object.fromEntries(
        phases.map((p) => [
          p,
          pct(
            inPhase(p).map((s) => s.headScanMs),
            0.99,
          ),
        ]),
      ),
      n_dead_tup_before: deadBefore,
      n_dead_tup_peak: deadPeak,
      n_dead_tup_end: samples.at(-1)?.dead ?? null,
      autovacuum_runs: (samples.at(-1)?.autovacuums ?? 0) - (samples[0]?.autovacuums ?? 0),
      table_mb: { start: samples[0]?.sizeMb ?? null, release: inPhase('during').at(-1)?.sizeMb ?? null, end: samples.at(-1)?.sizeMb ?? null },
      backlog_peak: backlogPeak,
      backlog_peak_during: backlogPeakDuring,
      backlog_baseline: baseline,
      drain_s: drainS,
      completed_during_hold: completedDuring,
      holder_pid: holderPid,
      holder_counted_tasks: Number(counted),
      sql_names_holder_s: sqlNamedS,
      library_names_holder_s: libraryNamedS,
      library_says_ended_s: libraryEndedS,
      workers_naming_holder: workersNaming,
      workers_saying_ended: workersEnded,
      library_warning: named[0]?.msg ?? null,
      notes:
        `4 workers x 8, tx tasks 5-30 ms, producer at ${RATE}/s; BEGIN ISOLATION LEVEL REPEATABLE READ + SELECT count(*) FROM tasks held idle ${HOLD_S} s ` +
        `(idle_in_transaction_session_timeout off for that session); phases ${BEFORE_S} s / ${HOLD_S} s / ${AFTER_S} s + drain; pickup = enqueue to first start per phase; ` +
        `claim mean/max = pg_stat_statements (no percentiles); head scan = claim-shaped read from the pending index head, timed each second; ` +
        `drain_s = release to backlog <= ${baseline} (max of the backlog at the hold's start and 1 s of load); library_names_holder_s = hold start to the first ` +
        `'xmin horizon held by pid N' warning of a server (horizon watch, healthCheckInterval 15 s default)`,
    });
    console.log(`figures ${JSON.stringify(fig)}`);
    assert.equal(c.acked, total, 'every task was acknowledged');
    assert.ok(completedDuring > 0, 'tasks completed during the hold');
    assert.ok(
      deadPeak - deadBefore >= completedDuring / 2,
      `dead tuples grew during the hold (${deadBefore} -> ${deadPeak}, ${completedDuring} completed): the horizon was held`,
    );
    assert.ok(
      libraryNamedS !== null && libraryNamedS <= HORIZON_NAMED_WITHIN_S,
      `the servers named the holder (pid ${holderPid}) within ${HORIZON_NAMED_WITHIN_S} s of the hold's start (${libraryNamedS} s)`,
    );
    assert.equal(workersNaming, workers.length, 'every server named the holder');
    assert.ok(
      libraryEndedS !== null && libraryEndedS <= HORIZON_ENDED_WITHIN_S,
      `a server said the hold ended within ${HORIZON_ENDED_WITHIN_S} s of the release (${libraryEndedS} s)`,
    );
    const claimBlks = claimDuring.claim.blks ?? 0;
    const headBlks = claimDuring.head.blks ?? 0;
    assert.ok(
      claimBlks < headBlks,
      `during the hold a claim read fewer buffers (${claimBlks}) than a claim-shaped read from the head of the pending index (${headBlks}): claims do not step over the dead entries`,
    );
    assert.ok(drainS !== null, `the backlog came back to ${baseline} after the release`);
  },
);
