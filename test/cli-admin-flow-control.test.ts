/**
 * The `pgasynq` CLI and flow control, run as users run it: queue limit and
 * queue create (concurrency, per-key concurrency, rate), their refusals, and
 * the priority and concurrency key task inspect and task ls show.
 */
import assert from 'node:assert/strict';
import { before, describe } from 'node:test';
import { cli, fails, inspector, json, ok, pgasynq, put, setupCliAdmin, test } from './cli-admin-kit.js';

setupCliAdmin('t_cli_admin_flow_control');

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
