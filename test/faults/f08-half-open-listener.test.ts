/**
 * F08 half-open-listener (plan §5.2, R10).
 *
 * Injected: the worker's LISTEN connection (listenConnectionString) goes
 * through the harness's TCP proxy (proxy.ts); its other connections are
 * direct. With a poll interval P = 2 s, a producer of 1 short task every
 * 200 ms and one idle worker, the proxy blackholes the existing listener
 * flow: it forwards nothing either way and sends no FIN and no RST, so no
 * socket event tells the worker, and TCP itself stays healthy (the proxy's
 * kernel acknowledges). New connections through the proxy still work.
 *
 * Must hold: the notifier's health ping notices within 10·P + P (plan
 * F08) and the worker listens again on a new session, within 1 s more (a new `LISTEN` backend
 * of `pgasynq:listener` in pg_stat_activity; the old one stays, as the
 * server never hears of the client's end either); meanwhile polling picks
 * every task up (no task waits longer than the poll bound, 1.5·P + 2 s as in
 * F07); after the reconnect pickup is back at notify level (p99 ≤ P/2);
 * I1–I5.
 *
 * If the ping never notices, the test says so (detection_s null), ends the
 * outage by resetting the flow (RST: the worker's listener gets an error and
 * reconnects) so that the after phase is still measured, and fails.
 */
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { sleep, waitFor } from './harness.js';
import { faultTest, report } from './kit.js';
import { blackhole, reset, TcpProxy } from './proxy.js';
import { pickupPhases } from './samplers.js';

const MAX_RETRY = 3;
const P_MS = 2000;
/**
 * The plan's detection bound (the health ping runs every 10·P and waits P for its answer),
 * plus 1 s for the new session to connect and LISTEN, which is what the test sees.
 */
