/**
 * The Server's configuration: options refused with the field they name, a
 * schema that lacks migrations, and the logging options every class takes.
 */
import assert from 'node:assert/strict';
import { describe } from 'node:test';
import {
  Client,
  ConfigError,
  FailedPreconditionError,
  Inspector,
  PeriodicTaskManager,
  Scheduler,
  Server,
  ValidationError,
  migrate,
  type ServerConfig,
} from '../src/index.js';
import { captureLog } from './logs.js';
import { MIGRATIONS, test } from './helpers.js';
import { serverFile } from './shared.js';

const { db } = serverFile('t_server_config');

describe('configuration', () => {
  const bad: [string, ServerConfig, string][] = [
    ['concurrency 0', { concurrency: 0 }, 'concurrency'],
    ['concurrency 2.5', { concurrency: 2.5 }, 'concurrency'],
    ['heartbeat not below lease / 2', { leaseDuration: 30_000, heartbeatInterval: 15_000 }, 'heartbeatInterval'],
    ['negative recoverCutoff', { recoverCutoff: -1000 }, 'recoverCutoff'],
    ['NaN shutdownTimeout', { shutdownTimeout: Number.NaN }, 'shutdownTimeout'],
    ['empty queues', { queues: {} }, 'queues'],
    ['zero weight', { queues: { a: 0 } }, 'queues.a'],
    ['bad queue name', { queues: { 'a b': 1 } }, 'queues key "a b"'],
    ['unknown key', { concurency: 3 } as ServerConfig, 'config.concurency'],
    ['string retryDelay', { retryDelay: 'x' as never }, 'retryDelay'],
    ['groupGracePeriod 50 ms', { groupGracePeriod: 50 }, 'groupGracePeriod'],
    ['bad schema', { schema: 'a;b' }, 'schema'],
  ];
  for (const [name, config, field] of bad) {
    test(`refused: ${name}`, { timeout: 30_000 }, () => {
      assert.throws(
        () => new Server({ connectionString: db.connectionString, ...config }),
        (err: unknown) => err instanceof ValidationError && err.field === field,
      );
    });
  }

  test('start refuses a schema that lacks migrations, naming them; an up-to-date one starts', { timeout: 30_000 }, async () => {
    const schema = `${db.schema}_old`;
    await db.pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    await migrate({ connectionString: db.connectionString, schema, to: '0004_storage_v2', logger: false });
    const server = new Server({ connectionString: db.connectionString, schema, logger: false });
    await assert.rejects(
      server.start(() => {}),
      (err: unknown) => {
        assert.ok(err instanceof FailedPreconditionError);
        assert.match(
          err.message,
          new RegExp(
            `schema "t_server\\w*_old" lacks migrations ${MIGRATIONS.slice(MIGRATIONS.indexOf('0004_storage_v2') + 1).join(', ')}: run \`pgasynq migrate\``,
          ),
        );
        return true;
      },
    );
    assert.equal(server.status, 'new');
    assert.equal((await db.pool.query(`SELECT count(*)::int AS n FROM "${schema}".servers`)).rows[0].n, 0, 'nothing registered');
    await migrate({ connectionString: db.connectionString, schema, logger: false });
    await server.start(() => {});
    assert.equal(server.status, 'active');
    await server.shutdown();
    await db.pool.query(`DROP SCHEMA "${schema}" CASCADE`);
  });

  test('ConfigError is a ValidationError', { timeout: 30_000 }, () => {
    assert.ok(new ConfigError('x', 'y') instanceof ValidationError);
  });
});

describe('logging', () => {
  test('logLevel and logger are validated by every class that takes ConnectionOptions, naming the option', { timeout: 30_000 }, async () => {
    const cs = db.connectionString;
    const makers: [string, (o: object) => unknown][] = [
      ['Server', (o) => new Server({ connectionString: cs, ...o })],
      ['Client', (o) => new Client({ connectionString: cs, ...o })],
      ['Inspector', (o) => new Inspector({ connectionString: cs, ...o })],
      ['Scheduler', (o) => new Scheduler({ connectionString: cs, ...o })],
      ['PeriodicTaskManager', (o) => new PeriodicTaskManager({ connectionString: cs, getConfigs: () => [], ...o })],
      ['migrate', (o) => migrate({ connectionString: cs, schema: db.schema, ...o })],
    ];
    const bad: [object, string, RegExp][] = [
      [{ logLevel: 'verbose' }, 'logLevel', /^logLevel must be one of "debug", "info", "warn", "error" \(got "verbose"\)$/],
      [{ logLevel: 30 }, 'logLevel', /must be one of/],
      [{ logger: true }, 'logger', /^logger must be a pino-shaped logger \(with debug, info, warn, error, child methods\) or false \(got true\)$/],
      [{ logger: null }, 'logger', /got null/],
      [{ logger: { info() {}, warn() {} } }, 'logger', /pino-shaped/],
      [{ logger: captureLog().logger, logLevel: 'debug' }, 'logLevel', /default logger only/],
    ];
    for (const [name, make] of makers) {
      for (const [opts, field, message] of bad) {
        const err = await (async () => {
          try {
            await make(opts);
          } catch (e) {
            return e;
          }
          return undefined;
        })();
        assert.ok(err instanceof ConfigError, `${name} ${JSON.stringify(opts)}: ${String(err)}`);
        assert.equal(err.field, field, `${name} ${JSON.stringify(opts)}`);
        assert.match(err.message, message);
      }
    }
    // Accepted: a level alone, silence (a level with it is moot), a pino-shaped object.
    for (const opts of [{ logLevel: 'warn' }, { logger: false }, { logger: false, logLevel: 'debug' }, { logger: captureLog().logger }]) {
      const c = new Client({ connectionString: cs, ...opts } as never);
      await c.close();
    }
  });
});
