/**
 * /metrics' asynq_queue_latency_seconds, the number an autoscaler reads (the
 * README's KEDA and Prometheus recipes): the age of the oldest pending task,
 * in seconds, and 0 for a queue with nothing pending, equal to the
 * queue_stats view's latency_ms that KEDA's PostgreSQL scaler queries.
 */
import assert from 'node:assert/strict';
import { Task } from '../src/index.js';
import { collectMetrics } from '../src/dashboard/metrics.js';
import { setupDb, test } from './helpers.js';

const { db, client, inspector } = setupDb('t_dash_latency', { resetEach: true });

/** asynq_queue_latency_seconds of `queue` in one scrape. */
async function latency(queue: string): Promise<number> {
  const text = await collectMetrics(inspector);
  const m = new RegExp(`^asynq_queue_latency_seconds\\{queue="${queue}"\\} (\\S+)$`, 'm').exec(text);
  assert.ok(m, `no asynq_queue_latency_seconds for ${queue} in:\n${text}`);
  return Number(m[1]);
}

/** Makes task `id` pending since `seconds` ago. */
const pendingFor = (id: string, seconds: number) => db.query(`UPDATE {{schema}}.tasks SET run_at = now() - interval '${seconds} s' WHERE id = $1`, [id]);

test('asynq_queue_latency_seconds is the age of the oldest pending task, in seconds', async () => {
  const oldest = await client.enqueue(new Task('t', 1), { queue: 'slow' });
  const newer = await client.enqueue(new Task('t', 2), { queue: 'slow' });
  await pendingFor(oldest.id, 120);
  await pendingFor(newer.id, 30);
  // A queue whose only task is scheduled: nothing waits to run.
  await client.enqueue(new Task('t', 3), { queue: 'idle', processIn: 3_600_000 });
  await client.enqueue(new Task('t', 4), { queue: 'empty', processIn: 1000 });
  await db.query("DELETE FROM {{schema}}.tasks WHERE queue = 'empty'");

  const slow = await latency('slow');
  assert.ok(slow >= 119 && slow < 150, `the oldest pending task waits for 120 s: ${slow}`);
  assert.equal(await latency('idle'), 0, 'nothing pending: 0');
  assert.equal(await latency('empty'), 0, 'an empty queue: 0');

  // The view an autoscaler queries says the same, in ms.
  const [row] = await db.query("SELECT latency_ms, pending FROM {{schema}}.queue_stats WHERE queue = 'slow'");
  assert.equal(Number(row.pending), 2);
  assert.ok(Math.abs(row.latency_ms / 1000 - slow) < 5, `queue_stats.latency_ms ${row.latency_ms} vs ${slow} s`);

  // The oldest leaves pending: the latency is the next one's age.
  await inspector.deleteTask('slow', oldest.id);
  const next = await latency('slow');
  assert.ok(next >= 29 && next < 60, `the oldest left is 30 s old: ${next}`);
});
