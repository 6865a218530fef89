/**
 * F04 sigstop-shorter-than-lease (plan §5.2): w1 is frozen for 0.4·L = 1.2 s,
 * eight times, while it runs tasks. The database lease (3 s) never runs out
 * during such a pause, so the recoverer must never take a task from a worker
 * that still held it: a "false rescue".
 *
 * The worker may still give a lease up on its own: it stops trusting a lease
 * L − margin = 2 s after the last successful extension was sent (R5), and a
 * 1.2 s pause that starts late in a 1 s heartbeat cycle stretches the gap past
 * that (tolerance = L − margin − H = 1 s). Its handler is then aborted and
 * writes h_exec 'abort'; the recoverer rescuing that task later is correct.
 * So a false rescue is a rescued task (retried > 0) whose earlier attempts
 * were never aborted or refused: the only kind the test forbids.
 */
import assert from 'node:assert/strict';
import { FAST, sleep, waitFor } from './harness.js';
import { faultTest, report } from './kit.js';

const MAX_RETRY = 3;
const PAUSES = 8;
const PAUSE_MS = 0.4 * FAST.leaseDuration;

faultTest(
  'F04 sigstop-shorter-than-lease: 8 pauses of 0.4·L; no task taken from a worker that still held it',
  { schema: 'f04', timeout: 150_000 },
  async (h) => {
    const [w1] = await Promise.all([h.spawnWorker('w1', { concurrency: 4 }), h.spawnWorker('w2', { concurrency: 4 })]);
    h.startSampler();
    await h.spawnProducer({ count: 100, rate: 5, msMin: 500, msMax: 2000, maxRetry: MAX_RETRY });
    await waitFor(async () => ((await h.openStarts())[w1.tag] ?? 0) >= 2, 30_000, 'w1 to run tasks', 50);
    let pausedWithTasks = 0;
    for (let i = 0; i < PAUSES; i++) {
      if (((await h.openStarts())[w1.tag] ?? 0) > 0) pausedWithTasks++;
      h.signal(w1, 'SIGSTOP');
      await sleep(PAUSE_MS);
      h.signal(w1, 'SIGCONT');
      await sleep(1000 + Math.random() * 600);
    }
    await h.settle(90_000);

    const [r] = await h.query<{ rescued: number; false_rescues: number; aborted_lease: number }>(`
    SELECT count(*) FILTER (WHERE t.retried > 0)::int AS rescued,
           count(*) FILTER (WHERE t.retried > 0 AND NOT EXISTS (
             SELECT 1 FROM {{schema}}.h_exec x WHERE x.task_id = t.id AND x.phase IN ('abort', 'fenced')))::int AS false_rescues,
           (SELECT count(*)::int FROM {{schema}}.h_exec WHERE phase = 'abort' AND detail = 'LeaseExpiredError') AS aborted_lease
    FROM {{schema}}.tasks t`);
    const c = await h.check({ maxRetry: MAX_RETRY });
    const leasesLost = h.metricSum('leasesLost');
    report(h, c, 'F04 sigstop-shorter-than-lease', {
      false_rescues: r!.false_rescues,
      rescued: r!.rescued,
      rescued_by_recoverer: h.metricSum('recovered'),
      handlers_aborted_lease_expired: r!.aborted_lease,
      pauses: PAUSES,
      pauses_with_tasks: pausedWithTasks,
      notes:
        `w1 paused ${PAUSES}x ${PAUSE_MS} ms (0.4 L); leases_lost = leases w1 gave up itself at its local deadline (L - margin = 2 s after the last extension sent; ` +
        `tolerated pause = L - margin - H = 1 s < 0.4 L), each then rescued: fail-safe, not false. false_rescues (rescued without the worker giving up) = ${r!.false_rescues}`,
    });
    assert.equal(r!.false_rescues, 0, 'no task was rescued from a worker that still held its lease');
    assert.ok(r!.rescued <= leasesLost, `every rescue (${r!.rescued}) follows a lease the worker gave up (${leasesLost})`);
    assert.ok(pausedWithTasks >= PAUSES / 2, 'most pauses caught w1 holding tasks');
  },
);
