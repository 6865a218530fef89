/**
 * The database is the trust boundary (see trust-roles-kit.ts): what a login
 * sets on its own session never changes the library's statements: a clock
 * shift is refused for every login but the owner, and code planted on its
 * search_path (a public.unnest, an operator) never runs in them.
 */
import assert from 'node:assert/strict';
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { describe } from 'node:test';
import { Client, Inspector, Server, Task } from '../src/index.js';
import { REPO, test, waitFor } from './helpers.js';
import { as, db, pools, refused, setupTrustRoles, url } from './trust-roles-kit.js';

const PREFIX = setupTrustRoles('trust_roles_session', 't26s', {
  setup: () => db.pool.query(`DROP SCHEMA IF EXISTS public_trap CASCADE`),
  // What the search_path test plants in the database's public schema.
  teardown: async () => {
    await db.pool.query('DROP TABLE IF EXISTS public.t26_calls').catch(() => {});
    await db.pool.query('DROP FUNCTION IF EXISTS public.unnest(text[]), public.unnest(bigint[]), public.unnest(uuid[])').catch(() => {});
    await db.pool.query('DROP OPERATOR IF EXISTS public.* (integer, interval)').catch(() => {});
    await db.pool.query('DROP FUNCTION IF EXISTS public.t26_times(integer, interval)').catch(() => {});
  },
});

describe("the schema's clock (task_now(), 0011) is the database's for every login but the owner", () => {
  test('each role reads the views on the database time; a shift set on its session is refused, in a view and in SQL enqueue()', async () => {
    await db.query(`INSERT INTO {{schema}}.queues (name) VALUES ('clocked') ON CONFLICT DO NOTHING`);
    for (const kind of ['monitor', 'inspector', 'admin'] as const) {
      const [row] = (await as(kind, "SELECT extract(epoch FROM now() - timestamp) AS behind FROM {{S}}.queue_stats WHERE queue = 'clocked'")).rows as {
        behind: string;
      }[];
      assert.equal(Number(row!.behind), 0, `${kind}: queue_stats' timestamp is the transaction's now()`);
      await as(kind, 'SELECT orphaned FROM {{S}}.active_tasks');
    }
    for (const [kind, stmt] of [
      ['monitor', 'SELECT * FROM {{S}}.queue_stats'],
      ['admin', 'SELECT latency FROM {{S}}.queue_stats'],
      ['producer', "SELECT {{S}}.enqueue('t', queue => 'clocked')"],
    ] as const) {
      const session = await pools.get(kind)!.connect();
      try {
        await session.query("SET pgasynq.clock_shift_ms = '3600000'");
        const err = await refused(session.query(stmt.replaceAll('{{S}}', `"${db.schema}"`)), `${kind} an hour ahead: ${stmt}`);
        assert.equal(err.column, 'clock');
      } finally {
        await session.query('RESET pgasynq.clock_shift_ms');
        session.release();
      }
    }
    assert.deepEqual(await db.query(`SELECT 1 FROM {{schema}}.tasks WHERE queue = 'clocked'`), [], 'the refused enqueue wrote nothing');
  });
});

