/**
 * F33 limits-under-faults: cluster-wide queue limits (Inspector.setQueueLimits,
 * enforced by claim_limited(), migration 0007) while workers are killed -9
 * and PostgreSQL crashes. Three queues, each kept saturated: `conc`
 * (concurrency 3), `rated` (rateLimit 10 per 500 ms) and `keyed`
 * (keyConcurrency 2 over 5 concurrency keys); 4 worker processes × 4 slots
 * with prefetch 4 serve all three, so every claim wants more than a limit
 * allows. Faults: SIGKILL a worker holding tasks of the limited queues (3×,
 * each respawned 2 s later) and crash PostgreSQL (2×, down DOWN_MS), in turns.
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
import { appendFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { Client, Inspector, Task } from '../../src/index.js';
import { crashAndRestart, killAndRespawn } from './crashes.js';
import { assertInvariants, createHarness, ORACLE_BOUND_S, recordFigures, sleep, waitFor, type Child, type Harness } from './harness.js';

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
const KILLS = 3;
const CRASHES = 2;
const DOWN_MS = 3000;
const SAMPLE_MS = 50;

let h: Harness | undefined;
let client: Client | undefined;
let inspector: Inspector | undefined;
after(async () => {
  await client?.close().catch(() => {});
  await inspector?.close().catch(() => {});
  await h?.teardown();
});

/**
 * Every claim of a task (any way into `active`), logged in the claim's transaction with the
 * queue's and the key's active tasks counted by a statement of its own after the claim's update.
 */
const ORACLE_SQL = `
CREATE TABLE {{schema}}.lim_claims (seq bigint NOT NULL, queue text NOT NULL, key text, owner text, started_at timestamptz,
  at timestamptz NOT NULL DEFAULT clock_timestamp(), active_after int NOT NULL, key_active_after int);
CREATE FUNCTION {{schema}}.lim_log_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO {{schema}}.lim_claims (seq, queue, key, owner, started_at, active_after, key_active_after)
  SELECT NEW.seq, NEW.queue, NEW.concurrency_key, NEW.lease_owner, NEW.started_at,
         (SELECT count(*) FROM {{schema}}.task_states s WHERE s.queue = NEW.queue AND s.state = 'active'),
         CASE WHEN NEW.concurrency_key IS NOT NULL THEN
           (SELECT count(*) FROM {{schema}}.task_states s
            WHERE s.queue = NEW.queue AND s.state = 'active' AND s.concurrency_key = NEW.concurrency_key) END;
  RETURN NULL;
END $$;
CREATE TRIGGER lim_log_claim AFTER UPDATE OF state ON {{schema}}.task_states FOR EACH ROW
  WHEN (NEW.state = 'active' AND OLD.state IS DISTINCT FROM 'active') EXECUTE FUNCTION {{schema}}.lim_log_claim();`;

interface Sampled {
  samples: number;
  failed: number;
  maxActive: Record<string, number>;
  maxPerKey: number;
  /** Most active tasks whose lease had already expired, in one sample: the dead, still counted. */
  maxExpired: number;
  lastAt: number;
}

/** Reads the active tasks of the limited queues every SAMPLE_MS until stopped; a refused read (the outage) is counted, not fatal. */
function startLimitSampler(harness: Harness): { stop(): Promise<Sampled> } {
  const s: Sampled = { samples: 0, failed: 0, maxActive: { conc: 0, rated: 0, keyed: 0 }, maxPerKey: 0, maxExpired: 0, lastAt: 0 };
  let stopped = false;
  const loop = (async () => {
    while (!stopped) {
      const rows = await harness
        .query<{ queue: string; key: string | null; expired: boolean }>(
          `SELECT queue, concurrency_key AS key, lease_expires_at < now() AS expired FROM {{schema}}.task_states
           WHERE state = 'active' AND queue = ANY($1)`,
          [Object.keys(QUEUES)],
        )
        .catch(() => undefined);
      if (rows === undefined) {
        s.failed++;
      } else {
        s.samples++;
        s.lastAt = performance.now();
        const perQueue = new Map<string, number>();
        const perKey = new Map<string, number>();
        for (const r of rows) {
          perQueue.set(r.queue, (perQueue.get(r.queue) ?? 0) + 1);
          if (r.queue === 'keyed' && r.key !== null) perKey.set(r.key, (perKey.get(r.key) ?? 0) + 1);
        }
        for (const [q, n] of perQueue) s.maxActive[q] = Math.max(s.maxActive[q] ?? 0, n);
        for (const n of perKey.values()) s.maxPerKey = Math.max(s.maxPerKey, n);
        s.maxExpired = Math.max(s.maxExpired, rows.filter((r) => r.expired).length);
      }
      await sleep(SAMPLE_MS);
    }
  })();
  return {
    async stop() {
      stopped = true;
      await loop;
      return s;
    },
  };
}

