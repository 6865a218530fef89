/**
 * A retryDelay whose value PostgreSQL cannot add to a timestamp (issue #26,
 * finding 6): 1e300 ms made the retry write fail "interval out of range", so
 * the task stayed active and the recoverer failed on every tick, never
 * recovering the other orphans of its batch. The delay is clamped to 1000
 * years, on both paths: the processor's failures and the recoverer's.
 */
import assert from 'node:assert/strict';
import { describe } from 'node:test';
import { Server, Task, type Logger } from '../src/index.js';
import { silentLogger } from '../src/internal/logger.js';
import { Recoverer } from '../src/server/recoverer.js';
import { StatsCollector } from '../src/server/stats.js';
import { setupDb, test, waitFor } from './helpers.js';

const { db, client, broker } = setupDb('t_trust_retry', { resetEach: true });

/** Delays a retryDelay gives that no timestamp holds, by task type; every other type waits 5 s. */
const HUGE: Record<string, number> = { huge: 1e300, max: Number.MAX_VALUE };
const retryDelay = (_n: number, _err: Error, task: Task) => HUGE[task.type] ?? 5000;

/** Years from now to the task's run_at (database clock). */
const state = async (id: string) =>
  (
    await db.query<{ state: string; retried: number; years: number | null }>(
      'SELECT state, retried, extract(epoch FROM run_at - now()) / (365.25 * 86400) AS years FROM {{schema}}.tasks WHERE id = $1',
      [id],
    )
  )[0];

/** A logger that keeps its warnings' messages. */
function warnings(): { logger: Logger; lines: string[] } {
  const lines: string[] = [];
  const logger: Logger = {
    ...silentLogger,
    warn: (_obj: object, msg?: string) => void lines.push(msg ?? ''),
    child: () => logger,
  };
  return { logger, lines };
}

describe('a retryDelay past what a timestamp holds', () => {
  test('the failed task goes to retry 1000 years ahead, not stuck active; warned once per type', { timeout: 30_000 }, async () => {
    const { logger, lines } = warnings();
    const server = new Server({
      connectionString: db.connectionString,
      schema: db.schema,
      logger,
      concurrency: 2,
      taskCheckInterval: 50,
      retryDelay,
    });
    await server.start(() => {
      throw new Error('fails');
    });
    try {
      const ids = [];
      for (const type of ['huge', 'huge', 'max']) ids.push((await client.enqueue(new Task(type), { maxRetry: 3 })).id);
      for (const id of ids) {
        const r = await waitFor(
          async () => {
            const x = await state(id);
            return x?.state === 'retry' ? x : undefined;
          },
          10_000,
          `${id} in retry`,
        );
        assert.equal(r.retried, 1);
        assert.ok(Math.abs((r.years ?? 0) - 1000) < 0.01, `run_at ${r.years} years ahead`);
      }
      const clamped = lines.filter((l) => /retryDelay returned/.test(l));
      assert.equal(clamped.length, 2, `one warning per task type: ${clamped.join(' | ')}`);
      assert.match(clamped.find((l) => l.includes('1e+300')) ?? '', /^retryDelay returned 1e\+300; waiting 1000 years, the longest delay/);
    } finally {
      await server.shutdown();
    }
  });

  test('a recoverer batch with such a task and an ordinary orphan recovers both', { timeout: 30_000 }, async () => {
    const orphan = async (type: string) => {
      const { id } = await client.enqueue(new Task(type), { maxRetry: 3, processIn: 3_600_000 });
      await db.query(
        `UPDATE {{schema}}.tasks SET state = 'active', run_at = NULL, lease_owner = 'gone', lease_token = gen_random_uuid(),
           lease_expires_at = now() - interval '1 hour' WHERE id = $1`,
        [id],
      );
      return id;
    };
    const huge = await orphan('huge');
    const plain = await orphan('plain');
    const recoverer = new Recoverer(
      broker,
      silentLogger,
      { recoverInterval: 60_000, recoverCutoff: 0, leaseDuration: 30_000, retryDelay },
      new StatsCollector(broker),
    );
    assert.deepEqual(await recoverer.runOnce(), { retried: 2, archived: 0 });
    const h = await state(huge);
    const p = await state(plain);
    assert.deepEqual([h?.state, h?.retried, p?.state, p?.retried], ['retry', 1, 'retry', 1]);
    assert.ok(Math.abs((h?.years ?? 0) - 1000) < 0.01, `run_at ${h?.years} years ahead`);
    assert.ok((p?.years ?? 1) * 365.25 * 86400 < 10, 'the ordinary orphan waits its 5 s');
  });
});
