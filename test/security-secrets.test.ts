/**
 * Security test SEC4 of the reliability plan (§5.3): the database password is
 * never in a log line, an error, a stored error or CLI output, whatever it
 * holds and however the connection string spells it.
 */
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { inspect } from 'node:util';
import { after, before, describe } from 'node:test';
import pino from 'pino';
import { Client, ConfigError, Inspector, ServeMux, Server, Task, migrate, migrationStatus, type TaskContext } from '../src/index.js';
import { redact, redactConnectionString } from '../src/internal/redact.js';
import { caught, DATABASE_URL, dsnWith, runCli, test, waitFor } from './helpers.js';
import { securityFile } from './shared.js';

const { db, startServer, taskRow, taskIn } = securityFile('t_security_secrets');

// ---------------------------------------------------------------------------
describe('SEC4 secrets: the database password is never in a log line, an error or CLI output', () => {
  const sentinel = `S3CRET-${randomUUID()}`;
  // A role of our own whose password is the sentinel, so the live DSN carries it on any
  // server (with trust auth any password would do; with password auth only the right one).
  const role = `pgasynq_sec4_${randomUUID().slice(0, 8)}`;
  // The sentinel is the sslpassword too, which pg keeps for an encrypted client key and sends nowhere.
  const dsn = (parts: { host?: string; port?: string | number }) => {
    const url = dsnWith({ user: role, password: sentinel, ...parts });
    return `${url}${url.includes('?') ? '&' : '?'}sslpassword=${sentinel}`;
  };
  const LIVE = dsn({});
  const CLOSED = dsn({ port: 1 });
  const BAD_PORT = dsn({ port: 'notaport' });
  const BAD_HOST = dsn({ host: 'no-such-host.invalid' });
  before(async () => {
    // Roles are per cluster: a unique name, dropped afterwards. Superuser, to read the test schema as postgres does.
    await db.pool.query(`CREATE ROLE ${role} LOGIN SUPERUSER PASSWORD '${sentinel}'`);
  });
  after(async () => {
    await db.pool.query(`DROP ROLE IF EXISTS ${role}`);
  });
  /** Everything a user or an operator could see. */
  const seen: string[] = [];
  const logLines: string[] = [];
  const logger = pino({ level: 'debug' }, { write: (line: string) => void logLines.push(line) });
  /** An attempt that makes an object, uses it, then closes it, whatever the use did. */
  const closing =
    <T extends { close(): Promise<void> }>(make: () => T, use: (o: T) => Promise<unknown>) =>
    async () => {
      const o = make();
      try {
        await use(o);
      } finally {
        await o.close();
      }
    };
  const record = (err: unknown) => seen.push(String(err), inspect(err, { depth: 8 }), JSON.stringify(err) ?? '');

  test('library: Client, Inspector, Server (debug logs), migrate, against live, closed and malformed DSNs', { timeout: 90_000 }, async () => {
    const client = new Client({ connectionString: LIVE, schema: db.schema, logger });
    const inspector = new Inspector({ connectionString: LIVE, schema: db.schema, logger });
    const server = await startServer(
      new ServeMux()
        .handle('ok', (_t, ctx: TaskContext) => ctx.logger.debug({ note: 'handled' }, 'handled'))
        .handle('fail', () => {
          throw new Error('handler failed');
        }),
      { connectionString: LIVE, queues: { sec4: 1 }, logger, retryDelay: () => 3_600_000 },
    );
    const ok = await client.enqueue(new Task('ok'), { queue: 'sec4', retention: 60_000 });
    const failed = await client.enqueue(new Task('fail'), { queue: 'sec4' });
    await waitFor(async () => (await taskRow(ok.id))?.state === 'completed' && (await taskRow(failed.id))?.state === 'retry', 20_000);
    seen.push(JSON.stringify(await inspector.getTaskInfo('sec4', ok.id)), JSON.stringify(await inspector.getTaskInfo('sec4', failed.id)));
    seen.push(JSON.stringify(await inspector.getQueueInfo('sec4')), JSON.stringify(await inspector.servers()));
    await server.shutdown();
    await inspector.close();
    await client.close();

    // A server whose database is not there: it logs every failure (debug level), never the password.
    const downFrom = logLines.length;
    const down = await startServer(() => {}, { connectionString: CLOSED, logger });
    // Until every component that touches the database has logged its failure at least once.
    const failingComponents = () =>
      new Set(
        logLines
          .slice(downFrom)
          .map((l) => JSON.parse(l) as { component?: string; err?: unknown })
          .filter((l) => l.err !== undefined)
          .map((l) => l.component),
      );
    const touching = ['database', 'notifier', 'processor', 'heartbeater', 'recoverer', 'forwarder'];
    await waitFor(() => touching.every((c) => failingComponents().has(c)), 20_000, `${touching.join(', ')} logged their failures`);
    await down.shutdown();

    for (const attempt of [
      () => new Client({ connectionString: BAD_PORT }),
      () => new Inspector({ connectionString: BAD_PORT }),
      () => new Server({ connectionString: BAD_PORT }),
      () => new Client({ connectionString: 'postgres:/postgres:' + sentinel + '@127.0.0.1/test' }),
      ...[CLOSED, BAD_HOST].map((connectionString) =>
        closing(
          () => new Client({ connectionString, logger }),
          (c) => c.enqueue(new Task('t')),
        ),
      ),
      closing(
        () => new Inspector({ connectionString: CLOSED, logger }),
        (i) => i.queues(),
      ),
      () => migrate({ connectionString: CLOSED, schema: db.schema }),
      () => migrationStatus({ connectionString: BAD_HOST, schema: db.schema }),
    ]) {
      record(await caught(attempt));
    }
    const configErr = await caught(() => new Client({ connectionString: BAD_PORT }));
    assert.ok(configErr instanceof ConfigError);
    assert.ok((configErr as Error).message.includes(BAD_PORT.replaceAll(sentinel, '***')), (configErr as Error).message);

    assert.ok(logLines.length > 10, `the server logged (${logLines.length} lines)`);
    assert.ok(
      logLines.some((l) => /"level":20/.test(l)),
      'debug lines were written',
    );
    const hits = [...seen, ...logLines].filter((s) => s.includes(sentinel));
    assert.deepEqual(hits, [], 'the password appears nowhere');
    // The stored errors too.
    const errors = await db.query<{ e: string }>("SELECT string_agg(coalesce(error_msg, ''), '\n') AS e FROM {{schema}}.tasks");
    assert.ok(!(errors[0]?.e ?? '').includes(sentinel));
  });

  test('CLI: stats, task inspect, a failing migrate, with --debug, by flag and by DATABASE_URL', { timeout: 120_000 }, async () => {
    const client = new Client({ connectionString: LIVE, schema: db.schema });
    const info = await client.enqueue(new Task('cli:t', { a: 1 }), { queue: 'sec4cli' });
    await client.close();
    const outputs: string[] = [];
    const runs: [string[], Record<string, string>, number][] = [
      [['--database-url', LIVE, '--schema', db.schema, 'stats'], {}, 0],
      [['--schema', db.schema, 'stats'], { DATABASE_URL: LIVE }, 0],
      [['--database-url', LIVE, '--schema', db.schema, 'task', 'inspect', 'sec4cli', info.id], {}, 0],
      [['--database-url', LIVE, '--schema', db.schema, '--json', 'task', 'inspect', 'sec4cli', info.id], {}, 0],
      [['--database-url', CLOSED, '--schema', db.schema, 'migrate'], {}, 1],
      [['--debug', '--database-url', CLOSED, '--schema', db.schema, 'migrate'], {}, 1],
      [['--debug', '--schema', db.schema, 'migrate'], { DATABASE_URL: CLOSED }, 1],
      [['--debug', '--database-url', BAD_HOST, 'stats'], {}, 1],
      [['--debug', '--database-url', BAD_PORT, 'stats'], {}, 2],
      [['--debug', '--database-url', LIVE, '--schema', 'no_such_schema_sec4', 'stats'], {}, 1],
    ];
    for (const [args, env, code] of runs) {
      const r = await runCli(args, env);
      assert.equal(r.code, code, `${args.join(' ')}: exit ${r.code}; ${r.stderr}`);
      outputs.push(r.stdout, r.stderr);
    }
    assert.ok(
      outputs.some((o) => /cannot reach the database/.test(o)),
      'the failing migrate said why',
    );
    assert.deepEqual(
      outputs.filter((o) => o.includes(sentinel)),
      [],
      'the password appears in no CLI output',
    );
  });

  test("a DSN inside a handler error is masked in last_error and in the failed attempt's log line", { timeout: 30_000 }, async () => {
    const client = new Client({ connectionString: DATABASE_URL, schema: db.schema });
    const lines: string[] = [];
    const server = await startServer(
      () => {
        throw new Error(`could not reach ${dsn({ host: 'db.example', port: 5432 })}`);
      },
      { queues: { sec4err: 1 }, retryDelay: () => 3_600_000, logger: pino({ level: 'debug' }, { write: (l: string) => void lines.push(l) }) },
    );
    try {
      const info = await client.enqueue(new Task('leaky'), { queue: 'sec4err' });
      const row = await taskIn(info.id, 'retry');
      const masked = `could not reach ${dsn({ host: 'db.example', port: 5432 }).replaceAll(sentinel, '***')}`;
      assert.equal(row.error_msg, masked);
      const failedLine = await waitFor(() =>
        lines.map((l) => JSON.parse(l) as { msg: string; err?: { message: string; stack: string } }).find((l) => l.msg === 'task failed; will retry'),
      );
      assert.equal(failedLine.err?.message, masked);
      assert.ok(failedLine.err?.stack.startsWith(`Error: ${masked}`), failedLine.err?.stack);
    } finally {
      await server.shutdown();
      await client.close();
    }
    assert.deepEqual(
      lines.filter((l) => l.includes(sentinel)),
      [],
      'no log line holds the password',
    );
  });
});

