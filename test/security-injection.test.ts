/**
 * Security tests SEC2 (identifier injection) and SEC3 (prototype pollution) of
 * the reliability plan (§5.3), against the real library and a real PostgreSQL.
 *
 * "No SQL sent" is proved with a real pg.Pool whose connect() and query()
 * are counted (the plan's log_statement=all needs a cluster of our own).
 */
import assert from 'node:assert/strict';
import { describe } from 'node:test';
import {
  Client,
  Inspector,
  InvalidQueueNameError,
  InvalidSchemaNameError,
  InvalidTaskTypeError,
  PeriodicTaskManager,
  Scheduler,
  Server,
  Task,
  migrate,
  migrateDown,
  migrationStatus,
} from '../src/index.js';
import { caught, DATABASE_URL, runCli, runNode, test, waitFor } from './helpers.js';
import { securityFile } from './shared.js';

const { db, pool, startServer } = securityFile('t_security_injection');

// ---------------------------------------------------------------------------
describe('SEC2 identifier injection', () => {
  /** §6 rows 18–21, and a few more of the same kind. */
  const BAD_SCHEMAS = [
    'public; DROP SCHEMA public CASCADE',
    'pg_catalog',
    'pg_pgq',
    "o'brien",
    'a$$b',
    'Queue',
    'x.job',
    '',
    'a'.repeat(64),
    'a"b',
    'a b',
    'a\nb',
    '1abc',
    'ünï',
  ];

  /**
   * Relations of the test schema and of public, and those two schemas. Not
   * every schema: other test files create and drop theirs meanwhile. A schema
   * an attack could have made is looked for by name (BAD_SCHEMAS).
   */
  async function relations(): Promise<string[]> {
    const rows = await db.query<{ r: string }>(
      `SELECT n.nspname || '.' || c.relname || ':' || c.relkind::text AS r FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
       WHERE n.nspname IN ($1, 'public')
       UNION ALL SELECT 'schema:' || nspname FROM pg_namespace WHERE nspname IN ($1, 'public') OR nspname = ANY($2) ORDER BY 1`,
      [db.schema, BAD_SCHEMAS],
    );
    return rows.map((r) => r.r);
  }

  test('every bad schema name is refused by every entry point before any SQL is sent', async () => {
    const before = await relations();
    const entryPoints: [string, (schema: string) => unknown][] = [
      ['new Client', (schema) => new Client({ pool, schema })],
      ['new Inspector', (schema) => new Inspector({ pool, schema })],
      ['new Server', (schema) => new Server({ pool, schema })],
      ['new Scheduler', (schema) => new Scheduler({ pool, schema })],
      ['new PeriodicTaskManager', (schema) => new PeriodicTaskManager({ pool, schema, getConfigs: () => [] })],
      ['migrate', (schema) => migrate({ pool, schema })],
      ['migrateDown', (schema) => migrateDown({ pool, schema })],
      ['migrationStatus', (schema) => migrationStatus({ pool, schema })],
    ];
    for (const schema of BAD_SCHEMAS) {
      for (const [name, make] of entryPoints) {
        const sentBefore = pool.sent;
        const err = await caught(() => make(schema));
        assert.ok(err instanceof InvalidSchemaNameError, `${name}(${JSON.stringify(schema)}): ${String(err)}`);
        assert.match(err.message, /^schema (must|may)/);
        assert.equal(pool.sent, sentBefore, `${name}(${JSON.stringify(schema)}) sent SQL`);
      }
    }
    assert.deepEqual(await relations(), before, 'no relation or schema created or dropped');
  });

  const NASTY = ["'", '"', '$$', ';', '--', '\n'];

  test('queue names with \' " $$ ; or a newline are refused before SQL (our charset rule: A–Z a–z 0–9 _ . : -); -- is data', async () => {
    const client = new Client({ pool, schema: db.schema });
    const inspector = new Inspector({ pool, schema: db.schema });
    for (const bad of NASTY.filter((s) => s !== '--')) {
      const queue = `q${bad}x`;
      const sentBefore = pool.sent;
      for (const attempt of [
        () => client.enqueue(new Task('t'), { queue }),
        () => new Task('t', null, { queue }),
        () => inspector.getQueueInfo(queue),
        () => inspector.pauseQueue(queue),
        () => inspector.deleteQueue(queue, true),
        () => new Server({ pool, schema: db.schema, queues: { [queue]: 1 } }),
      ]) {
        const err = await caught(attempt);
        assert.ok(err instanceof InvalidQueueNameError, `${JSON.stringify(queue)}: ${String(err)}`);
        assert.ok(err.message.includes(`(found ${JSON.stringify(bad[0])} at index 1)`), err.message);
      }
      assert.equal(pool.sent, sentBefore);
    }
    // "-" is in the charset, so "--" is an ordinary queue name: a bind parameter, stored and read back verbatim.
    const before = await relations();
    const info = await client.enqueue(new Task('t'), { queue: 'q--x' });
    assert.equal((await inspector.getTaskInfo('q--x', info.id)).queue, 'q--x');
    assert.ok((await inspector.queues()).includes('q--x'));
    await inspector.pauseQueue('q--x');
    assert.equal((await inspector.getQueueInfo('q--x')).paused, true);
    assert.deepEqual(await relations(), before);
  });

  test('task types with \' " $$ ; -- round-trip verbatim as data (a newline is refused: no control characters)', { timeout: 60_000 }, async () => {
    const before = await relations();
    const types = [
      ...NASTY.filter((s) => s !== '\n').map((s) => `t${s}x`),
      "x'); DROP TABLE tasks; --",
      '$$; DROP SCHEMA public CASCADE; $$',
      'a"b\'c$$d;e--f',
    ];
    const client = new Client({ connectionString: DATABASE_URL, schema: db.schema });
    const inspector = new Inspector({ connectionString: DATABASE_URL, schema: db.schema });
    const seen: string[] = [];
    const server = await startServer(
      (task) => {
        seen.push(task.type);
      },
      { queues: { sec2: 1 } },
    );
    try {
      const infos = [];
      for (const type of types) {
        // unique: the type is part of the unique key; headers: free-form data too.
        const info = await client.enqueue(new Task(type, { type }, { headers: { [type]: type } }), { queue: 'sec2', unique: 60_000, retention: 60_000 });
        assert.equal(info.type, type);
        infos.push(info);
      }
      await waitFor(() => seen.length === types.length, 20_000, 'every task handled');
      assert.deepEqual([...seen].sort(), [...types].sort(), 'the handler saw each type verbatim');
      // A handler returns before its completion batch commits: wait for the batches, not the handlers.
      await waitFor(async () => (await inspector.getQueueInfo('sec2')).completed === types.length, 20_000, 'every completion committed');
      for (const info of infos) {
        const read = await inspector.getTaskInfo('sec2', info.id);
        assert.equal(read.type, info.type);
        assert.deepEqual(read.payload, { type: info.type });
        assert.deepEqual(read.headers, { [info.type]: info.type });
        assert.equal(read.state, 'completed');
      }
      const err = await caught(() => client.enqueue(new Task('a\nb')));
      assert.ok(err instanceof InvalidTaskTypeError);
      assert.match(err.message, /^type may not contain control characters \(found U\+000a at index 1\)$/);
    } finally {
      await server.shutdown();
      await inspector.close();
      await client.close();
    }
    assert.deepEqual(await relations(), before, 'the relations are unchanged');
  });
});

