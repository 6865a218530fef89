/**
 * F05 heartbeat-connection-terminated (plan §5.2). pgasynq's server has one
 * pool (application_name `pgasynq:server:<pid>`) for claims, heartbeats,
 * completions and maintenance, not a heartbeat connection of its own, so
 * the fault is: every 2 s, for 14 s, pg_terminate_backend on every IDLE
 * backend of the server pools (those between statements: the next heartbeat
 * takes one of them from the pool, or a new one). Tasks run 2·L, so each
 * lives through several terminations. Leases must be kept (a failed beat is
 * retried within 200 ms, well inside the 2 s trust window) and no handler
 * aborted.
 */
import assert from 'node:assert/strict';
import { FAST, sleep, waitFor } from './harness.js';
import { faultTest, report } from './kit.js';

const MAX_RETRY = 3;

faultTest(
  'F05 heartbeat-connection-terminated: idle server sessions killed every 2 s; leases kept, nothing aborted',
  { schema: 'f05', timeout: 150_000 },
  async (h) => {
    await Promise.all([h.spawnWorker('w1', { concurrency: 4 }), h.spawnWorker('w2', { concurrency: 4 })]);
    h.startSampler();
    await h.spawnProducer({ count: 16, rate: 0, msMin: 2 * FAST.leaseDuration, maxRetry: MAX_RETRY });
    await waitFor(async () => Object.values(await h.openStarts()).reduce((a, b) => a + b, 0) >= 8, 30_000, '8 running tasks', 50);
    const killed: number[] = [];
    for (let t = 0; t < 14_000; t += 2000) {
      killed.push(await h.terminate('pgasynq:server:%', { idleOnly: true }));
      await sleep(2000);
    }
    await h.settle(60_000);

    const { aborted } = await h.one<{ aborted: number }>("SELECT count(*)::int AS aborted FROM {{schema}}.h_exec WHERE phase IN ('abort', 'fenced')");
    const c = await h.check({ maxRetry: MAX_RETRY });
    const leasesLost = h.metricSum('leasesLost');
    report(h, c, 'F05 heartbeat-connection-terminated', {
      backends_terminated: killed.reduce((a, b) => a + b, 0),
      terminations: killed.length,
      handlers_aborted: aborted,
      rescued: h.metricSum('recovered'),
      notes:
        `one pool per server (no separate heartbeat connection): every 2 s x ${killed.length}, terminated the idle pgasynq:server:% backends ` +
        `(${killed.join('+')} backends); tasks of 2 L = ${(2 * FAST.leaseDuration) / 1000} s`,
    });
    assert.ok(
      killed.some((n) => n > 0),
      'server backends were terminated',
    );
    assert.equal(leasesLost, 0, 'no lease lost');
    assert.equal(aborted, 0, 'no handler aborted');
    assert.equal(c.dupExternal, 0, 'each task ran once');
  },
);
