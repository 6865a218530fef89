/**
 * F22 graceful-shutdown (plan §5.2, R19): w1 holds 16 tasks of 0.5–4·L and
 * gets SIGTERM; its grace period (shutdownTimeout) is 2·L. It must claim
 * nothing more, keep heartbeating during the grace period (tasks longer than
 * L finish without losing their lease), complete what finishes in time, and
 * give the rest back at once with a fenced requeue that uses no retry: when
 * w1 has exited, none of its tasks is still active (the recoverer would need
 * L + C more), none has a retry counted or a "lease expired" error. A second
 * worker started afterwards runs them.
 */
import assert from 'node:assert/strict';
import { FAST, sleep, waitFor } from './harness.js';
import { faultTest, report } from './kit.js';

const MAX_RETRY = 3;
const GRACE_MS = 2 * FAST.leaseDuration;

faultTest(
  'F22 graceful-shutdown: SIGTERM with 16 tasks in flight; heartbeats through the grace period, the rest requeued at once without a retry',
  { schema: 'f22', timeout: 150_000 },
  async (h) => {
    const w1 = await h.spawnWorker('w1', { concurrency: 16, profile: { shutdownTimeout: GRACE_MS } });
    h.startSampler();
    // 0.5–4 L; the producer goes on after the SIGTERM (no new claims may follow it). Up to 4 L, so
    // that some task still has more than the grace period to run at SIGTERM: with up to 3 L, all
    // 16 sometimes finished within it on a loaded machine (a CI run), and none was requeued.
    const producer = await h.spawnProducer({ count: 32, rate: 8, msMin: 0.5 * FAST.leaseDuration, msMax: 4 * FAST.leaseDuration, maxRetry: MAX_RETRY });
    await waitFor(async () => (await h.openStarts())[w1.tag] === 16, 30_000, 'w1 to hold 16 running tasks', 50);
    const termAt = await h.dbNow();
    const t0 = performance.now();
    h.signal(w1, 'SIGTERM');
    const exit = await Promise.race([w1.exited, sleep(GRACE_MS + 15_000).then(() => undefined)]);
    const requeueLatencyS = Math.round((performance.now() - t0) / 100) / 10;
    assert.ok(exit, `w1 exited after SIGTERM (within grace + 15 s)`);

    // The moment w1 is gone, before anyone else runs: nothing of its is active.
    const [atExit] = await h.query<{ active: number; requeued: number; retried: number; lease_errors: number }>(
      `SELECT count(*) FILTER (WHERE state = 'active')::int AS active,
            count(*) FILTER (WHERE state = 'pending' AND started_at IS NOT NULL)::int AS requeued,
            count(*) FILTER (WHERE retried > 0)::int AS retried,
            count(*) FILTER (WHERE error_msg IS NOT NULL)::int AS lease_errors
     FROM {{schema}}.tasks`,
    );
    const [w1After] = await h.query<{ starts: number; completed_in_grace: number; aborted: number }>(
      `SELECT (SELECT count(*)::int FROM {{schema}}.h_exec WHERE worker = $1 AND phase = 'start' AND at > $2::timestamptz + interval '1 second') AS starts,
            (SELECT count(*)::int FROM {{schema}}.h_effects WHERE worker = $1 AND at > $2) AS completed_in_grace,
            (SELECT count(*)::int FROM {{schema}}.h_exec WHERE worker = $1 AND phase = 'abort' AND detail = 'ServerClosedError') AS aborted`,
      [w1.tag, termAt],
    );
    await producer.exited;
    await h.spawnWorker('w2', { concurrency: 32 });
    await h.settle(60_000);

    const c = await h.check({ maxRetry: MAX_RETRY });
    const w1m = w1.metrics;
    report(h, c, 'F22 graceful-shutdown', {
      recovery_s: requeueLatencyS,
      requeue_latency_s: requeueLatencyS,
      grace_s: GRACE_MS / 1000,
      leases_lost_during_grace: w1m?.leasesLost ?? null,
      completed_in_grace: w1After!.completed_in_grace,
      aborted_at_grace_end: w1After!.aborted,
      requeued: atExit!.requeued,
      active_at_exit: atExit!.active,
      claims_after_sigterm: w1After!.starts,
      notes:
        `w1 x 16 slots, tasks 0.5-4 L, grace ${GRACE_MS / 1000} s; SIGTERM -> exit ${requeueLatencyS} s (recovery_s = requeue latency, about grace, not grace + C + R); ` +
        `${w1After!.completed_in_grace} completed in grace, ${atExit!.requeued} requeued (pending, retried 0), ${atExit!.active} active at exit`,
    });
    assert.equal(w1.exitInfo?.code, 0, 'w1 shut down cleanly');
    assert.equal(atExit!.active, 0, 'nothing left active: requeued by w1, not waiting for the recoverer');
    assert.ok(atExit!.requeued > 0, 'tasks longer than the grace period were requeued');
    assert.equal(atExit!.retried, 0, 'the requeue used no retry');
    assert.equal(atExit!.lease_errors, 0, 'no task went through the recoverer or failed');
    assert.equal(w1m?.leasesLost, 0, 'no lease lost during the grace period (heartbeats went on)');
    assert.ok(w1After!.completed_in_grace > 0, 'tasks that finished within the grace period completed');
    assert.equal(w1After!.starts, 0, 'no claim after SIGTERM');
    assert.ok(requeueLatencyS <= GRACE_MS / 1000 + 5, `requeued about the grace period after SIGTERM (${requeueLatencyS} s)`);
  },
);
