/**
 * F33 limits-under-faults: cluster-wide queue limits (Inspector.setQueueLimits,
 * enforced by claim_limited(), migration 0007) while workers are killed -9
 * and PostgreSQL crashes. Three queues, each kept saturated: `conc`
 * (concurrency 3), `rated` (rateLimit 10 per 500 ms) and `keyed`
 * (keyConcurrency 2 over 5 concurrency keys); 4 worker processes × 4 slots
 * with prefetch 4 serve all three, so every claim wants more than a limit
 * allows. Faults: SIGKILL a worker holding tasks of the limited queues (3×,
 * each respawned 2 s later) and crash PostgreSQL (2×, down 3 s), in turns.
 *
 * What should hold across the faults, and is checked:
 *   - concurrency and key concurrency at every sample (a sampler reads the
 *     active tasks every 50 ms, and skips the samples the outage refuses): the
 *     tasks of a killed worker, or of one whose leases lapsed while the
 *     database was down, stay active, and counted, until the recoverer
 *     requeues them, so the bound holds in the database throughout;
 *   - the same at every claim: a trigger of the test's, in the claim's own
 *     transaction (which holds the queue's claim lock until it commits),
 *     counts the queue's (and the key's) active tasks once the claim has
 *     updated its rows, and logs the claim (lim_claims);
 *   - the rate limit as a sliding window over every logged claim's
 *     started_at (the instant the claim gives its starts, and that its window
 *     counts): no 500 ms span holds more than 10. A crash loses a claim's log
 *     row only with the claim itself (the same transaction);
 *   - I1–I5: nothing lost, every task completed, effects once, attempts bounded.
 *
 * These are the limits as the database keeps them. The handlers' side is
 * F33b's: a limited claim commits durably (claim_limited(), migration 0007;
 * the Server's other statements commit asynchronously), so no claim a worker
 * has started running can be erased by a crash and stop counting. Here the
 * `tx` handler's first act is an oracle row committed with synchronous_commit
 * = on, which writes out the WAL before it anyway.
 *
 * The rate window is also checked on the trigger's own clock (clock_timestamp()
 * in the claim's transaction, not the library's started_at). A claim's
 * trigger runs up to D ms after the instant the claim counts (D, measured:
 * claim_to_trigger_max_ms), so trigger times less than interval − D apart
 * belong to starts less than interval apart: no such span may hold more than
 * 10 (max_starts_in_window_oracle_clock_shrunk). Over the full interval the
 * trigger's clock overcounts a bursty limiter by up to a burst
 * (max_starts_in_window_oracle_clock, a figure only).
 */
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Task } from '../../src/index.js';
import { heldByOwner, killsAndCrashes } from './crashes.js';
import { sleep } from './harness.js';
import { faultTest, outageBound, report } from './kit.js';
import { setupLimits, startLimitSampler } from './setups.js';

const MAX_RETRY = 8;
const CONC = 3;
const KEY_CONC = 2;
const KEYS = 5;
const RATE = { limit: 10, interval: 500 };
/** Tasks per queue and their handler's sleep (ms): each queue alone takes about 20 s at its limit. */
const QUEUES = {
  conc: { count: 300, ms: [100, 300] },
  rated: { count: 400, ms: [20, 80] },
  keyed: { count: 400, ms: [300, 700] },
} as const;
const FAULTS = { kills: 3, crashes: 2, downMs: 3000 };
const SAMPLE_MS = 50;

