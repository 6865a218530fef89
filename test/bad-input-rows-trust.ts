/**
 * Rows 44 and up of the bad-input table (see bad-input-kit.ts), ours rather
 * than the plan's: roleSetupSql()'s options, and issue #26 (the database is
 * the trust boundary): header caps, instants and durations in range, schemas
 * too long for their channels, raw errors made typed ones.
 */
import assert from 'node:assert/strict';
import * as lib from '../src/index.js';
import { Client, Inspector, Server, Task } from '../src/index.js';
import { DATABASE_URL, runCli } from './helpers.js';
import { client, db, enqueue, failOnce, MIB, option, pool, row, stillWorking, thrown, withPayload, type Row } from './bad-input-kit.js';

export const TRUST_ROWS: Row[] = [
  // roleSetupSql() only builds text: each refusal comes before any of it.
  row(44, 'roles', 'roleSetupSql({ logins: "yes" })', 'InvalidOptionError', /^logins must be a boolean/, () =>
    thrown(() => lib.roleSetupSql({ logins: 'yes' as unknown as boolean })),
  ),
  row(44, 'roles', 'roleSetupSql({ prefix: "pg_app" })', 'InvalidOptionError', /^prefix may not start with "pg_"/, () =>
    thrown(() => lib.roleSetupSql({ prefix: 'pg_app' })),
  ),
  row(
    44,
    'roles',
    'roleSetupSql({ schemas: "app" }) (a misspelt option)',
    'InvalidOptionError',
    /^options\.schemas is not a known option \(expected one of schema, prefix, logins\)$/,
    () => thrown(() => lib.roleSetupSql({ schemas: 'app' } as never)),
  ),
  // ---- issue #26 (the database is the trust boundary), findings 5, 9, 11 and 13
  // Finding 5: headers have a cap of their own, counted as stored (UTF-8 JSON text).
  row(
    45,
    'enqueue',
    'headers of 20 MB (Client with the default 1 MiB maxPayloadBytes)',
    'PayloadTooLargeError',
    /^headers are 20000008 bytes as JSON; the limit is 65536 \(headers have a cap of their own\)$/,
    option({ headers: { h: 'x'.repeat(20_000_000) } }),
  ),
  row(
    45,
    'enqueue',
    'headers with 100,000 keys',
    'PayloadTooLargeError',
    /^headers have 100000 keys; the limit is 1000$/,
    option({ headers: Object.fromEntries(Array.from({ length: 100_000 }, (_, i) => [`k${i}`, 'v'])) }),
  ),
  row(
    45,
    'enqueue',
    "the Task's headers and the enqueue's, 40 KB each: over the cap once merged",
    'PayloadTooLargeError',
    /^headers are 80015 bytes as JSON; the limit is 65536/,
    enqueue(() => new Task('h', null, { headers: { a: 'x'.repeat(40_000) } }), { headers: { b: 'y'.repeat(40_000) } }),
  ),
  {
    n: 45,
    surface: 'enqueue',
    input: 'a header value with a lone surrogate',
    error: 'InvalidOptionError',
    message: /^headers\.k value is not valid Unicode \(lone surrogate at index 1\)$/,
    attempt: option({ headers: { k: 'a\uD800' } }),
    note: 'was a raw 22P02 from PostgreSQL',
  },
  {
    n: 45,
    surface: 'enqueue',
    input: 'a header key with a lone surrogate',
    error: 'InvalidOptionError',
    message: /^headers key "a\\udc00" is not valid Unicode \(lone surrogate at index 1\)$/,
    attempt: option({ headers: { 'a\uDC00': 'v' } }),
    note: 'was a raw 22P02 from PostgreSQL',
  },
  row(
    45,
    'enqueue',
    'a header key with a NUL',
    'InvalidOptionError',
    /^headers key "a\\u0000" may not contain a NUL character \(found at index 1\)$/,
    option({ headers: { 'a\u0000': 'v' } }),
  ),
  row(45, 'enqueue', 'a header value that is a number', 'InvalidOptionError', /^headers\.n must be a string \(got 5\)$/, option({ headers: { n: 5 } })),
  // Finding 9 and 13: instants in years 0001–9999 UTC, durations at most 1000 years (MAX_DURATION_MS).
  ...(
    [
      ['processAt', new Date('+010000-01-01T00:00:00Z'), '\\+010000-01-01T00:00:00\\.000Z'],
      ['processAt', new Date('0000-12-31T23:59:59Z'), '0000-12-31T23:59:59\\.000Z'],
      ['deadline', new Date('+275760-09-13T00:00:00Z'), '\\+275760-09-13T00:00:00\\.000Z'],
    ] as const
  ).map(([field, at, shown]): Row => ({
    n: 46,
    surface: 'enqueue',
    input: `${field}: ${at.toISOString()}`,
    error: 'InvalidOptionError',
    message: new RegExp(`^${field} must lie in years 0001–9999 UTC \\(got ${shown}\\)$`),
    attempt: option({ [field]: at }),
    note: 'was a raw 22008/22009 from PostgreSQL, or a row no reader could show',
  })),
  {
    n: 46,
    surface: 'enqueue',
    input: 'retention: Number.MAX_SAFE_INTEGER',
    error: 'InvalidOptionError',
    message: /^retention must be a finite duration in ms in \[0, 31557600000000\] \(1000 years\) \(got 9007199254740991\)$/,
    attempt: option({ retention: Number.MAX_SAFE_INTEGER }),
    note: "was accepted, and the queue's Completed tab and the task page answered 500",
  },
  {
    n: 46,
    surface: 'enqueue',
    input: 'unique: 1e17',
    error: 'InvalidOptionError',
    message: /^unique must be a finite duration in ms in \[1000, 31557600000000\] \(1000 years\) \(got 100000000000000000\)$/,
    attempt: option({ unique: 1e17 }),
    note: 'was "interval out of range" from PostgreSQL',
  },
  row(
    46,
    'enqueue',
    'unique: MAX_DURATION_MS + 1',
    'InvalidOptionError',
    /^unique must be a finite duration in ms in \[1000, 31557600000000\] \(1000 years\) \(got 31557600000001\)$/,
    option({ unique: lib.MAX_DURATION_MS + 1 }),
  ),
  // Finding 11: a schema too long for its channels is refused up front, everywhere it is taken.
  ...(
    [
      ['server', () => new Server({ pool, schema: 'a'.repeat(56) })],
      ['inspector', () => new Inspector({ pool, schema: 'a'.repeat(56) })],
    ] as const
  ).map(([surface, attempt]): Row => ({
    n: 47,
    surface: surface === 'server' ? 'config' : 'inspector',
    input: `${surface}: schema of 56 characters`,
    error: 'InvalidSchemaNameError',
    message: /^schema must be 1–55 characters \(got 56\): its notification channels, such as <schema>_delayed, must fit PostgreSQL's 63-byte names$/,
    attempt: () => thrown(attempt),
  })),
  {
    n: 47,
    surface: 'CLI',
    input: 'pgasynq --schema <56 characters> stats',
    error: 'exit 2',
    message: /^error: schema must be 1–55 characters \(got 56\): its notification channels, such as <schema>_delayed, must fit PostgreSQL's 63-byte names\n$/,
    attempt: async () => {
      const r = await runCli(['--database-url', DATABASE_URL, '--schema', 'a'.repeat(56), 'stats']);
      assert.equal(r.stdout, '');
      return { name: `exit ${r.code}`, message: r.stderr };
    },
  },
  {
    n: 47,
    surface: 'CLI',
    input: 'pgasynq --schema <56 characters> migrate',
    error: 'exit 2',
    message: /^error: schema must be 1–55 characters \(got 56\)/,
    attempt: async () => {
      const r = await runCli(['--database-url', DATABASE_URL, '--schema', 'a'.repeat(56), 'migrate']);
      return { name: `exit ${r.code}`, message: r.stderr };
    },
  },
  // Finding 13: raw or untyped errors become typed ones naming the field.
  {
    n: 48,
    surface: 'enqueue',
    input: 'a payload key with a lone surrogate',
    error: 'PayloadSerializationError',
    message: /^payload has a key with a lone surrogate \(not valid Unicode\): "k\\ud800" at \$\.a$/,
    attempt: withPayload(() => ({ a: { 'k\uD800': 1 } })),
    note: 'was a raw 22P02 from PostgreSQL',
  },
  ...(
    [
      ['returns undefined', () => undefined, /^payload is not JSON-serialisable: its toJSON\(\) returned undefined at \$\.when$/],
      ['returns a BigInt', () => 10n, /^payload is not JSON-serialisable: BigInt \(encode it as a string\) at \$\.when$/],
      [
        'returns a cycle',
        () => {
          const a: Record<string, unknown> = {};
          a.self = a;
          return a;
        },
        /^payload is not JSON-serialisable: circular reference at \$\.when\.self$/,
      ],
      [
        'throws',
        () => {
          throw new Error('no clock');
        },
        /^payload is not JSON-serialisable: its toJSON\(\) threw \(no clock\) at \$\.when$/,
      ],
    ] as const
  ).map(([what, toJSON, message]): Row => ({
    n: 48,
    surface: 'enqueue',
    input: `a payload class whose toJSON() ${what}`,
    error: 'PayloadSerializationError',
    message,
    attempt: withPayload(() => ({
      when: new (class Stamp {
        toJSON = toJSON;
      })(),
    })),
    note: 'was a raw TypeError (or a payload stored as nothing)',
  })),
  row(
    48,
    'enqueue',
    'a Buffer inside a JSON payload (it has a toJSON(), which is not followed)',
    'PayloadSerializationError',
    /^payload is not JSON-serialisable: Buffer \(convert it to an array or object\) at \$\.b$/,
    withPayload(() => ({ b: Buffer.from('x') })),
  ),
  row(
    48,
    'enqueue',
    'a payload whose toJSON() returns undefined at the top',
    'PayloadSerializationError',
    /^payload is not JSON-serialisable: its toJSON\(\) returned undefined at \$$/,
    withPayload(() => ({ toJSON: () => undefined })),
  ),
  {
    n: 48,
    surface: 'enqueue',
    input: 'tx: {}',
    error: 'InvalidOptionError',
    message: /^tx must be a Kysely Transaction or a pg client inside BEGIN \(got an object with neither query\(\) nor getExecutor\(\)\)$/,
    attempt: () => thrown(() => client.enqueue(new Task('t'), { tx: {} as never })),
    note: 'was "tx.query is not a function"',
  },
  ...(['client', 'inspector'] as const).map((surface): Row => ({
    n: 48,
    surface: surface === 'client' ? 'client' : 'inspector',
    input: `${surface}: pool: {}`,
    error: 'ConfigError',
    message: /^pool must be a pg\.Pool \(an object with connect\(\), query\(\) and on\(\)\)$/,
    attempt: () => thrown(() => (surface === 'client' ? new Client({ pool: {} as never }) : new Inspector({ pool: {} as never }))),
    note: 'was "pool.on is not a function"',
  })),
  ...(['client', 'inspector'] as const).map((surface): Row => ({
    n: 48,
    surface: surface === 'client' ? 'client' : 'inspector',
    input: `${surface}: a misspelt option (maxPayloadByte)`,
    error: 'ConfigError',
    message: /^options\.maxPayloadByte is not a known option \(expected one of connectionString, pool, schema, .*maxPayloadBytes\)$/,
    attempt: () =>
      thrown(() =>
        surface === 'client'
          ? new Client({ pool, schema: db.schema, maxPayloadByte: 5 } as never)
          : new Inspector({ pool, schema: db.schema, maxPayloadByte: 5 } as never),
      ),
    note: 'was accepted and ignored (the Server refused it)',
  })),
  {
    n: 48,
    surface: 'enqueue',
    input: 'enqueueMany of 260 tasks of 1 MiB bytes each (over 512 MiB as sent)',
    error: 'PayloadTooLargeError',
    message: /^tasks take up to \d+ bytes as sent \(payloads, bytes as hex, and headers\); one call may send at most 535822336: split them into several calls$/,
    // One Task, listed 260 times: each is its own record with its own id, the MiB held once.
    attempt: () => thrown(() => client.enqueueMany(Array<Task>(260).fill(new Task('big', new Uint8Array(MIB))))),
    note: 'was "RangeError: Invalid string length", after building half a GiB of text',
  },
  {
    n: 48,
    surface: 'runtime',
    input: 'ctx.writeResult({ "k\\uD800": 1 })',
    error: 'last_error',
    message: /^PayloadSerializationError: result has a key with a lone surrogate \(not valid Unicode\): "k\\ud800" at \$$/,
    attempt: async () => {
      const r = await failOnce('result:surrogate');
      await stillWorking();
      return { name: 'last_error', message: r.error_msg ?? '' };
    },
    sqlFree: false,
    unchanged: false,
  },
];