const DETECT_BOUND_S = (11 * P_MS) / 1000 + 1;
faultTest(
  'F08 half-open-listener: the LISTEN flow is blackholed; the health ping notices, the worker listens again, polling covers the gap',
  { schema: 'f08', timeout: 180_000 },
  async (h) => {
    const proxy = await TcpProxy.start({ targetHost: '127.0.0.1', targetPort: h.cluster.port });
    h.defer(() => proxy.close());
    const w1 = await h.spawnWorker('w1', { concurrency: 4, profile: { taskCheckInterval: P_MS }, env: { LISTEN_URL: proxy.dsn(h.connectionString) } });
    const listeners = () =>
      h.query<{ pid: number; backend_start: Date }>(
        "SELECT pid, backend_start FROM pg_stat_activity WHERE application_name = 'pgasynq:listener' AND query LIKE 'LISTEN%' ORDER BY backend_start",
      );
    const [first] = await waitFor(async () => ((await listeners()).length === 1 ? listeners() : undefined), 20_000, 'the LISTEN session');
    // The startup probe's connection went through the proxy too, and has closed: one flow is left.
    await waitFor(() => proxy.open.length === 1, 10_000, 'one open flow through the proxy (the listener)');
    h.startSampler();
    await h.spawnProducer({ count: 260, rate: 5, msMin: 50, maxRetry: MAX_RETRY });
    await sleep(8000);

    const tBlack = await h.dbNow();
    const t0 = performance.now();
    const holed = proxy.setMode(blackhole(), { future: false });
    let detectionS: number | null = null;
    let reconnected: { pid: number; backend_start: Date } | undefined;
    try {
      reconnected = await waitFor(async () => (await listeners()).find((l) => l.pid !== first!.pid), DETECT_BOUND_S * 1000 + 5000, 'a new LISTEN session', 100);
      detectionS = Math.round((performance.now() - t0) / 100) / 10;
    } catch {
      // Not noticed: end the outage the loud way, so that what follows is still measured.
      for (const c of holed) c.setMode(reset());
      reconnected = await waitFor(async () => (await listeners()).find((l) => l.pid !== first!.pid), 20_000, 'a new LISTEN session after the reset', 100);
    }
    const outageS = Math.round((performance.now() - t0) / 100) / 10;
    const tBack = await h.dbNow();
    const stale = (await listeners()).some((l) => l.pid === first!.pid);
    await h.settle(60_000);

    // Pickup latency (first start − enqueue, DB clock) by when the task was enqueued; 'edge': just before the
    // blackhole, their NOTIFY may have been in flight when it began.
    const by = await pickupPhases(
      h,
      [
        ['before', new Date(tBlack.getTime() - 500)],
        ['edge', tBlack],
        ['during', tBack],
        ['reconnect', new Date(tBack.getTime() + 1000)],
      ],
      'after',
    );
    const phases = Object.values(by);
    // The slowest pickups, with when their task was enqueued (s from the blackhole).
    const slowest = await h.query<{ ms: number; at_s: number }>(
      `SELECT round(extract(epoch FROM min(x.at) - t.enqueued_at) * 1000)::float8 AS ms, round(extract(epoch FROM t.enqueued_at - $1::timestamptz)::numeric, 1)::float8 AS at_s
       FROM {{schema}}.tasks t JOIN {{schema}}.h_exec x ON x.task_id = t.id AND x.phase = 'start' GROUP BY t.id, t.enqueued_at ORDER BY 1 DESC LIMIT 12`,
      [tBlack],
    );
    const c = await h.check({ maxRetry: MAX_RETRY });
    const fmt = (p: string) => (by[p] ? `${by[p].p50}/${by[p].p99}/${by[p].max} ms (n=${by[p].n})` : '-');
    const fig = report(h, c, 'F08 half-open-listener', {
      recovery_s: detectionS,
      detection_s: detectionS,
      detection_bound_s: DETECT_BOUND_S,
      outage_s: outageS,
      polled_during_outage: by.during?.n ?? 0,
      pickup_ms: by,
      stale_listener_left: stale,
      slowest_pickups: slowest,
      notes:
        `P = ${P_MS / 1000} s, 1 task / 200 ms, 1 idle worker whose listenConnectionString goes through the proxy; blackholed ${holed.length} flow(s) ` +
        (detectionS === null
          ? `and the worker did NOT notice within ${DETECT_BOUND_S + 5} s (bound ${DETECT_BOUND_S} s): the flow was then reset (RST) and the listener reconnected, ${outageS} s after the blackhole; `
          : `and a new LISTEN session was up ${detectionS} s later (bound ${DETECT_BOUND_S} s); `) +
        `${by.during?.n ?? 0} tasks enqueued during the outage were picked up by polling; pickup p50/p99/max before ${fmt('before')}, edge ${fmt('edge')}, ` +
        `during ${fmt('during')}, reconnect ${fmt('reconnect')}, after ${fmt('after')}; the old listener backend ${stale ? 'is still there (the server never heard of its end)' : 'is gone'}`,
    });
    writeFileSync(join(h.logDir, 'figures.jsonl'), `${JSON.stringify(fig)}\n`);
    assert.equal(holed.length, 1, 'one flow (the listener) was blackholed');
    assert.ok(by.before && by.before.n >= 20 && by.before.p99 <= P_MS / 2, `notify-level pickup before the fault (${fmt('before')})`);
    assert.ok(by.during && by.during.n >= 5, `tasks enqueued during the outage (${fmt('during')})`);
    assert.ok(by.after && by.after.n >= 10, `tasks enqueued after the reconnect (${fmt('after')})`);
    for (const p of phases) assert.ok(p.max <= 1.5 * P_MS + 2000, `${p.phase}: no task waited past the polling bound (${p.max} ms)`);
    assert.ok(by.after.p99 <= P_MS / 2, `pickup p99 after the reconnect ${by.after.p99} ms is notify-level (≤ P/2)`);
    assert.ok(reconnected !== undefined, 'the worker listens on a new session');
    assert.ok(
      detectionS !== null && detectionS <= DETECT_BOUND_S,
      `the health ping noticed the half-open listener within ${DETECT_BOUND_S} s (noticed: ${detectionS === null ? 'never' : `${detectionS} s`})`,
    );
    void w1;
  },
);