describe("code planted on a login's search_path never runs in the library's statements", () => {
  test('a public.unnest(text[]) and an operator *(integer, interval): no call from claims, limited claims, enqueues, replaces or the Inspector', async () => {
    // What PostgreSQL up to 14 allows every role, and upgraded databases keep.
    await db.pool.query(`GRANT CREATE ON SCHEMA public TO "${PREFIX}_producer_login"`);
    // Who called, too: other test files share the database (and its public schema), and
    // their own statements may call an unqualified unnest; only this file's logins count.
    await db.pool.query('DROP TABLE IF EXISTS public.t26_calls');
    await db.pool.query('CREATE TABLE public.t26_calls (fn text, who text DEFAULT session_user, at timestamptz DEFAULT now())');
    await db.pool.query('GRANT INSERT, SELECT ON public.t26_calls TO PUBLIC');
    for (const type of ['text[]', 'bigint[]', 'uuid[]']) {
      await as(
        'producer',
        `CREATE FUNCTION public.unnest(a ${type}) RETURNS SETOF ${type.slice(0, -2)} LANGUAGE plpgsql AS $$
         BEGIN INSERT INTO public.t26_calls (fn) VALUES ('unnest(${type})'); RETURN QUERY SELECT pg_catalog.unnest(a); END $$`,
      );
    }
    await as(
      'producer',
      `CREATE FUNCTION public.t26_times(n integer, i interval) RETURNS interval LANGUAGE plpgsql AS $$
       BEGIN INSERT INTO public.t26_calls (fn) VALUES ('*(integer, interval)'); RETURN n::float8 * i; END $$;
       CREATE OPERATOR public.* (LEFTARG = integer, RIGHTARG = interval, FUNCTION = public.t26_times)`,
    );
    const calls = async () =>
      (
        await db.pool.query<{ fn: string; n: number }>(
          'SELECT fn, count(*)::int AS n FROM public.t26_calls WHERE starts_with(who, $1) GROUP BY fn ORDER BY fn',
          [`${PREFIX}_`],
        )
      ).rows;
    // The trap works where nothing is pinned.
    await as('worker', "SELECT unnest(ARRAY['a']::text[])");
    assert.deepEqual(await calls(), [{ fn: 'unnest(text[])', n: 1 }]);
    await db.pool.query('TRUNCATE public.t26_calls');

    const admin = new Inspector({ connectionString: url('admin'), schema: db.schema, logger: false });
    const producer = new Client({ connectionString: url('producer'), schema: db.schema, logger: false });
    const server = new Server({
      connectionString: url('worker'),
      schema: db.schema,
      logger: false,
      queues: { plain: 1, limited: 1 },
      concurrency: 4,
      taskCheckInterval: 50,
      delayedTaskCheckInterval: 50,
      shutdownTimeout: 1000,
    });
    const done = new Set<string>();
    try {
      await producer.enqueue(new Task('x', null), { queue: 'limited', taskId: 'l0' });
      await admin.setQueueLimits('limited', { concurrency: 2, keyConcurrency: 1, rateLimit: { limit: 100, interval: 60_000 } });
      await server.start(async (_task, ctx) => {
        done.add(ctx.taskId);
        await ctx.writeResult({ ok: true });
      });
      await producer.enqueueMany([
        ...Array.from({ length: 5 }, (_, n) => new Task('x', null, { queue: 'plain', taskId: `p${n}`, retention: 60_000 })),
        ...Array.from({ length: 5 }, (_, n) => new Task('x', null, { queue: 'limited', taskId: `l${n + 1}`, concurrencyKey: `k${n}` })),
        new Task('x', null, { queue: 'plain', taskId: 'child', dependsOn: ['p0', 'p1'] }),
        new Task('x', null, { queue: 'plain', taskId: 'later', processIn: 100 }),
      ]);
      await producer.enqueue(new Task('y', null), { queue: 'plain', taskId: 'later', processIn: 100, replace: true });
      await waitFor(() => done.size === 13, 20_000, `every task run (${[...done].join(', ')})`);
      await admin.listCompletedTasks('plain');
      await admin.getTaskInfo('plain', 'p0');
      await admin.getQueueInfo('limited');
      await admin.deleteAllCompletedTasks('plain');
    } finally {
      await server.shutdown();
      await producer.close();
      await admin.close();
    }
    assert.deepEqual(await calls(), []);
  });

  test('no broker statement calls a polymorphic function unqualified', () => {
    // What a planted exact-typed overload would win over (the list the statements use, and their kin).
    const risky =
      /(?<![\w.])(unnest|array_agg|json_agg|jsonb_agg|json_build_array|jsonb_build_array|json_build_object|jsonb_build_object|to_json|to_jsonb|cardinality|array_length|array_position|format|count|min|max|sum|avg|string_agg|json_array_elements|json_to_recordset)\(/;
    const found: string[] = [];
    const dir = join(REPO, 'src', 'broker');
    for (const file of readdirSync(dir).filter((f) => f.endsWith('.ts') && f !== 'roles.ts' && f !== 'migrations.ts')) {
      readFileSync(join(dir, file), 'utf8')
        .split('\n')
        .forEach((line, n) => {
          if (!/^\s*(\*|\/\/|\/\*\*)/.test(line) && risky.test(line)) found.push(`${file}:${n + 1}: ${line.trim()}`);
        });
    }
    assert.deepEqual(found, []);
  });
});
