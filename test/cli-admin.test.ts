/**
 * The Inspector commands of the `pgasynq` CLI (stats, queue, task, group,
 * server, cron), run as child processes exactly as users run them: the human
 * tables, `--json` parsed and compared with what the Inspector returns, exit
 * codes, and the rows the actions change.
 *
 * Every child costs more than a second of CPU (tsx), so cases run
 * concurrently (first everything that only reads, and the exit codes; then
 * the actions, each on its own queue) while at most a few children run at
 * once: more only makes them fight for the CPU.
 */
import assert from 'node:assert/strict';
import { availableParallelism } from 'node:os';
import { after, before, describe } from 'node:test';
import { Client, Inspector, Task, type TaskInfo } from '../src/index.js';
import { DATABASE_URL, runCli, testDb, testWithin, type TestDb } from './helpers.js';

/** The CLI runs as a process per command, several per test: more than a minute under a loaded machine. */
const test = testWithin(180_000);

const UNREACHABLE = 'postgres://u:secret@127.0.0.1:1/x';

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

const MAX_CHILDREN = availableParallelism() + 1;
let running = 0;
const waiting: (() => void)[] = [];

/** Runs the CLI; DATABASE_URL is unset in the child unless `env` sets it. */
async function cli(args: string[], env: Record<string, string> = {}): Promise<Run> {
  if (running < MAX_CHILDREN) running++;
  else await new Promise<void>((resolve) => waiting.push(resolve)); // a finishing child hands its slot over
  try {
    return await spawnCli(args, env);
  } finally {
    const next = waiting.shift();
    if (next) next();
    else running--;
  }
}

function spawnCli(args: string[], env: Record<string, string>): Promise<Run> {
  return runCli(args, env);
}

let db: TestDb;
let client: Client;
let inspector: Inspector;

/** `pgasynq --database-url <test db> --schema <test schema> ...args` */
const pgasynq = (...args: string[]) => cli(['--database-url', DATABASE_URL, '--schema', db.schema, ...args]);

