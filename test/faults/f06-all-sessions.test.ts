/**
 * F06 all-sessions-terminated (plan §5.2): under load, pg_terminate_backend
 * on every `pgasynq:%` backend at once (server pools, LISTEN connections and
 * the producer's client), three times, 4 s apart. Workers must recover
 * without a restart; the producer may see errors, but each must be an
 * explicit rejection of enqueue() (an acknowledged task is never dropped,
 * which the acknowledgement log checks).
 */
import assert from 'node:assert/strict';
import { sleep, waitFor } from './harness.js';
import { faultTest, report } from './kit.js';

const MAX_RETRY = 3;
const ROUNDS = 3;

faultTest(
  'F06 all-sessions-terminated: every pgasynq session killed 3 times under load; no loss, workers recover on their own',
  { schema: 'f06', timeout: 150_000 },
  async (h) => {
    const workers = await Promise.all([
      h.spawnWorker('w1', { concurrency: 4, sleepMin: 100, sleepMax: 500 }),
      h.spawnWorker('w2', { concurrency: 4, sleepMin: 100, sleepMax: 500 }),
    ]);
    h.startSampler();
    const producer = await h.spawnProducer({ count: 240, rate: 16, maxRetry: MAX_RETRY });
    await waitFor(async () => Object.keys(await h.openStarts()).length === 2, 30_000, 'both workers running tasks', 50);
    const killed: number[] = [];
    let lastKillAt = new Date();
    for (let i = 0; i < ROUNDS; i++) {
      await sleep(i === 0 ? 1000 : 4000);
      lastKillAt = await h.dbNow();
      killed.push(await h.terminate('pgasynq:%'));
    }
    // Throughput back: the first effect committed after the last termination.
    const tLast = performance.now();
    await waitFor(
      async () => (await h.query('SELECT 1 FROM {{schema}}.h_effects WHERE at > $1 LIMIT 1', [lastKillAt])).length > 0,
      30_000,
      'a completion after the last termination',
      100,
    );
    const throughputRecovery = Math.round((performance.now() - tLast) / 100) / 10;
    await h.settle(90_000);

    const errors = producer.events.filter((e) => e.event === 'error');
    const errorIds = errors.map((e) => e.id as string);
    const { committed } = await h.one<{ committed: number }>('SELECT count(*)::int AS committed FROM {{schema}}.tasks WHERE id = ANY($1)', [errorIds]);
    // Each worker claimed again after the last termination, in the same process.
    const after = await h.query<{ worker: string }>("SELECT DISTINCT worker FROM {{schema}}.h_exec WHERE phase = 'start' AND at > $1", [lastKillAt]);
    const c = await h.check({ maxRetry: MAX_RETRY });
    report(h, c, 'F06 all-sessions-terminated', {
      recovery_s: throughputRecovery,
      backends_terminated: killed,
      producer_errors: errors.length,
      producer_errors_committed_anyway: committed,
      producer_error_codes: [...new Set(errors.map((e) => e.code ?? e.message))].slice(0, 5),
      workers_claiming_after: after.length,
      notes: `${ROUNDS} x terminate every pgasynq:% backend (${killed.join('+')}), 4 s apart, producer at 16/s; recovery_s = last termination to the next committed effect; producer errors are rejected enqueues (never acked)`,
    });
    assert.ok(
      killed.every((n) => n > 0),
      'each round terminated backends',
    );
    assert.equal(after.length, workers.length, 'every worker claimed again without a restart');
    for (const e of errors) assert.ok(typeof e.message === 'string' && e.message.length > 0, 'each producer error is an explicit rejection');
    assert.equal(producer.events.find((e) => e.event === 'done')?.acked, c.acked, 'the producer acknowledged exactly what the log holds');
  },
);
