/**
 * Readers trust nothing they read (issue #26, findings 9 and 10). The
 * validators keep bad instants and control characters out of what the
 * library writes, but SQL `enqueue()`, the owner and hand-written rows can
 * still store year 280000 or an error holding "ESC]0;…BEL". Rows like that
 * are written here directly, as the owner, and every reader must still
 * answer: the CLI (`task ls`, `task inspect`, `server ls`, `cron ls`, with and
 * without --json) and the dashboard's lists and task pages, an instant it
 * cannot show as "—" and a control character as an escape, never raw.
 */
import assert from 'node:assert/strict';
import { request } from 'node:http';
import { after, before, describe } from 'node:test';
import { Client, Task, createDashboard, type Dashboard } from '../src/index.js';
import { DATABASE_URL, runCli, test, testDb, type TestDb } from './helpers.js';

let db: TestDb;
let client: Client;
let dash: Dashboard;
let port: number;

const HOUR = 3_600_000;
/** Sets the window title in most terminals: ESC ] 0 ; text BEL. */
const TITLE = '\u001b]0;pwned\u0007';
/** What the terminal would obey: C0 and C1 controls (ESC, BEL, CSI U+009B…). */
const RAW_CONTROL = /[\u0000-\u0009\u000b-\u001f\u007f-\u009f]/;

function get(path: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, path, headers: { host: `127.0.0.1:${port}` } }, (res) => {
      let body = '';
      res.setEncoding('utf8').on('data', (c: string) => (body += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on('error', reject);
    req.end();
  });
}

const cli = (...args: string[]) => runCli(['--database-url', DATABASE_URL, '--schema', db.schema, ...args]);

/** The seq of a task, to write its rows by hand. */
async function seqOf(queue: string, id: string): Promise<string> {
  const [r] = await db.query<{ seq: string }>('SELECT seq FROM {{schema}}.task_inputs WHERE queue = $1 AND id = $2', [queue, id]);
  assert.ok(r, `${queue}/${id} exists`);
  return r.seq;
}

before(async () => {
  db = await testDb('trust_readers');
  client = new Client({ connectionString: DATABASE_URL, schema: db.schema, logger: false });
  dash = createDashboard({ connectionString: DATABASE_URL, schema: db.schema, logger: false });
  port = (await dash.listen(0)).port;

  // Year 280000: past what a JavaScript Date holds (pg hands it over as an Invalid Date).
  await client.enqueue(new Task('far:due'), { queue: 'far', taskId: 'far-due', processIn: HOUR, deadline: new Date(Date.now() + 2 * HOUR) });
  const due = await seqOf('far', 'far-due');
  await db.query(`UPDATE {{schema}}.task_states SET run_at = '280000-01-01' WHERE seq = $1`, [due]);
  await db.query(`UPDATE {{schema}}.task_inputs SET deadline = '280000-01-01' WHERE seq = $1`, [due]);
  // Completed, kept 200,000 years: its end of retention is past a Date's range too.
  await client.enqueue(new Task('far:kept'), { queue: 'far', taskId: 'far-kept', processIn: HOUR });
  const kept = await seqOf('far', 'far-kept');
  await db.query(`UPDATE {{schema}}.task_inputs SET retention = interval '200000 years' WHERE seq = $1`, [kept]);
  await db.query(`UPDATE {{schema}}.task_states SET state = 'completed', completed_at = now(), run_at = now() + interval '200000 years' WHERE seq = $1`, [
    kept,
  ]);

  // Control characters where the validators refuse them: the type, header keys and values, the payload, the error.
  await client.enqueue(new Task('esc:ok', { p: 1 }), { queue: 'esc', taskId: 'esc-1', processIn: HOUR });
  const esc = await seqOf('esc', 'esc-1');
  await db.query(`UPDATE {{schema}}.task_inputs SET type = $2, headers = $3::jsonb, payload = $4::jsonb WHERE seq = $1`, [
    esc,
    `evil${TITLE}type`,
    JSON.stringify({ [`k\u001b[2J`]: `v${TITLE}\u009b31m` }),
    JSON.stringify({ p: `x\u009b31m${TITLE}` }),
  ]);
  await db.query(`UPDATE {{schema}}.task_states SET state = 'archived', run_at = now(), last_failed_at = now(), error_msg = $2 WHERE seq = $1`, [
    esc,
    `boom ${TITLE}\nsecond line\u009b31m`,
  ]);
  await db.query(
    `INSERT INTO {{schema}}.servers (id, host, pid, concurrency, queues, strict_priority, status, expires_at)
     VALUES ('srv-esc', $1, 42, 4, $2::jsonb, false, 'active', now() + interval '1 hour')`,
    [`host${TITLE}`, JSON.stringify({ [`q${TITLE}`]: 1 })],
  );
  await db.query(
    `INSERT INTO {{schema}}.scheduler_entries (id, spec, task_type, options, scheduler_id, next_run_at, expires_at)
     VALUES ('entry-esc', $1, $2, $3::jsonb, 'sch-esc', now() + interval '1 hour', now() + interval '1 hour')`,
    [`@every 1h${TITLE}`, `cron${TITLE}`, JSON.stringify({ headers: { [`h${TITLE}`]: `v${TITLE}` } })],
  );
});

