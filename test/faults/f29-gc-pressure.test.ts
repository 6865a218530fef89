/**
 * F29 gc-pressure (plan §5.2, R4): workers run with --max-old-space-size=256
 * (NODE_OPTIONS), and `alloc` tasks each allocate about 200 MB of
 * short-lived objects (chunks of ~8 MB with a turn of the event loop between
 * them, the last two chunks kept alive, so that objects survive scavenges and
 * the old space fills and is collected over and over), while `tx` tasks flow
 * beside them and heartbeat through the collections. Every task commits its
 * effect with ctx.transaction.
 *
 * Must hold: I2 (effects once, whatever leases the pauses cost), I1, I3, I4,
 * I5; no worker dies of the heap limit.
 *
 * Figures: GC pause p99 and max (PerformanceObserver 'gc' in each worker,
 * worst worker), the number of collections (major ones apart), event-loop
 * lag p99, leases_lost, and how long an `alloc` execution took.
 */
import assert from 'node:assert/strict';
import { sleep, type Child } from './harness.js';
import { faultTest, report } from './kit.js';

const MAX_RETRY = 3;
const ALLOC_TASKS = 24;
const ALLOC_MB = 200;
const TX_TASKS = 100;
const HEAP_MB = 256;

const metric = (c: Child, key: string): number => (c.metrics as unknown as Record<string, number> | undefined)?.[key] ?? 0;

faultTest(
  `F29 gc-pressure: ${ALLOC_MB} MB of short-lived objects per task in a ${HEAP_MB} MB heap; effects once`,
  { schema: 'f29', timeout: 240_000 },
  async (h) => {
    const env = { NODE_OPTIONS: `${process.env.NODE_OPTIONS ?? ''} --max-old-space-size=${HEAP_MB}`.trim(), GC_STATS: '1' };
    const workers = await h.spawnWorkers(['w1', 'w2'], { concurrency: 4, env });
    h.startSampler();
    const t0 = performance.now();
    const allocs = await h.spawnProducer({ count: ALLOC_TASKS, rate: 1, type: 'alloc', maxRetry: MAX_RETRY }, 'producer-alloc');
    const txs = await h.spawnProducer({ count: TX_TASKS, rate: 5, maxRetry: MAX_RETRY }, 'producer-tx');
    await Promise.all([allocs.exited, txs.exited]);
    // The figures are recorded even if the drain times out (they say why).
    const drainError = await h.waitDrained(150_000).then(
      () => undefined,
      (err: unknown) => err as Error,
    );
    const wallS = Math.round((performance.now() - t0) / 1000);
    await sleep(700);
    await h.stopSampler();

    const alloc = await h.one<{ n: number; p50: number | null; max: number | null }>(`
    SELECT count(*)::int AS n, percentile_cont(0.5) WITHIN GROUP (ORDER BY s)::float8 AS p50, max(s)::float8 AS max
    FROM (SELECT extract(epoch FROM e.at - s.at) AS s FROM {{schema}}.h_exec s JOIN {{schema}}.h_exec e ON e.attempt = s.attempt AND e.phase = 'end'
          JOIN {{schema}}.tasks t ON t.id = s.task_id WHERE s.phase = 'start' AND t.type = 'alloc') d`);
    const worst = (key: string): number => Math.max(...workers.map((w) => metric(w, key)));
    const sum = (key: string): number => workers.reduce((n, w) => n + metric(w, key), 0);
    const round2 = (v: number | null) => (v === null ? null : Math.round(v * 100) / 100);
    const c = await h.check({ maxRetry: MAX_RETRY, txTypes: ['tx', 'alloc'] });
    report(h, c, 'F29 gc-pressure', {
      gc_pause_p99_ms: worst('gcPauseP99Ms'),
      gc_pause_max_ms: worst('gcPauseMaxMs'),
      gc_pause_total_ms: Math.round(sum('gcPauseTotalMs')),
      gc_count: sum('gcCount'),
      gc_major_count: sum('gcMajorCount'),
      heap_limit_mb: worst('heapLimitMb'),
      event_loop_lag_p99_ms: worst('loopLagP99Ms'),
      event_loop_lag_max_ms: worst('loopLagMaxMs'),
      alloc_executions: alloc.n,
      alloc_task_s_p50: round2(alloc.p50),
      alloc_task_s_max: round2(alloc.max),
      wall_s: wallS,
      notes:
        `2 workers x 4 with --max-old-space-size=${HEAP_MB} (V8 heap limit ${worst('heapLimitMb')} MB); ${ALLOC_TASKS} alloc tasks of ~${ALLOC_MB} MB of short-lived objects at 1/s ` +
        `(${alloc.n} executions, p50 ${round2(alloc.p50)} s, max ${round2(alloc.max)} s) beside ${TX_TASKS} tx tasks at 5/s; ` +
        `${sum('gcCount')} collections (${sum('gcMajorCount')} major), pause p99 ${worst('gcPauseP99Ms')} ms / max ${worst('gcPauseMaxMs')} ms (worst worker), ` +
        `${Math.round(sum('gcPauseTotalMs'))} ms paused in all; event-loop lag p99 ${worst('loopLagP99Ms')} ms / max ${worst('loopLagMaxMs')} ms`,
    });
    assert.equal(drainError, undefined, 'the queue drained');
    assert.equal(c.acked, ALLOC_TASKS + TX_TASKS);
    for (const w of workers)
      assert.ok(
        metric(w, 'heapLimitMb') > 0 && metric(w, 'heapLimitMb') < 2 * HEAP_MB,
        `${w.name} ran with a ${HEAP_MB} MB old space (limit ${metric(w, 'heapLimitMb')} MB)`,
      );
    assert.ok(alloc.n >= ALLOC_TASKS, 'every alloc task ran');
    assert.ok(sum('gcMajorCount') > 0, 'the old space was collected (major GCs)');
  },
);
