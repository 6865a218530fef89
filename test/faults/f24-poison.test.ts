/**
 * F24 poison-task (plan §5.2, R20): a task whose every execution kills its
 * process (process.exit(42)), maxRetry = 3. The harness plays the supervisor
 * and respawns a dead worker. The recoverer rescues the task each time
 * (retried + 1) and never resets `retried`, so it is archived after exactly
 * maxRetry + 1 = 4 executions. Meanwhile `tx` tasks keep flowing.
 */
import assert from 'node:assert/strict';
import { sleep, waitFor, type Child } from './harness.js';
import { faultTest, report } from './kit.js';

const MAX_RETRY = 3;

faultTest(
  'F24 poison-task: a task that kills its worker is archived after exactly maxRetry + 1 runs; other tasks flow',
  { schema: 'f24', timeout: 200_000 },
  async (h) => {
    const opts = { concurrency: 4, sleepMin: 100, sleepMax: 500 };
    await Promise.all(['w1', 'w2'].map((n) => h.spawnWorker(n, opts)));
    // The supervisor: a worker that dies is started again (its name kept, a new pid).
    let deaths = 0;
    let supervising = true;
    const respawns: Promise<unknown>[] = [];
    const supervise = (c: Child): void => {
      void c.exited.then(({ code }) => {
        if (code !== 42 || !supervising) return;
        deaths++;
        respawns.push(sleep(300).then(() => h.respawn(c).then(supervise)));
      });
    };
    h.children.forEach(supervise);
    h.startSampler();
    await h.spawnProducer({ count: 300, rate: 10, maxRetry: MAX_RETRY });
    await sleep(1000);
    const t0 = performance.now();
    const poison = await h.enqueue('poison', {}, { maxRetry: MAX_RETRY });
    const archived = await waitFor(
      async () =>
        (
          await h.query<{ state: string; retried: number; error_msg: string }>('SELECT state, retried, error_msg FROM {{schema}}.tasks WHERE id = $1', [poison])
        )[0]?.state === 'archived',
      120_000,
      'the poison task to be archived',
      200,
    );
    const timeToArchiveS = Math.round((performance.now() - t0) / 100) / 10;
    supervising = false;
    await Promise.all(respawns);
    await h.settle(90_000);

    const [row] = await h.query<{ state: string; retried: number; error_msg: string }>('SELECT state, retried, error_msg FROM {{schema}}.tasks WHERE id = $1', [
      poison,
    ]);
    const { runs } = await h.one<{ runs: number }>(
      "SELECT count(DISTINCT attempt)::int AS runs FROM {{schema}}.h_exec WHERE task_id = $1 AND phase = 'start'",
      [poison],
    );
    // Collateral: pickup latency of the other tasks (and how many of them a death made run twice).
    const [other] = await h.query<{ p50: number; p99: number; rerun: number }>(
      `SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms))::float8 AS p50, round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms))::float8 AS p99,
            count(*) FILTER (WHERE n > 1)::int AS rerun
     FROM (SELECT extract(epoch FROM min(x.at) - t.enqueued_at) * 1000 AS ms, count(DISTINCT x.attempt) AS n
           FROM {{schema}}.tasks t JOIN {{schema}}.h_exec x ON x.task_id = t.id AND x.phase = 'start'
           WHERE t.type = 'tx' GROUP BY t.id, t.enqueued_at) l`,
    );
    const c = await h.check({ maxRetry: MAX_RETRY, allowedExitCodes: [42] });
    const { collateralArchived } = await h.one<{ collateralArchived: number }>(
      `SELECT count(*)::int AS "collateralArchived" FROM {{schema}}.tasks WHERE state = 'archived' AND type = 'tx'`,
    );
    report(h, c, 'F24 poison-task', {
      recovery_s: timeToArchiveS,
      executions: runs,
      time_to_archive_s: timeToArchiveS,
      worker_deaths: deaths,
      poison_state: row?.state,
      poison_retried: row?.retried,
      collateral_p50_ms: other?.p50,
      collateral_p99_ms: other?.p99,
      collateral_reruns: other?.rerun,
      collateral_archived: collateralArchived,
      notes:
        `poison task (process.exit(42) on every run), maxRetry ${MAX_RETRY}, 2 workers x 4 respawned by the harness, tx tasks at 10/s alongside; ` +
        `archived after ${runs} runs in ${timeToArchiveS} s (recovery_s = time to archive, ~4 x (L + C + R/2)); collateral = tx pickup p50/p99 ${other?.p50}/${other?.p99} ms, ${other?.rerun} tx tasks re-run because a death took them along, ${collateralArchived} archived with it`,
    });
    assert.ok(archived);
    assert.equal(row?.state, 'archived');
    assert.equal(row?.retried, MAX_RETRY, 'archived with retried = maxRetry, never reset');
    assert.equal(row?.error_msg, 'task lease expired');
    assert.equal(runs, MAX_RETRY + 1, `exactly maxRetry + 1 = ${MAX_RETRY + 1} executions`);
    assert.equal(deaths, MAX_RETRY + 1, 'each execution killed its worker');
    // A tx task claimed in the same batch as the poison dies with its worker, maybe before its handler
    // even started, and is rescued with it (a retry used). Rarely, one shares the poison's fate to the end.
    assert.ok(collateralArchived <= 3, `at most a batch of collateral archived (${collateralArchived})`);
    assert.ok((c.states.completed ?? 0) >= c.acked - collateralArchived, 'the other tasks completed');
  },
);