after(async () => {
  await dash.close();
  await client.close();
  await db.close();
});

describe('instants no Date can hold (finding 9)', () => {
  for (const args of [
    ['task', 'ls', '--queue', 'far', '--state', 'scheduled'],
    ['task', 'inspect', 'far', 'far-due'],
    ['--json', 'task', 'inspect', 'far', 'far-due'],
    ['task', 'ls', '--queue', 'far', '--state', 'completed'],
    ['task', 'inspect', 'far', 'far-kept'],
  ]) {
    test(`pgasynq ${args.join(' ')}: answers${args.includes('far-kept') ? '' : ', with "—" for the instant'}`, async () => {
      const r = await cli(...args);
      assert.equal(r.code, 0, r.stderr);
      // The CLI shows no end of retention: the completed task only has to answer.
      if (!args.includes('completed') && !args.includes('far-kept')) assert.match(r.stdout, args[0] === '--json' ? /"nextProcessAt":null/ : /—/);
      assert.doesNotMatch(r.stdout + r.stderr, /NaN|Invalid/);
    });
  }

  test('pgasynq task inspect far far-due: next process at and deadline are "—"', async () => {
    const r = await cli('task', 'inspect', 'far', 'far-due');
    assert.match(r.stdout, /^next process at: +—$/m);
    assert.match(r.stdout, /^deadline: +—$/m);
  });

  for (const path of ['/queues/far?state=scheduled', '/queues/far/tasks/far-due', '/queues/far?state=completed', '/queues/far/tasks/far-kept', '/']) {
    test(`dashboard ${path}: 200, with "—" for the instant`, async () => {
      const r = await get(path);
      assert.equal(r.status, 200, r.body.slice(0, 500));
      if (path !== '/') assert.match(r.body, /—/);
      assert.doesNotMatch(r.body, /NaN|Invalid (time|Date)/);
    });
  }
});

describe('control characters from the database reach the terminal escaped (finding 10)', () => {
  for (const args of [
    ['task', 'ls', '--queue', 'esc', '--state', 'archived'],
    ['task', 'inspect', 'esc', 'esc-1'],
    ['--json', 'task', 'inspect', 'esc', 'esc-1'],
    ['--json', 'task', 'ls', '--queue', 'esc', '--state', 'archived'],
    ['server', 'ls'],
    ['--json', 'server', 'ls'],
    ['cron', 'ls'],
    ['--json', 'cron', 'ls'],
  ]) {
    test(`pgasynq ${args.join(' ')}: no raw control character, the escapes shown`, async () => {
      const r = await cli(...args);
      assert.equal(r.code, 0, r.stderr);
      assert.doesNotMatch(r.stdout, RAW_CONTROL);
      assert.doesNotMatch(r.stderr, RAW_CONTROL);
      assert.ok(r.stdout.includes('\\u001b]0;pwned\\u0007'), r.stdout);
      if (args[0] === '--json') JSON.parse(r.stdout); // still JSON
    });
  }

  test('task inspect shows the type, header, payload and error escaped, the error on one line', async () => {
    const r = await cli('task', 'inspect', 'esc', 'esc-1');
    assert.match(r.stdout, /^type: +evil\\u001b\]0;pwned\\u0007type$/m);
    assert.match(r.stdout, /^last error: +boom \\u001b\]0;pwned\\u0007\\u000asecond line\\u009b31m$/m);
    assert.ok(r.stdout.includes('\\u009b31m'), 'a C1 control in the payload and headers, escaped');
    assert.ok(r.stdout.includes('k\\u001b[2J'), 'a header key');
  });

  test('--json keeps the values: the escapes decode to what the row holds', async () => {
    const r = await cli('--json', 'task', 'inspect', 'esc', 'esc-1');
    const info = JSON.parse(r.stdout) as { type: string; lastError: string; headers: Record<string, string> };
    assert.equal(info.type, `evil${TITLE}type`);
    assert.equal(info.lastError, `boom ${TITLE}\nsecond line\u009b31m`);
    assert.deepEqual(info.headers, { [`k\u001b[2J`]: `v${TITLE}\u009b31m` });
  });

  test('an error message holding controls (a refused --state, quoted by commander) is escaped on stderr', async () => {
    const r = await cli('task', 'ls', '--queue', 'q', '--state', `x${TITLE}`);
    assert.equal(r.code, 2);
    assert.doesNotMatch(r.stderr, RAW_CONTROL);
    assert.match(r.stderr, /\\u001b/);
  });
});
