/**
 * F30 event-loop-blocking-handler (plan §5.2, K15): a handler that runs a
 * synchronous busy loop for 2·L with no await, on its first attempt. pgasynq
 * heartbeats from the main thread (R4's choice: no worker_thread), so while
 * the loop runs nothing extends its lease, and the other worker's recoverer
 * may rescue the task (its lease expired L ago plus the cutoff C). Which case
 * applies depends on timing, and the test records it per task:
 *   - "rescued": the task was rescued and ran again elsewhere; the blocked
 *     worker's late ctx.transaction was refused (locally or by the token);
 *   - "completed-late": the loop ended before any rescue, and the blocked
 *     worker's ctx.transaction still held the token, so it completed (the
 *     row's lease had expired, but no one had taken it: fencing is by token);
 *   - "kept": the lease was never lost (only with off-thread heartbeats).
 * The transactional effect happens exactly once in every case.
 */
import assert from 'node:assert/strict';
import { FAST, sleep, waitFor } from './harness.js';
import { faultTest, report } from './kit.js';

const MAX_RETRY = 3;
const BLOCK_MS = 2 * FAST.leaseDuration;
const BLOCKERS = 2;

faultTest(
  'F30 event-loop-blocking-handler: a 2·L synchronous handler; the case is recorded, the effect happens once',
  { schema: 'f30', timeout: 150_000 },
  async (h) => {
    // Enqueued before w1 starts, so that its first claim takes them all and every handler has
    // started before the first loop blocks the process (one enqueued later would wait for it).
    const blockers: string[] = [];
    for (let i = 0; i < BLOCKERS; i++) blockers.push(await h.enqueue('block', { blockMs: BLOCK_MS }, { maxRetry: MAX_RETRY }));
    const w1 = await h.spawnWorker('w1', { concurrency: 4 });
    h.startSampler();
    await waitFor(async () => (await h.openStarts())[w1.tag] === BLOCKERS, 30_000, 'w1 to start the blocking tasks', 20);
    // The rescuer, and tx tasks flowing beside.
    await h.spawnWorker('w2', { concurrency: 4, sleepMin: 100, sleepMax: 300 });
    const producer = await h.spawnProducer({ count: 40, rate: 5, maxRetry: MAX_RETRY });
    await waitFor(
      async () =>
        (await h.query<{ n: number }>("SELECT count(*)::int AS n FROM {{schema}}.tasks WHERE id = ANY($1) AND state = 'completed'", [blockers]))[0]!.n ===
        BLOCKERS,
      60_000,
      'the blocking tasks to complete',
      200,
    );
    await producer.exited;
    await h.waitDrained(60_000);
    // The blocked attempts end late (the loops run one after the other): wait for them too.
    await waitFor(async () => !(await h.openStarts())[w1.tag], 60_000, "w1's blocked attempts to end", 200);
    await sleep(1200);
    await h.stopSampler();

    const cases = await h.query<{ id: string; runs: number; refused_local: number; refused_db: number; effect_by_blocked: boolean; retried: number }>(
      `SELECT t.id, t.retried,
            (SELECT count(DISTINCT attempt)::int FROM {{schema}}.h_exec x WHERE x.task_id = t.id AND x.phase = 'start') AS runs,
            (SELECT count(*)::int FROM {{schema}}.h_exec x WHERE x.task_id = t.id AND x.phase = 'fenced' AND x.detail = 'local') AS refused_local,
            (SELECT count(*)::int FROM {{schema}}.h_exec x WHERE x.task_id = t.id AND x.phase = 'fenced' AND x.detail = 'db') AS refused_db,
            EXISTS (SELECT 1 FROM {{schema}}.h_effects e WHERE e.task_id = t.id AND e.worker = $2) AS effect_by_blocked
     FROM {{schema}}.tasks t WHERE t.id = ANY($1)`,
      [blockers, w1.tag],
    );
    // One run: completed by the blocked worker itself, its token still matching ("kept" would look the
    // same, but in-thread heartbeats cannot extend a lease through a 2 L loop, so it is "completed-late").
    const caseOf = (r: (typeof cases)[number]): string => (r.runs > 1 ? 'rescued' : 'completed-late');
    const c = await h.check({ maxRetry: MAX_RETRY });
    report(h, c, 'F30 event-loop-blocking-handler', {
      cases: cases.map(caseOf),
      blocked_worker_leases_lost: w1.metrics?.leasesLost ?? null,
      event_loop_lag_max_ms: w1.metrics?.loopLagMaxMs ?? null,
      refused_local: cases.reduce((n, r) => n + r.refused_local, 0),
      refused_by_db: cases.reduce((n, r) => n + r.refused_db, 0),
      notes:
        `${BLOCKERS} tasks busy-loop ${BLOCK_MS / 1000} s (2 L) on their first run in w1; heartbeats share the main thread (no worker_thread), so the lease is not extended meanwhile. ` +
        `cases: ${cases.map(caseOf).join(', ')} (rescued = run again elsewhere, the late ctx.transaction refused; completed-late = the loop ended before any rescue and the token still matched). ` +
        `event-loop lag max ${w1.metrics?.loopLagMaxMs} ms`,
    });
    assert.equal(cases.length, BLOCKERS);
    for (const r of cases) {
      if (r.runs > 1) assert.equal(r.refused_local + r.refused_db, 1, 'the blocked attempt of a rescued task was refused');
      else assert.ok(r.effect_by_blocked, 'a task run once was completed by the blocked worker');
    }
    assert.ok((w1.metrics?.loopLagMaxMs ?? 0) >= BLOCK_MS * 0.9, 'the event loop was blocked');
  },
);
