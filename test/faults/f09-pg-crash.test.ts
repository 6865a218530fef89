/**
 * F09 postgres-crash-immediate (plan §5.2): under load, PostgreSQL is
 * crashed (`pg_ctl -m immediate stop`: no shutdown checkpoint, crash recovery
 * at the next start), left down 5 s, and started again; three times. No
 * acknowledged enqueue may be lost (the acknowledgement log is outside the
 * database, fsynced every 100 ids), every producer error must be an explicit
 * rejection, and every process recovers on its own: no restart.
 */
import assert from 'node:assert/strict';
import { sleep, waitFor } from './harness.js';
import { faultTest, outageBound, report } from './kit.js';

const MAX_RETRY = 3;
const CRASHES = 3;
const DOWN_MS = 5000;

faultTest(
  'F09 postgres-crash-immediate: 3 crashes under load; no acknowledged task lost, every process recovers',
  { schema: 'f09', timeout: 200_000 },
  async (h) => {
    const workers = await h.spawnWorkers(['w1', 'w2'], { concurrency: 4, sleepMin: 100, sleepMax: 500 });
    h.startSampler();
    const producer = await h.spawnProducer({ count: 600, rate: 20, maxRetry: MAX_RETRY, scheduled: 0.2 });
    await waitFor(async () => Object.keys(await h.openStarts()).length === 2, 30_000, 'both workers running tasks', 50);
    const restarts: Date[] = [];
    const restartMs: number[] = [];
    const firstClaimS: number[] = [];
    for (let i = 0; i < CRASHES; i++) {
      await sleep(i === 0 ? 2000 : 3500);
      h.cluster.crash();
      await sleep(DOWN_MS);
      const t0 = performance.now();
      h.cluster.start();
      restartMs.push(Math.round(performance.now() - t0));
      // The harness's own sessions died with the server: its pool reconnects on the next query.
      const at = await waitFor(() => h.dbNow().catch(() => undefined), 20_000, 'the harness to reconnect');
      restarts.push(at);
      const t1 = performance.now();
      await waitFor(
        async () => (await h.query("SELECT 1 FROM {{schema}}.h_exec WHERE phase = 'start' AND at > $1 LIMIT 1", [at]).catch(() => [])).length > 0,
        30_000,
        `a task started after restart ${i + 1}`,
        50,
      );
      firstClaimS.push(Math.round((performance.now() - t1) / 100) / 10);
    }
    await h.settle(120_000);

    const lastRestart = restarts[restarts.length - 1]!;
    const claimingAfter = await h.query<{ worker: string }>("SELECT DISTINCT worker FROM {{schema}}.h_exec WHERE phase = 'start' AND at > $1", [lastRestart]);
    const errors = producer.events.filter((e) => e.event === 'error');
    const { committed } = await h.one<{ committed: number }>('SELECT count(*)::int AS committed FROM {{schema}}.tasks WHERE id = ANY($1)', [
      errors.map((e) => e.id),
    ]);
    // A lease held at the crash cannot be rescued before the server is back: the bound counts the outage too.
    const stuckBound = outageBound(DOWN_MS, restartMs);
    const c = await h.check({ maxRetry: MAX_RETRY, stuckBoundS: stuckBound });
    report(h, c, 'F09 postgres-crash-immediate', {
      recovery_s: firstClaimS,
      lost_acked: c.lost,
      crashes: CRASHES,
      restart_ms: restartMs,
      time_to_first_claim_after_start_s: firstClaimS,
      producer_errors: errors.length,
      producer_errors_committed_anyway: committed,
      producer_error_codes: [...new Set(errors.map((e) => e.code ?? String(e.message).slice(0, 40)))].slice(0, 6),
      workers_claiming_after_last_restart: claimingAfter.length,
      stuck_bound_s: stuckBound,
      notes:
        `${CRASHES} x pg_ctl -m immediate stop, ${DOWN_MS / 1000} s down, start (${restartMs.join('/')} ms); producer at 20/s with an fsynced ack log outside the DB; ` +
        `recovery_s = start to the first task started after it; stuck bound here = B + 1 + outage (leases expire while the DB is down)`,
    });
    assert.ok(errors.length > 0, 'the producer saw the outages');
    for (const e of errors) assert.ok(typeof e.message === 'string' && e.message.length > 0, 'each producer error is an explicit rejection');
    assert.equal(producer.events.find((e) => e.event === 'done')?.acked, c.acked, 'the producer acknowledged exactly what the log holds');
    assert.equal(claimingAfter.length, workers.length, 'every worker claimed again after the last restart, without a restart of its own');
  },
);