describe('SEC4 secrets: passwords with / ? # @ : and spaces, sslpassword, key=value strings', () => {
  /** Each piece of a password is a marker of its own, so a leak of any part of one shows. */
  const mark = randomUUID().slice(0, 8);
  const piece = (letter: string) => `${letter}${mark}`;
  const PIECES = ['A', 'B', 'C', 'D', 'E', 'F', 'G', 'H', 'K'].map(piece);
  const [A, B, C, D, E, F, G, H, K] = PIECES as [string, string, string, string, string, string, string, string, string];
  const ODD = `${A}#${B}?${C}/${D}@${E}:${F}`;
  /** Connection strings no server answers (port 1, or a key=value string pg cannot use), each holding secrets. */
  const DSNS = [
    `postgres://postgres:${ODD}@127.0.0.1:1/test`,
    `postgres://postgres:${A}/${B}@127.0.0.1:5432/test`, // once: invalid port "A…"
    `postgres://postgres:${C}#${D}@127.0.0.1/test`,
    `postgres://postgres:${E}?${F}@127.0.0.1:1/test`,
    `postgres://postgres:${A}@${B}:${C}@127.0.0.1:1/test`, // a valid URL: the last @ ends the password
    `postgres://postgres:${D} ${E}@127.0.0.1:1/test`,
    `postgres://postgres:${encodeURIComponent(ODD)}@127.0.0.1:1/test`,
    `postgres://me@tenant:${F}@127.0.0.1:1/test`,
    `postgres://postgres@127.0.0.1:1/test?sslmode=disable&sslpassword=${G}&password=${H}`,
    `postgres://postgres:${K}@127.0.0.1:1/test?sslpassword=${encodeURIComponent(ODD)}&application_name=x`,
    `host=127.0.0.1 port=1 user=postgres password=${A} sslpassword='${B} ${C}' dbname=test`,
    `host=127.0.0.1 port=1 password = '${D}\\'${E}' sslpassword=${F}#${G}`,
  ];
  const leaks = (texts: string[]) => texts.flatMap((t) => PIECES.filter((p) => t.includes(p)).map((p) => `${p} in ${JSON.stringify(t.slice(0, 300))}`));

  test('redact(): the whole password, whatever it holds; sslpassword and password in URLs and key=value strings', (t) => {
    const cases: [string, string][] = [
      [`postgres://u:${ODD}@db:5432/q`, 'postgres://u:***@db:5432/q'],
      [`failed: postgres://u:${ODD}@db/q, retrying`, 'failed: postgres://u:***@db/q, retrying'],
      [`postgres://me@tenant:${A}@db/q`, 'postgres://me@tenant:***@db/q'],
      [
        `postgres://u:${A}@db/q?sslmode=require&sslpassword=${ODD}&application_name=x`,
        'postgres://u:***@db/q?sslmode=require&sslpassword=***&application_name=x',
      ],
      [`postgres://u@db/q?password=${B}`, 'postgres://u@db/q?password=***'],
      [`host=db password=${A} sslpassword='${B} ${C}' dbname=q`, 'host=db password=*** sslpassword=*** dbname=q'],
      [`PGPASSWORD=${D} psql`, 'PGPASSWORD=*** psql'],
      ['postgres://u@db:5432/q', 'postgres://u@db:5432/q'],
      ['password authentication failed for user "u"', 'password authentication failed for user "u"'],
    ];
    for (const [input, expected] of cases) assert.equal(redact(input), expected, input);
    for (const dsn of DSNS) assert.deepEqual(leaks([redactConnectionString(dsn)]), [], dsn);
    assert.equal(redactConnectionString(`postgres://u:${D} ${E}@db/q`), 'postgres://u:***@db/q', 'a whole string: the password may hold a space');
    // Linear time on text a handler controls (every stored error goes through redact()). Judged
    // by size, not by time: on these 4.8 MB a scan quadratic in the text would take hours and
    // fail the test by its timeout, where a linear one takes milliseconds (in the diagnostic).
    const n = 200_000;
    const hostile = `${'a://b:'.repeat(n)} ${'postgres:'.repeat(n)}@ ${'?password'.repeat(n)}`;
    const start = performance.now();
    const redacted = redact(hostile);
    t.diagnostic(`redact() took ${(performance.now() - start).toFixed(1)} ms on ${hostile.length} characters`);
    assert.equal(
      redacted,
      `${'a://b:'.repeat(n)} postgres:postgres:***@ ${'?password'.repeat(n)}`,
      'the run before the @ reads as user postgres and a password: masked; the rest kept',
    );
  });

  test('library: the ConfigError or connection error of each odd DSN holds no part of a secret', { timeout: 60_000 }, async () => {
    const seen: string[] = [];
    const logLines: string[] = [];
    const logger = pino({ level: 'debug' }, { write: (line: string) => void logLines.push(line) });
    for (const dsn of DSNS) {
      const err = await caught(async () => {
        const c = new Client({ connectionString: dsn, logger });
        try {
          await c.enqueue(new Task('t'));
        } finally {
          await c.close();
        }
      });
      seen.push(String(err), inspect(err, { depth: 8 }), JSON.stringify(err) ?? '');
      try {
        // Validated at construction; nothing connects until start().
        new Server({ connectionString: DATABASE_URL, schema: db.schema, listenConnectionString: dsn });
      } catch (e) {
        seen.push(String(e));
      }
    }
    const bad = await caught(() => new Client({ connectionString: DSNS[1] }));
    assert.ok(bad instanceof ConfigError, String(bad));
    assert.match((bad as Error).message, /^connectionString is not a valid URL \(postgres:\/\/postgres:\*\*\*@127\.0\.0\.1:5432\/test\): percent-encode/);
    assert.deepEqual(leaks([...seen, ...logLines]), []);
  });

  test('CLI: no part of a secret in the output, by flag or by DATABASE_URL, with --debug', { timeout: 180_000 }, async () => {
    const outputs: string[] = [];
    const runs: [string[], Record<string, string>][] = DSNS.map((dsn) => [['--debug', '--database-url', dsn, 'stats'], {}]);
    runs.push([['--debug', 'stats'], { DATABASE_URL: DSNS[0] as string }], [['--debug', '--json', 'queue', 'ls'], { DATABASE_URL: DSNS[10] as string }]);
    runs.push([['--debug', '--database-url', 'postgres://postgres@127.0.0.1:1/test', 'stats'], { PGPASSWORD: ODD }]);
    for (const [args, env] of runs) {
      const r = await runCli(args, env);
      assert.ok(r.code === 1 || r.code === 2, `${args.join(' ')}: exit ${r.code}; ${r.stderr}`);
      assert.match(r.stderr, /^error: /, r.stderr);
      outputs.push(r.stdout, r.stderr);
    }
    assert.deepEqual(leaks(outputs), []);
  });
});