function ok(r: Run): string {
  assert.equal(r.code, 0, `exit ${r.code}; stderr: ${r.stderr}`);
  assert.equal(r.stderr, '');
  assert.doesNotMatch(r.stdout, /\x1b\[/, 'no colours when stdout is not a terminal');
  return r.stdout;
}

/** `pgasynq --json ...args`, parsed. */
async function json<T = unknown>(...args: string[]): Promise<T> {
  return JSON.parse(ok(await pgasynq('--json', ...args))) as T;
}

/** A failure: exit `code`, `error: <message>` on one line of stderr (two for usage: the help hint), nothing on stdout. */
function fails(r: Run, code: 1 | 2, message: RegExp): void {
  assert.equal(r.code, code, `exit ${r.code}; stdout: ${r.stdout}; stderr: ${r.stderr}`);
  assert.equal(r.stdout, '');
  assert.match(r.stderr, /^error: [^\n]+\n/);
  if (code === 1) assert.match(r.stderr, /^error: [^\n]+\n$/, `one line: ${JSON.stringify(r.stderr)}`);
  assert.match(r.stderr, message);
  assert.doesNotMatch(r.stderr, /\bat .*\.ts:\d+/, 'no stack trace');
}

/** What JSON.stringify makes of a value, as the CLI prints it. */
const plain = (v: unknown): unknown => JSON.parse(JSON.stringify(v));
/** Drops the fields that change from one call to the next (latency, snapshot time). */
const stable = ({ latency: _l, timestamp: _t, ...rest }: { latency: unknown; timestamp: unknown }) => rest;
/** A pending task's nextProcessAt is "now": not comparable between two calls. */
const unclock = (tasks: unknown) => (tasks as TaskInfo[]).map((t) => (t.state === 'pending' ? { ...t, nextProcessAt: 'now' } : t));

const put = (queue: string, id: string, extra: Record<string, unknown> = {}, payload: unknown = { id }) =>
  client.enqueue(new Task('job', payload), { queue, taskId: id, ...extra });
/** Rewrites a row's state with the columns that state needs. */
const force = (queue: string, id: string, set: string) => db.query(`UPDATE {{schema}}.tasks SET ${set} WHERE queue = $1 AND id = $2`, [queue, id]);
const ACTIVE = (owner: string) =>
  `state = 'active', run_at = NULL, lease_owner = '${owner}', lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 hour', started_at = now()`;
/** A relative time in the past, however slow the machine ("3s ago", "1m2s ago", "just now"); one about an hour ahead. */
const AGO = String.raw`(?:\S+ ago|just now)`;
const IN_AN_HOUR = String.raw`in (?:1h0m|\d+m\d+s)`;
const RETRY = "state = 'retry', run_at = now() + interval '1 hour', retried = 1, error_msg = 'boom', last_failed_at = now()";
const ARCHIVED = "state = 'archived', run_at = now(), retried = 3, error_msg = 'dead', last_failed_at = now()";
const stateOf = async (queue: string, id: string) =>
  (await db.query<{ state: string }>('SELECT state FROM {{schema}}.tasks WHERE queue = $1 AND id = $2', [queue, id]))[0]?.state ?? 'gone';
const countsOf = async (queue: string) =>
  Object.fromEntries(
    (await db.query<{ state: string; n: number }>('SELECT state, count(*)::int AS n FROM {{schema}}.tasks WHERE queue = $1 GROUP BY state', [queue])).map(
      (r) => [r.state, r.n],
    ),
  );

before(async () => {
  db = await testDb('t_cli_admin');
  client = new Client({ connectionString: db.connectionString, schema: db.schema });
  inspector = new Inspector({ connectionString: db.connectionString, schema: db.schema });

  // "reads": a task in every state, three aggregating in two groups; "reads_low": paused, a binary payload.
  await put('reads', 'p1');
  await put('reads', 'p2');
  await force('reads', 'p1', "run_at = now() - interval '5 s'");
  await put('reads', 'sch', { processIn: 3_600_000 });
  await put('reads', 'ret');
  await force('reads', 'ret', RETRY);
  await put('reads', 'arc');
  await force('reads', 'arc', ARCHIVED);
  await put('reads', 'com', { retention: 3_600_000 });
  await force('reads', 'com', `state = 'completed', completed_at = now(), run_at = now() + interval '1 hour', result = '{"rows":3}'`);
  await put('reads', 'act', { timeout: 3_600_000 });
  await force('reads', 'act', ACTIVE('srv-1'));
  await put('reads', 'agg1', { group: 'g1' });
  await put('reads', 'agg2', { group: 'g1' });
  await put('reads', 'agg3', { group: 'g2' });
  await put('reads_low', 'bin', {}, Buffer.from('binary'));
  await inspector.pauseQueue('reads_low');
  await db.query(
    "INSERT INTO {{schema}}.daily_stats VALUES ('reads', (now() AT TIME ZONE 'UTC')::date, 7, 2), ('reads', (now() AT TIME ZONE 'UTC')::date - 1, 100, 50)",
  );
  await db.query(
    `INSERT INTO {{schema}}.servers (id, host, pid, concurrency, queues, strict_priority, status, expires_at)
     VALUES ('srv-1', 'worker-1', 4242, 10, '{"reads": 2, "reads_low": 1}', false, 'active', now() + interval '1 hour')`,
  );
  await db.query(
    `INSERT INTO {{schema}}.scheduler_entries (id, spec, task_type, payload, options, scheduler_id, next_run_at, prev_run_at, expires_at)
     VALUES ('e1', '@every 30s', 'report', '{"k":1}', '{"queue":"reads"}', 's1', now() + interval '1 hour', now(), now() + interval '1 hour')`,
  );
  await db.query(
    "INSERT INTO {{schema}}.scheduler_events (entry_id, tick_at, task_id, enqueued_at) SELECT 'e1', now() - i * interval '30 s', 'task' || i, now() - i * interval '30 s' FROM generate_series(1, 35) i",
  );
});

after(async () => {
  await inspector.close();
  await client.close();
  await db.close();
});

// Nothing here changes a row: every case runs at once.
describe('reading and refusing', { concurrency: true }, () => {
  describe('reads', { concurrency: true }, () => {
    test('stats: --json is getQueueInfo of every queue; the table has counts, latency, today, paused, and a bar per state', async () => {
      const [stats, text] = await Promise.all([json<{ latency: number; timestamp: string }[]>('stats'), pgasynq('stats')]);
      const truth = await Promise.all((await inspector.queues()).map((q) => inspector.getQueueInfo(q)));
      assert.deepEqual(stats.map(stable), (plain(truth) as { latency: number; timestamp: string }[]).map(stable));
      assert.ok(stats[0]!.latency >= 5000, `latency of reads ${stats[0]!.latency}`);

      const out = ok(text);
      assert.match(
        out,
        /^queue\s+active\s+pending\s+waiting\s+aggregating\s+scheduled\s+retry\s+archived\s+completed\s+size\s+latency\s+processed\s+failed\s+paused$/m,
      );
      assert.match(out, /^reads\s+1\s+2\s+0\s+3\s+1\s+1\s+1\s+1\s+10\s+(\d+m)?\d+(\.\d)?s\s+7\s+2\s+no$/m);
      assert.match(out, /^reads_low\s+0\s+1\s+0\s+0\s+0\s+0\s+0\s+0\s+1\s+\S+\s+0\s+0\s+yes$/m);
      assert.match(out, /^Tasks by state \(all queues\)$/m);
      assert.match(out, /^pending\s+3\s+█{40}$/m, 'the largest count has the full bar');
      assert.match(out, /^aggregating\s+3\s+█{40}$/m);
      assert.match(out, /^active\s+1\s+█{13}$/m);
      assert.match(out, /^processed\s+failed\s+error rate\n-+\s+-+\s+-+\n\s+7\s+2\s+28\.57%$/m);
    });

    test('queue ls', async () => {
      const [names, text] = await Promise.all([json('queue', 'ls'), pgasynq('queue', 'list')]);
      assert.deepEqual(names, await inspector.queues());
      assert.deepEqual(names, ['reads', 'reads_low']);
      assert.equal(ok(text), 'reads\nreads_low\n');
    });

    test('queue inspect', async () => {
      const [info, text] = await Promise.all([json<{ latency: number; timestamp: string }>('queue', 'inspect', 'reads'), pgasynq('queue', 'inspect', 'reads')]);
      assert.deepEqual(stable(info), stable(plain(await inspector.getQueueInfo('reads')) as { latency: number; timestamp: string }));
      const out = ok(text);
      for (const line of [/^queue:\s+reads$/m, /^paused:\s+no$/m, /^size:\s+10$/m, /^groups:\s+2$/m, /^latency:\s+(\d+m)?\d+(\.\d)?s$/m])
        assert.match(out, line);
      assert.match(out, /^processed:\s+7 today \(UTC\), 0 in all$/m);
      assert.match(out, /^failed:\s+2 today \(UTC\), 0 in all$/m);
      assert.match(out, /^error rate:\s+28\.57% today$/m);
      assert.match(out, /^aggregating\s+3\s+█{40}$/m);
      assert.match(out, /^archived\s+1\s+█{13}$/m);
    });

    test('queue history: --days (7 by default), today first', async () => {
      const [days, text] = await Promise.all([json<unknown[]>('queue', 'history', 'reads'), pgasynq('queue', 'history', 'reads', '--days', '3')]);
      assert.equal(days.length, 7);
      assert.deepEqual(days, plain(await inspector.history('reads', 7)));
      const lines = ok(text).trimEnd().split('\n');
      assert.equal(lines.length, 2 + 3);
      assert.match(lines[0]!, /^date \(UTC\)\s+processed\s+failed\s+error rate$/);
      const today = new Date().toISOString().slice(0, 10);
      assert.match(lines[2]!, new RegExp(`^${today}\\s+7\\s+2\\s+28\\.57%$`));
      assert.match(lines[3]!, /^\d{4}-\d{2}-\d{2}\s+100\s+50\s+50\.00%$/);
      assert.match(lines[4]!, /^\d{4}-\d{2}-\d{2}\s+0\s+0\s+N\/A$/);
    });

    test('task ls --json: what the matching Inspector list method returns', async () => {
      const cases: [string[], () => Promise<TaskInfo[]>, string[]][] = [
        [['-s', 'pending', '--page', '2', '--size', '1'], () => inspector.listPendingTasks('reads', { page: 2, pageSize: 1 }), ['p2']],
        [['-s', 'active'], () => inspector.listActiveTasks('reads'), ['act']],
        [['-s', 'scheduled'], () => inspector.listScheduledTasks('reads'), ['sch']],
        [['-s', 'completed'], () => inspector.listCompletedTasks('reads'), ['com']],
        [['--state', 'aggregating', '--group', 'g1'], () => inspector.listAggregatingTasks('reads', 'g1'), ['agg1', 'agg2']],
      ];
      const runs = await Promise.all(cases.map(([args]) => json<TaskInfo[]>('task', 'ls', '--queue', 'reads', ...args)));
      for (const [i, [args, truth, ids]] of cases.entries()) {
        assert.deepEqual(unclock(runs[i]), unclock(plain(await truth())), args.join(' '));
        assert.deepEqual(
          runs[i]!.map((t) => t.id),
          ids,
          args.join(' '),
        );
      }
    });

    test('task ls: a table with the columns of the state (retry and archived: only here)', async () => {
      const [retry, archived, low] = await Promise.all([
        pgasynq('task', 'ls', '-q', 'reads', '-s', 'retry'),
        pgasynq('task', 'ls', '-q', 'reads', '-s', 'archived'),
        pgasynq('task', 'list', '-q', 'reads_low', '-s', 'pending', '--size', '1'),
      ]);
      assert.match(ok(retry), /^id\s+type\s+payload\s+next retry\s+retried\s+last failed\s+last error\n-+/);
      assert.match(ok(retry), new RegExp(String.raw`^ret\s+job\s+\{"id":"ret"\}\s+${IN_AN_HOUR}\s+1/25\s+${AGO}\s+boom$`, 'm'));
      assert.equal(ok(retry).split('\n').length, 4, 'the header, the rule, one task');
      const lines = ok(archived).split('\n');
      assert.match(lines[0]!, /^id\s+type\s+payload\s+retried\s+last failed\s+last error$/);
      assert.match(lines[2]!, new RegExp(String.raw`^arc\s+job\s+\{"id":"arc"\}\s+3/25\s+${AGO}\s+dead$`));
      assert.equal(lines.length, 4);
      assert.match(ok(low), /^bin\s+job\s+<6 bytes>\s+0\/25$/m);
      assert.match(ok(low), /^\(page 1; there may be more: --page 2\)$/m, 'a full page says so');
    });

    test('task ls without --state: a page of every state, in the order of stats, each under its heading and count', async () => {
      const [all, paged, text, small, g1] = await Promise.all([
        json<Record<string, TaskInfo[]>>('task', 'ls', '-q', 'reads'),
        json<Record<string, TaskInfo[]>>('task', 'ls', '-q', 'reads', '--page', '2', '--size', '1'),
        pgasynq('task', 'ls', '-q', 'reads'),
        pgasynq('task', 'ls', '-q', 'reads', '--size', '1'),
        pgasynq('task', 'ls', '-q', 'reads', '-g', 'g1'),
      ]);
      const order = ['active', 'pending', 'waiting', 'aggregating', 'scheduled', 'retry', 'archived', 'completed'];
      assert.deepEqual(Object.keys(all), order, 'keyed by state, in the order stats lists them');
      const truth: Record<string, TaskInfo[]> = {
        active: await inspector.listActiveTasks('reads'),
        pending: await inspector.listPendingTasks('reads'),
        waiting: await inspector.listWaitingTasks('reads'),
        aggregating: [...(await inspector.listAggregatingTasks('reads', 'g1')), ...(await inspector.listAggregatingTasks('reads', 'g2'))],
        scheduled: await inspector.listScheduledTasks('reads'),
        retry: await inspector.listRetryTasks('reads'),
        archived: await inspector.listArchivedTasks('reads'),
        completed: await inspector.listCompletedTasks('reads'),
      };
      for (const st of order) assert.deepEqual(unclock(all[st]), unclock(plain(truth[st])), st);
      assert.deepEqual(
        Object.fromEntries(order.map((st) => [st, paged[st]!.map((t) => t.id)])),
        { active: [], pending: ['p2'], waiting: [], aggregating: ['agg2'], scheduled: [], retry: [], archived: [], completed: [] },
        '--page and --size apply to each state',
      );

      const out = ok(text);
      const headings = out.split('\n').filter((l) => /^\w+: \d+ tasks?$/.test(l));
      assert.deepEqual(headings, [
        'active: 1 task',
        'pending: 2 tasks',
        'aggregating: 3 tasks',
        'scheduled: 1 task',
        'retry: 1 task',
        'archived: 1 task',
        'completed: 1 task',
      ]);
      assert.match(out, /^retry: 1 task\nid\s+type\s+payload\s+next retry\s+retried\s+last failed\s+last error\n-+/m, 'each state with its own columns');
      assert.match(out, /^agg3\s+job\s+\{"id":"agg3"\}\s+g2$/m, 'aggregating tasks of every group');
      assert.match(out, /\n\nno waiting tasks\n$/);
      const lines = ok(small).split('\n');
      const pending = lines.indexOf('pending: 2 tasks');
      assert.match(lines[pending + 3]!, /^p1\s/);
      assert.equal(lines[pending + 4], '(page 1 of 2: --page 2 for more, or --state pending for this state alone)');
      assert.equal(lines.filter((l) => l.startsWith('(page 1 of ')).length, 2, 'pending and aggregating have a second page');
      assert.match(ok(g1), /^aggregating \(group "g1"\): 2 tasks$/m);
      assert.doesNotMatch(ok(g1), /^agg3\s/m);
    });

    test('task inspect', async () => {
      const [info, text] = await Promise.all([json<TaskInfo>('task', 'inspect', 'reads', 'com'), pgasynq('task', 'inspect', 'reads', 'ret')]);
      assert.deepEqual(info, plain(await inspector.getTaskInfo('reads', 'com')));
      assert.ok(typeof info.enqueuedAt === 'string' && 'startedAt' in info, 'enqueuedAt and startedAt in --json');
      const out = ok(text);
      for (const line of [
        /^id:\s+ret$/m,
        /^queue:\s+reads$/m,
        /^state:\s+retry$/m,
        /^payload:\s+\{"id":"ret"\}$/m,
        /^retried:\s+1 of 25$/m,
        /^last error:\s+boom$/m,
      ]) {
        assert.match(out, line);
      }
      assert.match(out, new RegExp(String.raw`^next process at:\s+\d{4}-\d{2}-\d{2}T[\d:.]+Z \(${IN_AN_HOUR}\)$`, 'm'));
      assert.match(out, new RegExp(String.raw`^enqueued at:\s+\d{4}-\d{2}-\d{2}T[\d:.]+Z \(${AGO}\)$`, 'm'));
      assert.match(out, /^started at:\s+-$/m, 'never started');
      assert.match(ok(await pgasynq('task', 'inspect', 'reads', 'act')), new RegExp(String.raw`^started at:\s+\d{4}-\d{2}-\d{2}T[\d:.]+Z \(${AGO}\)$`, 'm'));
    });

    test('task inspect ID: the task with that id in whichever queue holds it', async () => {
      const [info, text] = await Promise.all([json('task', 'inspect', 'com'), pgasynq('task', 'inspect', 'bin')]);
      assert.deepEqual(info, plain(await inspector.getTaskInfo('reads', 'com')));
      assert.match(ok(text), /^queue:\s+reads_low$/m);
      assert.match(ok(text), /^payload:\s+<6 bytes>$/m);
    });

    test('group ls', async () => {
      const [groups, text] = await Promise.all([json('group', 'ls', '--queue', 'reads'), pgasynq('group', 'ls', '-q', 'reads')]);
      assert.deepEqual(groups, plain(await inspector.groups('reads')));
      assert.deepEqual(groups, [
        { group: 'g1', size: 2 },
        { group: 'g2', size: 1 },
      ]);
      assert.equal(ok(text), 'group  size\n-----  ----\ng1        2\ng2        1\n');
    });

    test('server ls: each server with the tasks it runs', async () => {
      const [servers, text] = await Promise.all([json<{ activeWorkers: unknown[] }[]>('server', 'ls'), pgasynq('server', 'ls')]);
      assert.deepEqual(servers, plain(await inspector.servers()));
      assert.equal(servers[0]?.activeWorkers.length, 1);
      const out = ok(text);
      assert.match(out, /^id\s+host\s+pid\s+status\s+active\s+queues\s+started$/m);
      assert.match(out, new RegExp(String.raw`^srv-1\s+worker-1\s+4242\s+active\s+1/10\s+reads:2 reads_low:1\s+${AGO}$`, 'm'));
      assert.match(out, /^Active workers$/m);
      assert.match(out, new RegExp(String.raw`^srv-1\s+reads\s+act\s+job\s+\{"id":"act"\}\s+${AGO}\s+${IN_AN_HOUR}\s+${IN_AN_HOUR}$`, 'm'));
    });

    test('cron ls and cron history', async () => {
      const [entries, text, events, history] = await Promise.all([
        json('cron', 'ls'),
        pgasynq('cron', 'ls'),
        json<{ taskId: string }[]>('cron', 'history', 'e1', '--page', '2', '--size', '10'),
        pgasynq('cron', 'history', 'e1'),
      ]);
      assert.deepEqual(entries, plain(await inspector.schedulerEntries()));
      assert.match(ok(text), /^entry id\s+spec\s+type\s+payload\s+options\s+next\s+prev$/m);
      assert.match(ok(text), new RegExp(String.raw`^e1\s+@every 30s\s+report\s+\{"k":1\}\s+\{"queue":"reads"\}\s+${IN_AN_HOUR}\s+${AGO}$`, 'm'));
      assert.deepEqual(events, plain(await inspector.listSchedulerEnqueueEvents('e1', { page: 2, pageSize: 10 })));
      assert.deepEqual(
        events.map((e) => e.taskId),
        ['task11', 'task12', 'task13', 'task14', 'task15', 'task16', 'task17', 'task18', 'task19', 'task20'],
      );
      const lines = ok(history).trimEnd().split('\n');
      assert.match(lines[0]!, /^task id\s+tick\s+enqueued at\s+enqueued$/);
      assert.match(lines[2]!, new RegExp(String.raw`^task1\s+\S+Z\s+\S+Z\s+${AGO}$`));
      assert.equal(lines.filter((l) => l.startsWith('task')).length, 1 + 30, 'the header and a page of 30');
    });
  });

  describe('exit codes', { concurrency: true }, () => {
    test('an unknown queue or task: 1, one line', async () => {
      const [ls, task] = await Promise.all([pgasynq('--json', 'task', 'ls', '-q', 'nosuch', '-s', 'pending'), pgasynq('task', 'inspect', 'reads', 'nosuch')]);
      fails(ls, 1, /^error: queue "nosuch" does not exist\n$/);
      fails(task, 1, /^error: cannot find task with id=nosuch in queue "reads"\n$/);
      fails(await pgasynq('task', 'inspect', 'nosuch'), 1, /^error: cannot find task with id=nosuch in any queue\n$/);
    });

    test('an invalid state: 2, naming the states; a bulk action asynq lacks: 2', async () => {
      const [ls, bulk, runall, noGroup] = await Promise.all([
        pgasynq('task', 'ls', '-q', 'reads', '-s', 'bogus'),
        pgasynq('task', 'deleteall', 'reads', 'bogus'),
        pgasynq('task', 'runall', 'reads', 'pending'),
        pgasynq('task', 'ls', '-q', 'reads', '-s', 'aggregating'),
      ]);
      fails(ls, 2, /'bogus' is invalid\. Allowed choices are active, pending, waiting, aggregating, scheduled, retry, archived, completed/);
      fails(bulk, 2, /invalid state 'bogus': the states are active, pending, waiting, aggregating, scheduled, retry, archived, completed/);
      fails(runall, 2, /runall does not apply to pending tasks .*runall takes waiting, aggregating, scheduled, retry, archived/);
      fails(noGroup, 2, /aggregating needs --group/);
      assert.equal(await stateOf('reads', 'p1'), 'pending');
    });

    test('a missing --queue, a bad --size: 2', async () => {
      const [group, size] = await Promise.all([pgasynq('group', 'ls'), pgasynq('task', 'ls', '-q', 'reads', '-s', 'pending', '--size', '0')]);
      fails(group, 2, /required option '-q, --queue <queue>' not specified/);
      fails(size, 2, /--size <n>' argument '0' is invalid\. must be an integer from 1 to 1000/);
    });

    test('no database URL: 2; an unreachable database: 1, one line, no password; an unmigrated schema: 1 with a hint', async () => {
      const [none, unreachable, unmigrated] = await Promise.all([
        cli(['queue', 'ls']),
        cli(['--json', 'task', 'ls', '-q', 'x', '-s', 'pending'], { DATABASE_URL: UNREACHABLE }),
        cli(['--database-url', DATABASE_URL, '--schema', 't_cli_admin_none', 'stats']),
      ]);
      fails(none, 2, /--database-url.*DATABASE_URL/);
      fails(unreachable, 1, /^error: cannot reach the database at postgres:\/\/u:\*\*\*@127\.0\.0\.1:1\/x: .*ECONNREFUSED/);
      assert.doesNotMatch(unreachable.stderr, /secret/);
      fails(
        unmigrated,
        1,
        /^error: schema "t_cli_admin_none" is not migrated \(relation "t_cli_admin_none\.\w+" does not exist\): run: pgasynq --schema t_cli_admin_none migrate\n$/,
      );
    });

    test('--help lists the commands and says what --json prints', async () => {
      const [root, ls] = await Promise.all([cli(['--help']), cli(['task', 'ls', '--help'])]);
      for (const cmd of ['stats', 'queue', 'task', 'group', 'server', 'cron']) assert.match(ok(root), new RegExp(`^  ${cmd}\\b`, 'm'));
      assert.match(ok(ls), /-s, --state <state>\s+task state \(default: every state, a page of each\)\s+\(choices: "active", "pending"/);
      assert.match(ok(ls), /With --json .* an array of TaskInfo\. Without --state: an object keyed by state/s);
    });
  });
});

// Each action on a queue of its own, so they run at once too.
describe('actions change the rows', { concurrency: true }, () => {
  before(async () => {
    for (const id of ['d1', 'd2', 'dact']) await put('del', id);
    await force('del', 'dact', ACTIVE('srv-x'));
    await put('arc', 'a1');
    await put('arc', 'a2', { processIn: 3_600_000 });
    for (const id of ['r1', 'r2']) await put('run', id);
    await force('run', 'r1', ARCHIVED);
    await force('run', 'r2', RETRY);
    for (const id of ['c1', 'c2']) await put('cancel', id);
    await force('cancel', 'c1', ACTIVE('srv-x'));
    for (const id of ['bd1', 'bd2', 'bd3']) await put('bdel', id);
    for (const id of ['bd4', 'bd5']) await put('bdel', id, { processIn: 3_600_000 });
    for (const id of ['ba1', 'ba2']) await put('barc', id);
    for (const id of ['ba1', 'ba2']) await force('barc', id, RETRY);
    for (const id of ['ba3', 'ba4']) await put('barc', id, { group: 'g1' });
    await put('barc', 'ba5', { group: 'g2' });
    for (const id of ['br1', 'br2']) await put('brun', id);
    for (const id of ['br1', 'br2']) await force('brun', id, ARCHIVED);
    await put('brun', 'br3', { processIn: 3_600_000 });
    await put('pq', 'x');
    await put('rq', 'x');
    await put('rq_empty', 'x');
    await inspector.deleteTask('rq_empty', 'x');
  });

  test('task delete: any state but active', async () => {
    const [human, asJson, active] = await Promise.all([
      pgasynq('task', 'delete', 'del', 'd1'),
      pgasynq('--json', 'task', 'rm', 'del', 'd2'),
      pgasynq('task', 'delete', 'del', 'dact'),
    ]);
    assert.equal(ok(human), 'task d1 in queue "del": deleted\n');
    assert.deepEqual(JSON.parse(ok(asJson)), { ok: true });
    fails(active, 1, /^error: cannot delete task in active state: id=dact, queue=del; use cancelProcessing instead\n$/);
    assert.deepEqual([await stateOf('del', 'd1'), await stateOf('del', 'd2'), await stateOf('del', 'dact')], ['gone', 'gone', 'active']);
  });

  test('task archive and task run', async () => {
    const [a1, a2, r1, r2] = await Promise.all([
      pgasynq('task', 'archive', 'arc', 'a1'),
      pgasynq('--json', 'task', 'archive', 'arc', 'a2'),
      pgasynq('task', 'run', 'run', 'r1'),
      pgasynq('--json', 'task', 'run', 'run', 'r2'),
    ]);
    assert.equal(ok(a1), 'task a1 in queue "arc": archived\n');
    assert.deepEqual(JSON.parse(ok(a2)), { ok: true });
    assert.equal(ok(r1), 'task r1 in queue "run": now pending\n');
    assert.deepEqual(JSON.parse(ok(r2)), { ok: true });
    assert.deepEqual(await countsOf('arc'), { archived: 2 });
    assert.deepEqual(await countsOf('run'), { pending: 2 });
  });

  test('task inspect ID held by several queues: 1, naming them and asking for the queue; task inspect QUEUE ID still works', async () => {
    await put('twin_a', 'twin');
    await put('twin_b', 'twin');
    const [both, one] = await Promise.all([pgasynq('task', 'inspect', 'twin'), json<TaskInfo>('task', 'inspect', 'twin_b', 'twin')]);
    fails(both, 1, /^error: 2 queues hold a task with id=twin \(twin_a, twin_b\): say which, with: pgasynq task inspect QUEUE twin\n$/);
    assert.equal(one.queue, 'twin_b');
  });

  test('task inspect: an instant no Date can show is "—"', async () => {
    await put('far', 'far');
    await force('far', 'far', "started_at = '10000-01-01T00:00:00Z'");
    assert.match(ok(await pgasynq('task', 'inspect', 'far')), /^started at:\s+—$/m);
  });

  test('task cancel: marks the active task; a task not running is a count of 0', async () => {
    const [running, idle] = await Promise.all([pgasynq('task', 'cancel', 'c1'), pgasynq('--json', 'task', 'cancel', 'c2')]);
    assert.equal(ok(running), 'cancellation requested for task c1\n');
    assert.deepEqual(JSON.parse(ok(idle)), { count: 0 });
    const rows = await db.query("SELECT id, cancel_requested FROM {{schema}}.tasks WHERE queue = 'cancel' ORDER BY id");
    assert.deepEqual(rows, [
      { id: 'c1', cancel_requested: true },
      { id: 'c2', cancel_requested: false },
    ]);
  });

  test('task deleteall, archiveall, runall: the count, and the rows moved', async () => {
    const [dHuman, dJson, aHuman, aJson, rHuman, rJson] = await Promise.all([
      pgasynq('task', 'deleteall', 'bdel', 'pending'),
      pgasynq('--json', 'task', 'deleteall', 'bdel', 'scheduled'),
      pgasynq('task', 'archiveall', 'barc', 'retry'),
      pgasynq('--json', 'task', 'archiveall', 'barc', 'aggregating', '--group', 'g1'),
      pgasynq('task', 'runall', 'brun', 'archived'),
      pgasynq('--json', 'task', 'runall', 'brun', 'scheduled'),
    ]);
    assert.equal(ok(dHuman), 'deleted 3 pending tasks from queue "bdel"\n');
    assert.deepEqual(JSON.parse(ok(dJson)), { count: 2 });
    assert.equal(ok(aHuman), 'archived 2 retry tasks of queue "barc"\n');
    assert.deepEqual(JSON.parse(ok(aJson)), { count: 2 });
    assert.equal(ok(rHuman), '2 archived tasks of queue "brun" are now pending\n');
    assert.deepEqual(JSON.parse(ok(rJson)), { count: 1 });
    assert.deepEqual(await countsOf('bdel'), {});
    assert.deepEqual(await countsOf('barc'), { archived: 4, aggregating: 1 }, 'the other group is untouched');
    assert.deepEqual(await countsOf('brun'), { pending: 3 });
  });

  test('queue pause and unpause', async () => {
    assert.equal(ok(await pgasynq('queue', 'pause', 'pq')), 'queue "pq" paused\n');
    assert.equal((await inspector.getQueueInfo('pq')).paused, true);
    assert.deepEqual(JSON.parse(ok(await pgasynq('--json', 'queue', 'unpause', 'pq'))), { ok: true });
    assert.equal((await inspector.getQueueInfo('pq')).paused, false);
  });

  test('queue rm: refused when not empty; --force deletes its tasks', async () => {
    const [refused, empty] = await Promise.all([pgasynq('queue', 'rm', 'rq'), pgasynq('queue', 'rm', 'rq_empty')]);
    fails(refused, 1, /^error: queue "rq" is not empty\n$/);
    assert.equal(ok(empty), 'queue "rq_empty" removed\n');
    assert.deepEqual(JSON.parse(ok(await pgasynq('--json', 'queue', 'rm', 'rq', '--force'))), { ok: true });
    const queues = await inspector.queues();
    assert.ok(!queues.includes('rq') && !queues.includes('rq_empty'), queues.join());
    assert.deepEqual(await countsOf('rq'), {});
  });
});

describe('workflows', () => {
  test('task ls --state waiting, task inspect naming dependencies, and the bulk commands on waiting tasks', async () => {
    await client.enqueueMany([
      new Task('job', null, { queue: 'flows', taskId: 'first' }),
      new Task('job', null, { queue: 'flows', taskId: 'second' }),
      new Task('job', null, { queue: 'flows', taskId: 'after', dependsOn: ['first', 'second'] }),
      new Task('job', null, { queue: 'flows', taskId: 'last', dependsOn: ['after'] }),
    ]);
    const [listed, text, inspected] = await Promise.all([
      json<TaskInfo[]>('task', 'ls', '-q', 'flows', '-s', 'waiting'),
      pgasynq('task', 'ls', '-q', 'flows', '-s', 'waiting'),
      pgasynq('task', 'inspect', 'flows', 'after'),
    ]);
    assert.deepEqual(listed, plain(await inspector.listWaitingTasks('flows')));
    assert.deepEqual(
      listed.map((t) => [t.id, t.waitingFor]),
      [
        ['after', 2],
        ['last', 1],
      ],
    );
    const lines = ok(text).trim().split('\n');
    assert.match(lines[0]!, /^id\s+type\s+payload\s+waiting for\s+depends on$/);
    assert.match(lines[2]!, /^after\s+job\s+-\s+2 of 2\s+flows\/first, flows\/second$/);
    assert.match(lines[3]!, /^last\s+job\s+-\s+1 of 1\s+flows\/after$/);
    assert.match(ok(inspected), /^state:\s+waiting$/m);
    assert.match(ok(inspected), /^depends on:\s+flows\/first, flows\/second$/m);
    assert.match(ok(inspected), /^waiting for:\s+2 of 2 dependencies$/m);
    // archiveall: 'after' fails 'last' in the same statement; whichever of the two the bulk update reaches
    // second has moved on by then and is not counted again.
    assert.match(ok(await pgasynq('task', 'archiveall', 'flows', 'waiting')), /^archived [12] waiting tasks? of queue "flows"\n$/);
    assert.deepEqual(await countsOf('flows'), { pending: 2, archived: 2 });
    assert.equal(ok(await pgasynq('task', 'deleteall', 'flows', 'archived')), 'deleted 2 archived tasks from queue "flows"\n');
    await client.enqueue(new Task('job', null, { queue: 'flows', taskId: 'again', dependsOn: ['first'] }));
    assert.equal(ok(await pgasynq('task', 'runall', 'flows', 'waiting')), '1 waiting task of queue "flows" is now pending\n');
    assert.deepEqual(await countsOf('flows'), { pending: 3 });
    await inspector.deleteQueue('flows', true);
  });
});

// Each case on a queue of its own, so they run at once.
describe('flow control: queue limit, and priority and concurrency key on tasks', { concurrency: true }, () => {
  const NONE = { concurrency: null, keyConcurrency: null, rateLimit: null };
  const limitsOf = async (queue: string) => (await inspector.getQueueInfo(queue)).limits;

  before(async () => {
    for (const q of ['lim_set', 'lim_merge', 'lim_clear', 'lim_json', 'lim_bad']) await put(q, 'x');
    await put('prio', 'plain');
    await put('prio', 'high', { priority: 7, concurrencyKey: 'tenant-42' });
    await put('prio', 'low', { priority: -3 });
  });

  test('sets the limits given; queue inspect shows them (and "none" without); the rate takes h, m, s, ms', async () => {
    assert.equal(
      ok(await pgasynq('queue', 'limit', 'lim_set', '--concurrency', '5', '--key-concurrency', '2', '--rate', '100/1s')),
      'queue "lim_set" limits: concurrency 5, per key 2, rate 100/1s\n',
    );
    assert.deepEqual(await limitsOf('lim_set'), { concurrency: 5, keyConcurrency: 2, rateLimit: { limit: 100, interval: 1000 } });
    const [text, info, none] = await Promise.all([
      pgasynq('queue', 'inspect', 'lim_set'),
      json<{ limits: unknown }>('queue', 'inspect', 'lim_set'),
      pgasynq('queue', 'inspect', 'reads'),
    ]);
    assert.match(ok(text), /^limits:\s+concurrency 5, per key 2, rate 100\/1s$/m);
    assert.deepEqual(info.limits, { concurrency: 5, keyConcurrency: 2, rateLimit: { limit: 100, interval: 1000 } });
    assert.match(ok(none), /^limits:\s+none$/m);
    // Durations as cron's @every takes them, printed back exactly; a unit alone is one of it.
    for (const [rate, interval, shown] of [
      ['10/500ms', 500, '10/500ms'],
      ['1000/1m', 60_000, '1000/1m'],
      ['5/1m30s', 90_000, '5/1m30s'],
      ['3/1.5s', 1500, '3/1s500ms'],
      ['7/s', 1000, '7/1s'],
    ] as const) {
      assert.equal(ok(await pgasynq('queue', 'limit', 'lim_set', '--rate', rate)), `queue "lim_set" limits: concurrency 5, per key 2, rate ${shown}\n`, rate);
      assert.deepEqual((await limitsOf('lim_set')).rateLimit, { limit: Number(rate.split('/')[0]), interval }, rate);
    }
  });

  test('the limits not given stay; none clears one', async () => {
    await inspector.setQueueLimits('lim_merge', { ...NONE, concurrency: 5, rateLimit: { limit: 100, interval: 1000 } });
    assert.equal(
      ok(await pgasynq('queue', 'limit', 'lim_merge', '--key-concurrency', '3')),
      'queue "lim_merge" limits: concurrency 5, per key 3, rate 100/1s\n',
    );
    assert.deepEqual(await limitsOf('lim_merge'), { concurrency: 5, keyConcurrency: 3, rateLimit: { limit: 100, interval: 1000 } });
    assert.equal(
      ok(await pgasynq('queue', 'limit', 'lim_merge', '--rate', '10/500ms', '--concurrency', '8')),
      'queue "lim_merge" limits: concurrency 8, per key 3, rate 10/500ms\n',
    );
    assert.equal(ok(await pgasynq('queue', 'limit', 'lim_merge', '--rate', 'none', '--key-concurrency', 'none')), 'queue "lim_merge" limits: concurrency 8\n');
    assert.deepEqual(await limitsOf('lim_merge'), { ...NONE, concurrency: 8 });
  });

  test('--clear alone removes every limit; with values it clears, then sets them', async () => {
    await inspector.setQueueLimits('lim_clear', { concurrency: 5, keyConcurrency: 2, rateLimit: { limit: 100, interval: 1000 } });
    assert.equal(ok(await pgasynq('queue', 'limit', 'lim_clear', '--clear', '--key-concurrency', '4')), 'queue "lim_clear" limits: per key 4\n');
    assert.deepEqual(await limitsOf('lim_clear'), { ...NONE, keyConcurrency: 4 });
    assert.equal(ok(await pgasynq('queue', 'limit', 'lim_clear', '--clear')), 'queue "lim_clear" limits: none\n');
    assert.deepEqual(await limitsOf('lim_clear'), NONE);
  });

  test('--json: ok and the limits now set', async () => {
    await inspector.setQueueLimits('lim_json', { ...NONE, keyConcurrency: 2 });
    assert.deepEqual(await json('queue', 'limit', 'lim_json', '--concurrency', '4', '--rate', '1000/1m'), {
      ok: true,
      limits: { concurrency: 4, keyConcurrency: 2, rateLimit: { limit: 1000, interval: 60_000 } },
    });
    assert.deepEqual(await json('queue', 'limit', 'lim_json', '--clear'), { ok: true, limits: NONE });
  });

  test('bad values: 2, naming the flag and the rule, and nothing changes; a queue not known yet is made known', async () => {
    const before = { concurrency: 3, keyConcurrency: null, rateLimit: { limit: 50, interval: 2000 } };
    await inspector.setQueueLimits('lim_bad', before);
    const COUNT = /must be an integer from 1 to 2147483647, or none to clear it\./;
    const RATE = /must be N\/DURATION, e.g\. 100\/1s, 10\/500ms or 1000\/1m \(units h, m, s, ms\), or none to clear it\./;
    const cases: [string[], RegExp][] = [
      [['--concurrency', '0'], new RegExp(`option '--concurrency <n>' argument '0' is invalid\\. ${COUNT.source}`)],
      [['--concurrency', '-1'], new RegExp(`option '--concurrency <n>' argument '-1' is invalid\\. ${COUNT.source}`)],
      [['--key-concurrency', '1.5'], new RegExp(`option '--key-concurrency <n>' argument '1\\.5' is invalid\\. ${COUNT.source}`)],
      [['--key-concurrency', 'two'], /option '--key-concurrency <n>' argument 'two' is invalid/],
      [['--concurrency', '2147483648'], COUNT],
      [['--rate', '100'], new RegExp(`option '--rate <n/duration>' argument '100' is invalid\\. ${RATE.source}`)],
      [['--rate', '100/1x'], RATE],
      [['--rate', '100/'], RATE],
      [['--rate', '-5/1s'], RATE],
      [['--rate', '0/1s'], /option '--rate <n\/duration>' argument '0\/1s' is invalid\. N must be an integer from 1 to 2147483647\./],
      [['--rate', '5/0ms'], /argument '5\/0ms' is invalid\. DURATION must be from 1ms to 2147483647ms/],
      [['--rate', '5/600h'], /DURATION must be from 1ms to 2147483647ms/],
      [[], /queue limit needs --concurrency, --key-concurrency, --rate or --clear/],
    ];
    const [runs, unknown, unknownClear, badName] = await Promise.all([
      Promise.all(cases.map(([args]) => pgasynq('queue', 'limit', 'lim_bad', ...args))),
      pgasynq('queue', 'limit', 'lim_new', '--concurrency', '3'),
      pgasynq('--json', 'queue', 'limit', 'lim_new_clear', '--clear'),
      pgasynq('queue', 'limit', 'bad name', '--clear'),
    ]);
    for (const [i, [args, message]] of cases.entries()) {
      assert.ok(runs[i], args.join(' '));
      fails(runs[i], 2, message);
    }
    assert.equal(ok(unknown), 'queue "lim_new" limits: concurrency 3\n');
    assert.deepEqual(JSON.parse(ok(unknownClear)), { ok: true, limits: NONE });
    fails(badName, 2, /queue may contain only/);
    assert.deepEqual(await limitsOf('lim_bad'), before);
    assert.deepEqual(await limitsOf('lim_new'), { ...NONE, concurrency: 3 });
    assert.deepEqual(await limitsOf('lim_new_clear'), NONE);
    assert.ok(!(await inspector.queues()).includes('bad name'), 'no queue was made of a bad name');
  });

  test('queue create makes a queue known with its limits and flag; again, it keeps its tasks; bad values: 2', async () => {
    assert.equal(
      ok(await pgasynq('queue', 'create', 'made', '--concurrency', '2', '--rate', '10/1s', '--paused')),
      'queue "made": 0 tasks, limits: concurrency 2, rate 10/1s, paused\n',
    );
    const info = await inspector.getQueueInfo('made');
    assert.deepEqual([info.paused, info.limits], [true, { ...NONE, concurrency: 2, rateLimit: { limit: 10, interval: 1000 } }]);
    await put('made', 'first');
    const again = await json<{ queue: string; size: number; paused: boolean; limits: unknown }>('queue', 'create', 'made');
    assert.deepEqual([again.queue, again.size, again.paused, again.limits], ['made', 1, true, info.limits]);
    const [badCount, badName, ls] = await Promise.all([
      pgasynq('queue', 'create', 'made2', '--concurrency', '0'),
      pgasynq('queue', 'create', 'bad name'),
      pgasynq('queue', 'ls'),
    ]);
    fails(badCount, 2, /option '--concurrency <n>' argument '0' is invalid/);
    fails(badName, 2, /queue may contain only/);
    assert.match(ok(ls), /\bmade\b/);
    assert.ok(!(await inspector.queues()).includes('made2'));
    assert.equal(ok(await pgasynq('queue', 'pause', 'made_paused')), 'queue "made_paused" paused\n');
    assert.equal((await inspector.getQueueInfo('made_paused')).paused, true, 'queue pause makes a queue known, paused');
  });

  test('--help says which limits it keeps and what --clear does', async () => {
    const help = ok(await cli(['queue', 'limit', '--help']));
    assert.match(help, /Sets the limits given and keeps the others as they are/);
    assert.match(help, /--clear alone\s+removes every limit/);
    assert.match(help, /--rate N\/DURATION/);
    assert.match(help, /With --json .*"ok":true,"limits"/s);
  });

  test('task inspect shows priority and concurrency key; task ls shows priority for pending tasks when one has it', async () => {
    const [high, plain, list] = await Promise.all([
      pgasynq('task', 'inspect', 'prio', 'high'),
      pgasynq('task', 'inspect', 'prio', 'plain'),
      pgasynq('task', 'ls', '-q', 'prio', '-s', 'pending'),
    ]);
    assert.match(ok(high), /^priority:\s+7$/m);
    assert.match(ok(high), /^concurrency key:\s+tenant-42$/m);
    assert.match(ok(plain), /^priority:\s+0$/m);
    assert.match(ok(plain), /^concurrency key:\s+-$/m);
    const lines = ok(list).trimEnd().split('\n');
    assert.match(lines[0]!, /^id\s+type\s+payload\s+priority\s+retried$/);
    assert.match(lines[2]!, /^high\s+job\s+\{"id":"high"\}\s+7\s+0\/25$/, 'the highest first, as the claim takes them');
    assert.match(lines[3]!, /^plain\s+job\s+\{"id":"plain"\}\s+0\s+0\/25$/);
    assert.match(lines[4]!, /^low\s+job\s+\{"id":"low"\}\s+-3\s+0\/25$/);
  });
});
