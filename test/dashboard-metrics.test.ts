/**
 * The dashboard's /metrics against the Inspector (asynq's names, types and
 * labels), and metricsHandler() on a server of your own.
 */
import assert from 'node:assert/strict';
import { describe } from 'node:test';
import { metricsHandler, renderPrometheus, serverMetrics } from '../src/index.js';
import { http, setupDashboard } from './dashboard-kit.js';
import { test } from './helpers.js';

const { inspector, conn, port, seeded } = setupDashboard('t_dashboard_metrics');

/** Parses the text format strictly: every line is a comment of the right shape or a sample of a declared family. */
function parseMetrics(text: string): { types: Map<string, string>; samples: Map<string, number> } {
  const types = new Map<string, string>();
  const samples = new Map<string, number>();
  assert.ok(text.endsWith('\n'));
  for (const line of text.slice(0, -1).split('\n')) {
    let m = /^# (HELP|TYPE) ([a-zA-Z_:][a-zA-Z0-9_:]*) (.+)$/.exec(line);
    if (m) {
      if (m[1] === 'TYPE') {
        assert.match(m[3] as string, /^(gauge|counter)$/);
        types.set(m[2] as string, m[3] as string);
      }
      continue;
    }
    m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*",?)*\})? (-?[0-9.e+]+|NaN|[+-]Inf)$/.exec(line);
    assert.ok(m, `not a valid sample line: ${JSON.stringify(line)}`);
    assert.ok(types.has(m[1] as string), `sample before its TYPE: ${line}`);
    samples.set(`${m[1]}${m[2] ?? ''}`, Number(m[3]));
  }
  return { types, samples };
}

describe('/metrics', () => {
  test("asynq's names, types and labels; the numbers are the Inspector's", async () => {
    const r = await http(port.dash, 'GET', '/metrics');
    assert.equal(r.status, 200);
    assert.equal(r.headers['content-type'], 'text/plain; version=0.0.4; charset=utf-8');
    const { types, samples } = parseMetrics(r.body);
    assert.equal(types.get('asynq_tasks_enqueued_total'), 'gauge');
    assert.equal(types.get('asynq_tasks_processed_total'), 'counter');
    assert.equal(types.get('asynq_tasks_failed_total'), 'counter');
    for (const name of ['asynq_queue_size', 'asynq_queue_latency_seconds', 'asynq_queue_memory_usage_approx_bytes', 'asynq_queue_paused_total'])
      assert.equal(types.get(name), 'gauge', name);
    const get = (k: string) => {
      const v = samples.get(k);
      assert.notEqual(v, undefined, `missing ${k}`);
      return v as number;
    };
    for (const q of await inspector.queues()) {
      const info = await inspector.getQueueInfo(q);
      for (const state of ['active', 'pending', 'scheduled', 'retry', 'archived', 'completed'] as const) {
        assert.equal(get(`asynq_tasks_enqueued_total{queue="${q}",state="${state}"}`), info[state], `${q} ${state}`);
      }
      assert.equal(samples.has(`asynq_tasks_enqueued_total{queue="${q}",state="aggregating"}`), false, 'asynq exports no aggregating state');
      assert.equal(get(`asynq_queue_size{queue="${q}"}`), info.size);
      assert.equal(get(`asynq_tasks_processed_total{queue="${q}"}`), info.processedTotal);
      assert.equal(get(`asynq_tasks_failed_total{queue="${q}"}`), info.failedTotal);
      assert.equal(get(`asynq_queue_paused_total{queue="${q}"}`), info.paused ? 1 : 0);
      assert.equal(get(`pgasynq_tasks_aggregating{queue="${q}"}`), info.aggregating);
      assert.equal(samples.has(`asynq_tasks_enqueued_total{queue="${q}",state="waiting"}`), false, 'asynq exports no waiting state');
      assert.equal(get(`pgasynq_tasks_waiting{queue="${q}"}`), info.waiting);
      const latency = get(`asynq_queue_latency_seconds{queue="${q}"}`);
      assert.ok(Math.abs(latency - info.latency / 1000) < 5, `${q} latency ${latency} vs ${info.latency} ms`);
      const bytes = get(`asynq_queue_memory_usage_approx_bytes{queue="${q}"}`);
      assert.ok(info.size === 0 ? bytes === 0 : bytes >= info.size * 100, `${q} approx bytes ${bytes} for ${info.size} tasks`);
    }
    assert.equal(types.get('pgasynq_tasks_waiting'), 'gauge');
    assert.equal(get('pgasynq_tasks_waiting{queue="flow"}'), 3, 'b, c and d wait');
    assert.equal(get('pgasynq_tasks_waiting{queue="flow-act"}'), 5);
    assert.equal(get('pgasynq_tasks_waiting{queue="default"}'), 0);
    assert.equal(get('asynq_queue_size{queue="flow"}'), 4, 'a and the waiting tasks');
    assert.ok(get('asynq_queue_memory_usage_approx_bytes{queue="flow"}') >= 4 * 300, 'waiting tasks are counted in the estimate');
    assert.equal(get('pgasynq_tasks_orphaned{queue="critical"}'), 1, 'the seeded orphan');
    assert.equal(get('pgasynq_tasks_orphaned{queue="busy"}'), 0);
    const servers = await inspector.servers();
    assert.equal(get('pgasynq_servers'), servers.length);
    assert.equal(get('pgasynq_workers_busy'), 2);
    assert.equal(get('pgasynq_workers_capacity'), 2);
    assert.equal(get('pgasynq_scheduler_entries'), 1);
    assert.ok(get('pgasynq_active_task_oldest_age_seconds{queue="busy"}') >= 0);
  });

  test('metricsHandler() on your own server, with server.metrics() through `extra`', async () => {
    const handler = metricsHandler({ ...conn, extra: () => serverMetrics(seeded.server) });
    try {
      const text = await handler.collect();
      const { samples } = parseMetrics(text);
      assert.ok(samples.has(`pgasynq_tasks_claimed_total{server="${seeded.server.id}"}`));
      assert.equal(samples.get(`pgasynq_fenced_writes_total{server="${seeded.server.id}"}`), seeded.server.metrics().fencedWrites);
      assert.equal(samples.get(`pgasynq_leases_lost_total{server="${seeded.server.id}"}`), seeded.server.metrics().leasesLost);
      assert.ok(samples.has('asynq_queue_size{queue="default"}'));
    } finally {
      await handler.close();
    }
    assert.equal(
      renderPrometheus([{ name: 'x_total', help: 'a\\b\nc', type: 'counter', samples: [{ labels: { queue: 'q"\\\n' }, value: 1.5 }] }]),
      '# HELP x_total a\\\\b\\nc\n# TYPE x_total counter\nx_total{queue="q\\"\\\\\\n"} 1.5\n',
    );
    assert.throws(() => renderPrometheus([{ name: 'bad-name', help: '', type: 'gauge', samples: [] }]));
  });
});