test(
  'F33 limits under faults: kill -9 and PostgreSQL crashes; concurrency, key concurrency and rate never exceeded, nothing lost',
  { timeout: 240_000 },
  async () => {
    h = await createHarness('f33');
    const harness = h;
    await h.query(ORACLE_SQL);
    client = new Client({ connectionString: h.connectionString, schema: h.schema });
    inspector = new Inspector({ connectionString: h.connectionString, schema: h.schema });

    // Every task first (the queues exist once they have one), then the limits, then the workers:
    // the first claim already sees the limits.
    const all: Task[] = [];
    for (const [queue, { count, ms }] of Object.entries(QUEUES)) {
      for (let i = 0; i < count; i++) {
        all.push(
          new Task(
            'tx',
            { ms: ms[0] + Math.random() * (ms[1] - ms[0]) },
            {
              queue,
              taskId: `${queue}-${i}`,
              maxRetry: MAX_RETRY,
              retention: 3_600_000,
              ...(queue === 'keyed' ? { concurrencyKey: `k${i % KEYS}` } : {}),
            },
          ),
        );
      }
    }
    for (let i = 0; i < all.length; i += 200) {
      const infos = await client.enqueueMany(all.slice(i, i + 200));
      appendFileSync(h.ackFile, `${infos.map((t) => t.id).join('\n')}\n`);
    }
    await inspector.setQueueLimits('conc', { concurrency: CONC });
    await inspector.setQueueLimits('rated', { rateLimit: RATE });
    await inspector.setQueueLimits('keyed', { keyConcurrency: KEY_CONC });

    const env = { QUEUES: JSON.stringify({ conc: 1, rated: 1, keyed: 1 }), PREFETCH: '4' };
    const workers = await Promise.all(['w1', 'w2', 'w3', 'w4'].map((n) => harness.spawnWorker(n, { concurrency: 4, env })));
    const live = new Map<string, Child>(workers.map((w) => [w.name, w]));
    h.startSampler();
    const sampler = startLimitSampler(h);
    const t0 = performance.now();

    const faults: ('kill' | 'crash')[] = ['kill', 'crash', 'kill', 'crash', 'kill'];
    assert.equal(faults.filter((f) => f === 'kill').length, KILLS);
    assert.equal(faults.filter((f) => f === 'crash').length, CRASHES);
    const respawns: Promise<void>[] = [];
    const heldAtKill: number[] = [];
    const activeAtCrash: number[] = [];
    const restartMs: number[] = [];
    const reconnectedAt: number[] = [];
    for (const fault of faults) {
      await sleep(2000 + Math.random() * 1500);
      if (fault === 'kill') {
        // A worker holding at least 2 tasks of the limited queues, never the last live one.
        const { victim, held } = await waitFor(
          async () => {
            if (live.size < 2) return undefined;
            const rows = await harness
              .query<{ owner: string; held: number }>(
                "SELECT lease_owner AS owner, count(*)::int AS held FROM {{schema}}.task_states WHERE state = 'active' AND queue = ANY($1) GROUP BY 1",
                [Object.keys(QUEUES)],
              )
              .catch(() => []);
            const busy = [...live.values()].flatMap((w) => {
              const n = rows.find((r) => r.owner === w.serverId)?.held ?? 0;
              return n >= 2 ? [{ victim: w, held: n }] : [];
            });
            return busy[Math.floor(Math.random() * busy.length)];
          },
          30_000,
          'a worker holding 2 limited tasks',
          50,
        );
        heldAtKill.push(held);
        respawns.push(killAndRespawn(harness, victim, live));
      } else {
        const { n } = await h.one<{ n: number }>("SELECT count(*)::int AS n FROM {{schema}}.task_states WHERE state = 'active'");
        activeAtCrash.push(n);
        restartMs.push(await crashAndRestart(harness, DOWN_MS));
        reconnectedAt.push(performance.now());
      }
    }
    await Promise.all(respawns);
    const { n: leftAtLastFault } = await h.one<{ n: number }>("SELECT count(*)::int AS n FROM {{schema}}.task_states WHERE state <> 'completed'");
    await h.waitDrained(150_000);
    await sleep(700); // the workers' last metrics lines
    const sampled = await sampler.stop();
    await h.stopSampler();
    const wallS = Math.round((performance.now() - t0) / 1000);

    const c = await h.check({ maxRetry: MAX_RETRY, txTypes: ['tx'] });
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
    const stuckBound = ORACLE_BOUND_S + DOWN_MS / 1000 + Math.max(...restartMs) / 1000 + 1;
    const figures = h.figures('F33 limits under faults', c, {
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
      kills: KILLS,
      held_at_kill: heldAtKill,
      crashes: CRASHES,
      active_at_crash: activeAtCrash,
      restart_ms: restartMs,
      left_at_last_fault: leftAtLastFault,
      stuck_bound_s: stuckBound,
      wall_s: wallS,
      notes:
        `conc: concurrency ${CONC}; rated: ${RATE.limit} per ${RATE.interval} ms; keyed: ${KEY_CONC} per key over ${KEYS} keys; ` +
        `4 workers x 4, prefetch 4; SIGKILL ${KILLS}x a worker holding >= 2 limited tasks (respawn 2 s), crash ${CRASHES}x (${DOWN_MS / 1000} s down); ` +
        `bounds sampled every ${SAMPLE_MS} ms and counted at every claim in its transaction; rate window over every claim's started_at`,
    });
    recordFigures(figures);
    console.log(JSON.stringify({ ...figures, notes: undefined }));
    assert.deepEqual(assertInvariants(c, { maxRetry: MAX_RETRY, stuckBoundS: stuckBound, unexpected: h.unexpectedExits() }), []);
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
