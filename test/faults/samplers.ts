/**
 * The fault suite's samplers: what a test reads from the database again and
 * again while the fault lasts. A refused read (the database may be the very
 * thing that is down) is a missed sample, never an error.
 *
 *   - startStuckSampler: I4 (tasks left active past their lease) and I7
 *     (unique keys with two live tasks), into h_samples: the harness's
 *     startSampler(), and the load tests' on their own profile;
 *   - poll: any other reading, every `everyMs`, until stopped (lease
 *     lengths, backends per role, heartbeat gaps, the limits' counts);
 *   - pickupPhases: pickup latency (first start − enqueue) by when the task
 *     was enqueued, relative to the instants a test marked.
 */
import type { Query } from './checks.js';
import { FAST } from './profile.js';

const pause = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

export interface Sampler {
  /** Stops it; resolves once the sample under way (if any) has settled. */
  stop(): Promise<void>;
}

export interface StuckSamplerOptions {
  /** The profile whose L, C and R the bound is taken from (the fast profile's by default). */
  profile?: { leaseDuration: number; recoverCutoff: number; recoverInterval: number };
  everyMs?: number;
  /** Count I7's unique keys with two live tasks too (a scan of the tasks: not at a million rows). */
  uniqueKeys?: boolean;
}

/**
 * I4 (plan §5.1) every `everyMs` into h_samples: the active rows whose lease expired more than
 * C + R + 1 s ago, and the longest time since any active row's last extension (now −
 * lease_expires_at + L); I7 beside it. `lease_owner IS NOT NULL` (always true when active) lets
 * tasks_active_idx serve: no scan of the whole table per sample.
 */
export function startStuckSampler(h: { query: Query }, { profile = FAST, everyMs = 500, uniqueKeys = true }: StuckSamplerOptions = {}): Sampler {
  const uniq = `(SELECT count(*) FROM (SELECT queue, unique_key FROM {{schema}}.tasks
                 WHERE unique_key IS NOT NULL AND state IN ('pending', 'scheduled', 'active', 'retry')
                 GROUP BY 1, 2 HAVING count(*) > 1) d)`;
  const stmt = `
    INSERT INTO {{schema}}.h_samples (stuck, stuck_max_s, uniq_violations)
    SELECT count(*) FILTER (WHERE lease_expires_at < now() - make_interval(secs => $1)),
           max(extract(epoch FROM clock_timestamp() - lease_expires_at))::float8 + $2, ${uniqueKeys ? uniq : '0'}
    FROM {{schema}}.tasks WHERE state = 'active' AND lease_owner IS NOT NULL`;
  const secs = (profile.recoverCutoff + profile.recoverInterval) / 1000 + 1;
  let busy = false;
  let sampling: Promise<unknown> = Promise.resolve();
  const timer = setInterval(() => {
    if (busy) return;
    busy = true;
    sampling = h
      .query(stmt, [secs, profile.leaseDuration / 1000])
      .catch(() => {})
      .finally(() => (busy = false));
  }, everyMs);
  return {
    async stop() {
      clearInterval(timer);
      await sampling;
    },
  };
}

/** Runs `sample` again and again, `everyMs` apart, until stopped; what it throws is dropped (a missed sample). */
export function poll(everyMs: number, sample: () => Promise<unknown>): Sampler {
  let polling = true;
  const loop = (async () => {
    while (polling) {
      await sample().catch(() => {});
      await pause(everyMs);
    }
  })();
  return {
    async stop() {
      polling = false;
      await loop;
    },
  };
}

export interface PickupPhase {
  phase: string;
  n: number;
  p50: number;
  p99: number;
  max: number;
}

/**
 * Pickup latency (first execution start − enqueue, database clock) per phase, p50/p99/max ms: a
 * task enqueued before `bounds[i][1]` (and after the bound before it) belongs to `bounds[i][0]`;
 * one enqueued after the last bound, to `last`.
 */
export async function pickupPhases(h: { query: Query }, bounds: [phase: string, until: Date][], last: string): Promise<Record<string, PickupPhase>> {
  const cases = bounds.map(([phase], i) => `WHEN t.enqueued_at < $${i + 1}::timestamptz THEN '${phase}'`).join('\n                       ');
  const phases = await h.query<PickupPhase>(
    `SELECT phase, count(*)::int AS n,
            round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms))::float8 AS p50,
            round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms))::float8 AS p99, round(max(ms))::float8 AS max
     FROM (SELECT CASE ${cases}
                       ELSE '${last}' END AS phase,
                  extract(epoch FROM min(x.at) - t.enqueued_at) * 1000 AS ms
           FROM {{schema}}.tasks t JOIN {{schema}}.h_exec x ON x.task_id = t.id AND x.phase = 'start'
           GROUP BY t.id, t.enqueued_at) l
     GROUP BY phase`,
    bounds.map(([, until]) => until),
  );
  return Object.fromEntries(phases.map((p) => [p.phase, p]));
}