faultTest(
  'F33 limits under faults: kill -9 and PostgreSQL crashes; concurrency, key concurrency and rate never exceeded, nothing lost',
  { schema: 'f33', timeout: 240_000 },
  async (h) => {
    // Every task first (the queues exist once they have one), then the limits, then the workers:
    // the first claim already sees the limits.
    const tasks = Object.entries(QUEUES).flatMap(([queue, { count, ms }]) =>
      Array.from(
        { length: count },
        (_, i) =>
          new Task(
            'tx',
            { ms: ms[0] + Math.random() * (ms[1] - ms[0]) },
            { queue, taskId: `${queue}-${i}`, maxRetry: MAX_RETRY, retention: 3_600_000, ...(queue === 'keyed' ? { concurrencyKey: `k${i % KEYS}` } : {}) },
          ),
      ),
    );
    const workers = await setupLimits(h, {
      counts: true,
      tasks,
      batch: 200,
      limits: { conc: { concurrency: CONC }, rated: { rateLimit: RATE }, keyed: { keyConcurrency: KEY_CONC } },
      workers: { count: 4, concurrency: 4, prefetch: 4 },
    });
    h.startSampler();
    const sampler = startLimitSampler(h, Object.keys(QUEUES), 'keyed', SAMPLE_MS);
    const t0 = performance.now();

    // Kill a worker holding at least 2 tasks of the limited queues, never the last live one; note the active tasks at each crash.
    const faults = await killsAndCrashes(h, workers, {
      ...FAULTS,
      gapMs: [2000, 1500],
      held: heldByOwner(
        h,
        "SELECT lease_owner AS owner, count(*)::int AS held FROM {{schema}}.task_states WHERE state = 'active' AND queue = ANY($1) GROUP BY 1",
        [Object.keys(QUEUES)],
      ),
      victim: { min: 2, what: 'a worker holding 2 limited tasks', everyMs: 50 },
      beforeCrash: async () => (await h.one<{ n: number }>("SELECT count(*)::int AS n FROM {{schema}}.task_states WHERE state = 'active'")).n,
    });
    const { heldAtKill, atCrash: activeAtCrash, restartMs, reconnectedAt } = faults;
    await faults.respawned;
    const { n: leftAtLastFault } = await h.one<{ n: number }>("SELECT count(*)::int AS n FROM {{schema}}.task_states WHERE state <> 'completed'");
    await h.waitDrained(150_000);
    await sleep(700); // the workers' last metrics lines
    const sampled = await sampler.stop();
    await h.stopSampler();
    const wallS = Math.round((performance.now() - t0) / 1000);

    const stuckBound = outageBound(FAULTS.downMs, restartMs);
    const c = await h.check({ maxRetry: MAX_RETRY, txTypes: ['tx'], stuckBoundS: stuckBound });
    const claims = await h.one<{
      conc_max: number;
      keyed_key_max: number;
      claims: Record<string, number>;
      window_max: number;
      window_max_oracle_clock: number;
      window_over: number;
    }>(
      `SELECT (SELECT coalesce(max(active_after), 0)::int FROM {{schema}}.lim_claims WHERE queue = 'conc') AS conc_max,
              (SELECT coalesce(max(key_active_after), 0)::int FROM {{schema}}.lim_claims WHERE queue = 'keyed') AS keyed_key_max,
              (SELECT json_object_agg(queue, n) FROM (SELECT queue, count(*)::int AS n FROM {{schema}}.lim_claims GROUP BY 1) q) AS claims,
              (SELECT coalesce(max(n), 0)::int FROM (
                 SELECT (SELECT count(*) FROM {{schema}}.lim_claims x WHERE x.queue = 'rated'
                           AND x.started_at > c.started_at - $1 * interval '1 millisecond' AND x.started_at <= c.started_at) AS n
                 FROM {{schema}}.lim_claims c WHERE c.queue = 'rated') w) AS window_max,
              (SELECT coalesce(max(n), 0)::int FROM (
                 SELECT (SELECT count(*) FROM {{schema}}.lim_claims x WHERE x.queue = 'rated'
                           AND x.at > c.at - $1 * interval '1 millisecond' AND x.at <= c.at) AS n
                 FROM {{schema}}.lim_claims c WHERE c.queue = 'rated') w) AS window_max_oracle_clock,
              (SELECT count(*)::int FROM (
                 SELECT (SELECT count(*) FROM {{schema}}.lim_claims x WHERE x.queue = 'rated'
                           AND x.started_at > c.started_at - $1 * interval '1 millisecond' AND x.started_at <= c.started_at) AS n
                 FROM {{schema}}.lim_claims c WHERE c.queue = 'rated') w WHERE n > $2) AS window_over`,
      [RATE.interval, RATE.limit],
    );
    // The rated claims, for a look at the windows: started_at (the claim's instant) and the trigger's clock.
    const ratedClaims = await h.query<{ started_at: Date; at: Date; tasks: number; owner: string }>(
      `SELECT started_at, min(at) AS at, count(*)::int AS tasks, min(owner) AS owner FROM {{schema}}.lim_claims
       WHERE queue = 'rated' GROUP BY started_at ORDER BY started_at`,
    );
    writeFileSync(join(h.logDir, 'rated-claims.json'), JSON.stringify(ratedClaims, null, 1));
    const claimToTriggerMaxMs = Math.max(...ratedClaims.map((r) => r.at.getTime() - r.started_at.getTime()));
    const oracleClock = await h.one<{ d_ms: number; shrunk_max: number }>(
      `WITH r AS (SELECT at, started_at FROM {{schema}}.lim_claims WHERE queue = 'rated'),
            d AS (SELECT coalesce(max(extract(epoch FROM at - started_at) * 1000), 0)::float8 AS d_ms FROM r)
       SELECT d.d_ms, (SELECT coalesce(max(n), 0)::int FROM (
                SELECT (SELECT count(*) FROM r x WHERE x.at > c.at - ($1 - d.d_ms) * interval '1 millisecond' AND x.at <= c.at) AS n FROM r c) w) AS shrunk_max
       FROM d`,
      [RATE.interval],
    );
    const figures = report(h, c, 'F33 limits under faults', {
      limit: CONC,
      max_active: sampled.maxActive.conc,
      max_active_at_claim: claims.conc_max,
      key_limit: KEY_CONC,
      max_per_key: sampled.maxPerKey,
      max_per_key_at_claim: claims.keyed_key_max,
      max_active_keyed: sampled.maxActive.keyed,
      rate_limit: `${RATE.limit}/${RATE.interval}ms`,
      max_starts_in_window: claims.window_max,
      max_starts_in_window_oracle_clock: claims.window_max_oracle_clock,
      max_starts_in_window_oracle_clock_shrunk: oracleClock.shrunk_max,
      windows_over_limit: claims.window_over,
      claim_to_trigger_max_ms: claimToTriggerMaxMs,
      claims: claims.claims,
      samples: sampled.samples,
      samples_refused: sampled.failed,
      max_expired_active_in_sample: sampled.maxExpired,
      kills: FAULTS.kills,
      held_at_kill: heldAtKill,
      crashes: FAULTS.crashes,
      active_at_crash: activeAtCrash,
      restart_ms: restartMs,
      left_at_last_fault: leftAtLastFault,
      stuck_bound_s: stuckBound,
      wall_s: wallS,
      notes:
        `conc: concurrency ${CONC}; rated: ${RATE.limit} per ${RATE.interval} ms; keyed: ${KEY_CONC} per key over ${KEYS} keys; ` +
        `4 workers x 4, prefetch 4; SIGKILL ${FAULTS.kills}x a worker holding >= 2 limited tasks (respawn 2 s), crash ${FAULTS.crashes}x (${FAULTS.downMs / 1000} s down); ` +
        `bounds sampled every ${SAMPLE_MS} ms and counted at every claim in its transaction; rate window over every claim's started_at`,
    });
    console.log(JSON.stringify({ ...figures, notes: undefined }));
    assert.equal(heldAtKill.length, FAULTS.kills, 'every kill came');
    assert.equal(restartMs.length, FAULTS.crashes, 'every crash came');
    const total = Object.values(QUEUES).reduce((n, q) => n + q.count, 0);
    assert.equal(c.tasks, total, 'every task enqueued once');
    assert.equal(c.states.completed, total, 'every task completed');
    // The bounds, at every sample and at every claim.
    assert.ok(sampled.maxActive.conc! <= CONC, `conc: at most ${CONC} active at every sample (saw ${sampled.maxActive.conc})`);
    assert.ok(claims.conc_max <= CONC, `conc: at most ${CONC} active after every claim (saw ${claims.conc_max})`);
    assert.ok(sampled.maxPerKey <= KEY_CONC, `keyed: at most ${KEY_CONC} active per key at every sample (saw ${sampled.maxPerKey})`);
    assert.ok(claims.keyed_key_max <= KEY_CONC, `keyed: at most ${KEY_CONC} active per key after every claim (saw ${claims.keyed_key_max})`);
    assert.equal(claims.window_over, 0, `rated: no ${RATE.interval} ms span holds more than ${RATE.limit} starts (most: ${claims.window_max})`);
    assert.ok(
      oracleClock.shrunk_max <= RATE.limit,
      `rated, on the trigger's clock: no ${RATE.interval} - ${oracleClock.d_ms.toFixed(1)} ms span holds more than ${RATE.limit} claims (most: ${oracleClock.shrunk_max})`,
    );
    // The limits bound: the workers wanted more than they allow.
    assert.equal(sampled.maxActive.conc, CONC, 'conc reached its limit');
    assert.equal(claims.window_max, RATE.limit, 'rated reached its limit');
    assert.equal(sampled.maxPerKey, KEY_CONC, 'keyed reached its per-key limit');
    assert.ok(sampled.maxActive.keyed! > KEY_CONC, 'keys ran side by side');
    // Every start logged: at least one claim per task, more for the re-run ones.
    for (const [queue, { count }] of Object.entries(QUEUES)) assert.ok((claims.claims[queue] ?? 0) >= count, `${queue}: every task's claim logged`);
    assert.ok(sampled.samples > 100, `the sampler ran (${sampled.samples} samples)`);
    assert.ok(sampled.failed > 0, 'the sampler saw the outages');
    assert.ok(sampled.lastAt > Math.max(...reconnectedAt), 'the sampler kept sampling after the last restart');
    assert.ok(leftAtLastFault > 0, 'the faults came while tasks were left');
    assert.ok(
      heldAtKill.every((n) => n >= 2),
      'every victim held limited tasks',
    );
  },
);