// ---------------------------------------------------------------------------
describe('SEC3 prototype pollution', () => {
  const PAYLOAD = '{"__proto__":{"polluted":true},"constructor":{"prototype":{"x":1}}}';
  const clean = () => ({}) as Record<string, unknown>;

  test('the payload goes through enqueue → handler → Inspector → CLI without polluting any process', { timeout: 60_000 }, async () => {
    const payload = JSON.parse(PAYLOAD) as Record<string, unknown>;
    const client = new Client({ connectionString: DATABASE_URL, schema: db.schema });
    const inspector = new Inspector({ connectionString: DATABASE_URL, schema: db.schema });
    let handled: { own: string[]; proto: unknown; protoValue: unknown; assigned: unknown } | undefined;
    const server = await startServer(
      (task) => {
        const p = task.payload as Record<string, unknown>;
        // What a careless handler does: Object.assign onto a fresh object.
        const assigned: Record<string, unknown> = Object.assign({}, p);
        handled = {
          own: Object.keys(p).sort(),
          proto: Object.getPrototypeOf(p) === Object.prototype,
          protoValue: Object.getOwnPropertyDescriptor(p, '__proto__')?.value,
          assigned: assigned.polluted,
        };
      },
      { queues: { sec3: 1 } },
    );
    try {
      const info = await client.enqueue(new Task('proto', payload), { queue: 'sec3', retention: 60_000 });
      await waitFor(() => handled, 20_000, 'the handler ran');
      // The handler saw the keys as own data properties of a plain object (the choice documented in src/model/payload.ts).
      assert.deepEqual(handled?.own, ['__proto__', 'constructor']);
      assert.equal(handled?.proto, true);
      assert.deepEqual(handled?.protoValue, { polluted: true });
      assert.equal(clean().polluted, undefined);
      assert.equal(clean().x, undefined);

      const read = await inspector.getTaskInfo('sec3', info.id);
      assert.equal(JSON.stringify(read.payload), PAYLOAD, 'the Inspector reads it back verbatim');
      assert.ok(Object.hasOwn(read.payload as object, '__proto__'));
      await inspector.listCompletedTasks('sec3');
      assert.equal(clean().polluted, undefined);

      // The CLI, as a user runs it: the payload is shown, verbatim.
      const shown = await runCli(['--database-url', DATABASE_URL, '--schema', db.schema, 'task', 'inspect', 'sec3', info.id]);
      assert.equal(shown.code, 0, shown.stderr);
      assert.ok(shown.stdout.includes('"__proto__":{"polluted":true}'), shown.stdout);
      // The CLI's run() in a child process, then a look at that process's Object.prototype.
      const code = `
        const { run } = await import('./src/cli/program.ts');
        const out = [];
        const io = { out: { write: (s) => out.push(s) }, err: { write: (s) => out.push(s) }, env: {} };
        const args = ['--database-url', ${JSON.stringify(DATABASE_URL)}, '--schema', ${JSON.stringify(db.schema)}];
        const codes = [await run([...args, '--json', 'task', 'inspect', 'sec3', ${JSON.stringify(info.id)}], io),
                       await run([...args, 'task', 'ls', '--queue', 'sec3', '--state', 'completed'], io)];
        process.stdout.write(JSON.stringify({ codes, out: out.join(''), polluted: ({}).polluted ?? null, x: ({}).x ?? null }));`;
      const child = await runNode(['--input-type=module', '-e', code]);
      assert.equal(child.stderr, '');
      const result = JSON.parse(child.stdout) as { codes: number[]; out: string; polluted: unknown; x: unknown };
      assert.deepEqual(result.codes, [0, 0]);
      assert.equal(result.polluted, null, 'the CLI process is not polluted');
      assert.equal(result.x, null);
      assert.ok(result.out.includes('"__proto__":{"polluted":true}'));
    } finally {
      await server.shutdown();
      await inspector.close();
      await client.close();
    }
    assert.equal(clean().polluted, undefined, 'the test process (client, server, inspector) is not polluted');
  });
});
