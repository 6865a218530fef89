/**
 * F14 clock-skew-app (plan §5.2): three workers whose host clocks disagree —
 * one 45 s ahead, one 120 s behind (libfaketime preloaded, the monotonic
 * clock left real), one true — share the queue. A share of the tasks is due
 * 0.5–2 s after its enqueue, and a fifth fail their first attempt and retry
 * after the retry delay. Every decision about time is the database's (R3), so:
 * nothing starts before it is due (I6), no retry before its delay has passed
 * on the database clock, no lease is rescued early (the recoverer of the
 * worker 45 s ahead would otherwise take every lease at once), and every
 * lease, whoever wrote it, reaches at most L past the database's now.
 */
import assert from 'node:assert/strict';
import { FAST, sleep } from './harness.js';
import { faultTest, report } from './kit.js';

const LIBFAKETIME = '/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1';
const skewed = (offset: string) => ({ LD_PRELOAD: LIBFAKETIME, FAKETIME: offset, FAKETIME_DONT_FAKE_MONOTONIC: '1' });
const MAX_RETRY = 3;
const RETRY_DELAY_MS = 1000;
const L_S = FAST.leaseDuration / 1000;

faultTest(
  'F14 clock-skew-app: workers at +45 s, −120 s and true time; nothing early, no early rescue, leases in database time',
  { schema: 'f14', timeout: 240_000 },
  async (h) => {
    const profile = { retryDelayMs: RETRY_DELAY_MS };
    const workers = [
      await h.spawnWorker('ahead45', { concurrency: 4, sleepMin: 100, sleepMax: 400, profile, env: skewed('+45s') }),
      await h.spawnWorker('behind120', { concurrency: 4, sleepMin: 100, sleepMax: 400, profile, env: skewed('-120s') }),
      await h.spawnWorker('true', { concurrency: 4, sleepMin: 100, sleepMax: 400, profile }),
    ];
    // The skew took: each process's host clock, as it said when ready, against the database's.
    const dbNow = (await h.dbNow()).getTime();
    const skews = workers.map((w) => Math.round(((w.events.find((e) => e.event === 'ready')?.hostNow as number) - dbNow) / 1000));
    assert.ok(
      Math.abs(skews[0]! - 45) <= 5 && Math.abs(skews[1]! + 120) <= 5 && Math.abs(skews[2]!) <= 5,
      `host clocks skewed as planned (${skews.join(', ')} s)`,
    );
    h.startSampler();
    const leaseAhead: number[] = [];
    const claimLen: number[] = [];
    let sampling = true;
    const sampler = (async () => {
      while (sampling) {
        const [r] = await h
          .query<{ ahead: number | null; shortest: number | null; longest: number | null }>(
            `SELECT max(extract(epoch FROM lease_expires_at - clock_timestamp()))::float8 AS ahead,
                  min(extract(epoch FROM lease_expires_at - started_at))::float8 AS shortest,
                  max(extract(epoch FROM lease_expires_at - started_at))::float8 AS longest
           FROM {{schema}}.tasks WHERE state = 'active'`,
          )
          .catch(() => [{ ahead: null, shortest: null, longest: null }]);
        if (r?.ahead != null) leaseAhead.push(r.ahead);
        if (r?.shortest != null) claimLen.push(r.shortest);
        await sleep(50);
      }
    })();
    const plain = await h.spawnProducer({ count: 300, rate: 30, maxRetry: MAX_RETRY, scheduled: 0.3 });
    const flaky = await h.spawnProducer({ count: 75, rate: 8, maxRetry: MAX_RETRY, type: 'flaky' }, 'producer-flaky');
    await Promise.all([plain.exited, flaky.exited]);
    await h.waitDrained(120_000);
    sampling = false;
    await sampler;
    await h.stopSampler();

    const c = await h.check({ maxRetry: MAX_RETRY, txTypes: ['tx', 'flaky'] });
    // A retry starts no sooner than the retry delay after its failure, on the database clock
    // (the failure is recorded after the 'abort' row, so that row's time is a lower bound).
    const [retries] = await h.query<{ n: number; early: number; min_gap_ms: number | null }>(
      `SELECT count(*)::int AS n,
            count(*) FILTER (WHERE s.at < a.at + $1 * interval '1 millisecond')::int AS early,
            min(extract(epoch FROM s.at - a.at) * 1000)::float8 AS min_gap_ms
     FROM {{schema}}.h_exec a
     JOIN LATERAL (SELECT min(x.at) AS at FROM {{schema}}.h_exec x WHERE x.task_id = a.task_id AND x.phase = 'start' AND x.at > a.at) s ON true
     WHERE a.phase = 'abort' AND a.detail = 'flaky'`,
      [RETRY_DELAY_MS],
    );
    const ran = await h.query<{ worker: string; n: number }>(
      "SELECT split_part(worker, ':', 1) AS worker, count(*)::int AS n FROM {{schema}}.h_exec WHERE phase = 'start' GROUP BY 1 ORDER BY 1",
    );
    const rescued = h.metricSum('recovered');
    const leasesLost = h.metricSum('leasesLost');
    const maxAhead = Math.max(...leaseAhead);
    const lenErrMs = Math.round(Math.max(...claimLen.map((x) => Math.abs(Math.min(x, L_S) - L_S))) * 1000);
    report(h, c, 'F14 clock-skew-app', {
      early_executions: c.earlyStarts,
      early_retries: retries!.early,
      retries: retries!.n,
      retry_min_gap_ms: retries!.min_gap_ms === null ? null : Math.round(retries!.min_gap_ms),
      premature_rescues: rescued,
      leases_lost: leasesLost,
      lease_ahead_max_s: Math.round(maxAhead * 1000) / 1000,
      lease_len_err_ms_max: lenErrMs,
      starts_per_worker: Object.fromEntries(ran.map((r) => [r.worker, r.n])),
      host_skew_s: skews,
      notes: `workers at +45 s, -120 s and true host time (libfaketime, monotonic real); 30 % of 300 tasks due 0.5-2 s ahead, 75 flaky tasks retried after ${RETRY_DELAY_MS} ms; ${leaseAhead.length} lease samples`,
    });
    assert.ok(c.scheduled > 50, `scheduled tasks were checked (${c.scheduled})`);
    assert.equal(retries!.n, 75, 'every flaky task ran again');
    assert.equal(retries!.early, 0, 'no retry before its delay on the database clock');
    assert.equal(rescued, 0, 'no lease rescued: every task finished well within its lease');
    assert.equal(leasesLost, 0);
    assert.ok(leaseAhead.length > 20, 'leases were sampled');
    assert.ok(maxAhead <= L_S + 0.1, `no lease reaches more than L past the database's now (max ${maxAhead.toFixed(3)} s)`);
    assert.ok(lenErrMs <= 100, `claims set leases of L in database time (worst ${lenErrMs} ms short)`);
    for (const w of ['ahead45', 'behind120', 'true']) assert.ok((ran.find((r) => r.worker === w)?.n ?? 0) > 20, `${w} ran its share`);
    assert.equal(workers.length, 3);
  },
);
