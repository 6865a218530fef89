/**
 * What the dashboard's pages send, over HTTP: nothing of a payload with
 * hidePayloads, previews instead of whole rows on big tasks, invisible
 * characters escaped, and /api/overview's counts without payloads.
 */
import assert from 'node:assert/strict';
import { describe } from 'node:test';
import pg from 'pg';
import { Task, createDashboard } from '../src/index.js';
import { http, setupDashboard } from './dashboard-kit.js';
import { test } from './helpers.js';

const { db, client, inspector, port, seeded } = setupDashboard('t_dashboard_http_content');

describe('HTTP', () => {
  test('hide-payloads: no payload, result or worker payload leaves the server', async () => {
    const pages = [
      '/queues/default?state=pending',
      '/queues/default/tasks/mail-07',
      '/queues/critical?state=completed',
      '/queues/critical/tasks/hook-4',
      '/queues/low/tasks/blob',
      '/queues/flow?state=waiting',
      '/queues/flow/tasks/a',
      '/queues/flow/tasks/b',
      '/servers',
      '/schedulers',
      '/api/overview',
    ];
    // Headers, last errors and results often repeat what the payload held: hidden too.
    pages.push(
      '/queues/critical?state=retry',
      '/queues/critical?state=archived',
      '/queues/critical/tasks/hook-0',
      '/queues/critical/tasks/hook-2',
      '/queues/low/tasks/xss',
    );
    for (const path of pages) {
      const r = await http(port.hid, 'GET', path);
      assert.equal(r.status, 200, path);
      for (const secret of [
        'user7@example.com',
        'user0@example.com',
        '"status"',
        '&quot;status&quot;',
        '68 65 6c 6c 6f',
        'kind',
        '&quot;n&quot;',
        'HTTP 503',
        'from upstream',
        'connection refused',
        'x-request-id',
        'req-7',
        'onload',
        'flow-secret',
      ]) {
        assert.ok(!r.body.includes(secret), `${path} leaks ${secret}`);
      }
    }
    for (const path of ['/queues/default/tasks/mail-07', '/queues/critical/tasks/hook-0', '/queues/critical?state=retry']) {
      assert.match((await http(port.hid, 'GET', path)).body, /hidden/i, `${path} says what it hides`);
    }
    assert.match((await http(port.dash, 'GET', '/queues/default/tasks/mail-07')).body, /user7@example\.com/, 'shown without the flag');
    assert.match((await http(port.dash, 'GET', '/queues/default/tasks/mail-07')).body, /req-7/, 'headers shown without the flag');
    assert.match((await http(port.dash, 'GET', '/queues/critical?state=retry')).body, /HTTP 503/, 'errors shown without the flag');
    // A dependency's name is no content: the waiting tab and the task page still link it.
    assert.match((await http(port.hid, 'GET', '/queues/flow?state=waiting')).body, /href="\/queues\/flow\/tasks\/a"/);
    assert.match((await http(port.hid, 'GET', '/queues/flow/tasks/a')).body, /href="\/queues\/flow\/tasks\/b"/);
  });

  test('list pages and /metrics read previews and sizes, not whole rows: a page over 0.6 MB payloads stays small', { timeout: 120_000 }, async () => {
    // Bytes the dashboard's own pool reads from PostgreSQL, over every connection it opened.
    const pool = new pg.Pool({ connectionString: db.connectionString, max: 4 });
    const clients: pg.PoolClient[] = [];
    pool.on('connect', (c) => void clients.push(c));
    const bytesRead = () => clients.reduce((n, c) => n + (c as unknown as { connection: { stream: { bytesRead: number } } }).connection.stream.bytesRead, 0);
    const big = createDashboard({ pool, schema: db.schema });
    const blob = 'x'.repeat(600_000);
    const ids = (from: number, to: number) => Array.from({ length: to - from }, (_, i) => `big-${from + i}`);
    await client.enqueueMany(ids(0, 30).map((id) => new Task('big:blob', { blob, id }, { queue: 'big', taskId: id, headers: { h: blob.slice(0, 50_000) } })));
    await db.query(
      `UPDATE {{schema}}.tasks SET state = 'retry', run_at = now() + interval '1 hour', retried = 1, error_msg = repeat('e', 600000), last_failed_at = now() WHERE queue = 'big' AND id = ANY($1)`,
      [ids(15, 20)],
    );
    await db.query(
      `UPDATE {{schema}}.tasks SET state = 'completed', completed_at = now(), run_at = now() + interval '1 day', result = payload WHERE queue = 'big' AND id = ANY($1)`,
      [ids(20, 25)],
    );
    // Active, leased to the live server (its heartbeat does not know them; the lease outlasts the test).
    await db.query(
      `UPDATE {{schema}}.tasks SET state = 'active', lease_owner = $2, lease_expires_at = now() + interval '1 hour', lease_token = gen_random_uuid(), started_at = now() WHERE queue = 'big' AND id = ANY($1)`,
      [ids(25, 30), seeded.server.id],
    );
    try {
      const p = (await big.listen(0)).port;
      for (const path of [
        '/queues/big?state=pending&size=1000',
        '/queues/big?state=retry&size=1000',
        '/queues/big?state=completed&size=1000',
        '/queues/big?state=active&size=1000',
        '/queues/big?state=pending&search=blob',
        '/servers',
        '/metrics',
      ]) {
        const before = bytesRead();
        const r = await http(p, 'GET', path);
        const read = bytesRead() - before;
        assert.equal(r.status, 200, `${path}: ${r.body.slice(0, 300)}`);
        assert.ok(read < 1_000_000, `${path} read ${read} bytes from PostgreSQL`);
        assert.ok(r.body.length < 500_000, `${path} sent ${r.body.length} characters`);
      }
      assert.match((await http(p, 'GET', '/queues/big?state=pending')).body, /big-0/, 'the rows are there');
    } finally {
      await big.close();
      await pool.end();
      await db.query(`DELETE FROM {{schema}}.tasks WHERE queue = 'big'`);
      await db.query(`DELETE FROM {{schema}}.queues WHERE name = 'big'`);
    }
  });

  test('invisible and direction characters in types, headers and payloads are shown as \\u{…} escapes, never raw', async () => {
    const RLO = '\u202E';
    const ZWSP = '\u200B';
    await client.enqueue(new Task(`invoice${RLO}fdp.exe`, { note: `a${ZWSP}b` }, { queue: 'bidi', taskId: 'bidi-1', headers: { [`h${ZWSP}`]: `v${RLO}` } }));
    try {
      const raw = /[\u061C\u200B-\u200F\u202A-\u202E\u2060-\u2069\uFEFF]/;
      for (const path of ['/queues/bidi?state=pending', '/queues/bidi/tasks/bidi-1', '/']) {
        const r = await http(port.dash, 'GET', path);
        assert.equal(r.status, 200, path);
        assert.doesNotMatch(r.body, raw, `${path} holds a raw invisible character`);
      }
      const list = (await http(port.dash, 'GET', '/queues/bidi?state=pending')).body;
      assert.ok(list.includes('invoice\\u{202E}fdp.exe'), 'the type, its override shown');
      assert.ok(list.includes('a\\u{200B}b'), 'the payload preview');
      const task = (await http(port.dash, 'GET', '/queues/bidi/tasks/bidi-1')).body;
      assert.ok(task.includes('invoice\\u{202E}fdp.exe') && task.includes('h\\u{200B}') && task.includes('v\\u{202E}'), 'type and headers on the task page');
    } finally {
      await inspector.deleteTask('bidi', 'bidi-1');
      await inspector.deleteQueue('bidi');
    }
  });

  test('/api/overview: counts and samples, no payloads', async () => {
    const r = await http(port.dash, 'GET', '/api/overview');
    assert.match(String(r.headers['content-type']), /^application\/json/);
    const j = JSON.parse(r.body) as { queues: { queue: string; pending: number }[]; samples: unknown[] };
    const info = await inspector.getQueueInfo('default');
    assert.equal(j.queues.find((q) => q.queue === 'default')?.pending, info.pending);
    assert.ok(j.samples.length >= 1);
    assert.doesNotMatch(r.body, /payload|example\.com/);
  });
});
