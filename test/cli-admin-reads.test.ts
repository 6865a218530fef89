/**
 * The `pgasynq` CLI's Inspector commands that only read (stats, queue, task,
 * group, server, cron), run as users run them: the human tables, `--json`
 * compared with what the Inspector returns; and the exit codes of refusals.
 */
import assert from 'node:assert/strict';
import { describe } from 'node:test';
import type { TaskInfo } from '../src/index.js';
import { DATABASE_URL } from './helpers.js';
import { cli, fails, inspector, json, ok, pgasynq, plain, setupCliAdmin, stateOf, test } from './cli-admin-kit.js';

setupCliAdmin('t_cli_admin_reads');

const UNREACHABLE = 'postgres://u:secret@127.0.0.1:1/x';
/** Drops the fields that change from one call to the next (latency, snapshot time). */
const stable = ({ latency: _l, timestamp: _t, ...rest }: { latency: unknown; timestamp: unknown }) => rest;
/** A pending task's nextProcessAt is "now": not comparable between two calls. */
const unclock = (tasks: unknown) => (tasks as TaskInfo[]).map((t) => (t.state === 'pending' ? { ...t, nextProcessAt: 'now' } : t));
/** A relative time in the past, however slow the machine ("3s ago", "1m2s ago", "just now"); one about an hour ahead. */
const AGO = String.raw`(?:\S+ ago|just now)`;
const IN_AN_HOUR = String.raw`in (?:1h0m|\d+m\d+s)`;

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
      // The TaskInfo, and its attempts (none: these rows were written by hand).
      assert.deepEqual(info, { ...(plain(await inspector.getTaskInfo('reads', 'com')) as TaskInfo), attempts: [] });
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
      assert.deepEqual(info, { ...(plain(await inspector.getTaskInfo('reads', 'com')) as TaskInfo), attempts: [] });
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
