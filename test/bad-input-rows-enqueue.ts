/**
 * Rows 1–25 of the bad-input table (see bad-input-kit.ts): what enqueue(), a
 * Client and migrate() take: queue names, task types, payloads, retry and
 * timing options, schema names, task ids, unique.
 */
import { Client, migrate, Task } from '../src/index.js';
import { client, db, deep, enqueue, MIB, option, pool, row, thrown, withPayload, type Row } from './bad-input-kit.js';

export const ENQUEUE_ROWS: Row[] = [
  row(1, 'enqueue', 'queue ""', 'InvalidQueueNameError', /^queue must be 1–100 characters \(got 0\)$/, option({ queue: '' })),
  row(2, 'enqueue', 'queue of 101 × a', 'InvalidQueueNameError', /^queue must be 1–100 characters \(got 101\)$/, option({ queue: 'a'.repeat(101) })),
  row(
    3,
    'enqueue',
    'queue " default"',
    'InvalidQueueNameError',
    /^queue may contain only A–Z a–z 0–9 _ \. : - \(found " " at index 0\)$/,
    option({ queue: ' default' }),
  ),
  row(
    4,
    'enqueue',
    `queue "default'; DROP TABLE tasks;--"`,
    'InvalidQueueNameError',
    /^queue may contain only .* \(found "'" at index 7\)$/,
    option({ queue: "default'; DROP TABLE tasks;--" }),
  ),
  {
    n: 5,
    surface: 'enqueue',
    input: 'queue "a\\u0000b"',
    error: 'InvalidQueueNameError',
    message: /^queue may contain only .* \(NUL character at index 1\)$/,
    attempt: option({ queue: 'a\u0000b' }),
    note: 'refused on the client, never PostgreSQL 22021',
  },
  row(
    6,
    'enqueue',
    'task type ""',
    'InvalidTaskTypeError',
    /^type must be 1–100 characters, not blank \(got 0\)$/,
    enqueue(() => new Task('')),
  ),
  row(
    7,
    'enqueue',
    'task type "email:\\uD800"',
    'InvalidTaskTypeError',
    /^type is not valid Unicode \(lone surrogate at index 6\)$/,
    enqueue(() => new Task('email:\uD800')),
  ),
  row(
    8,
    'enqueue',
    'payload { amount: 10n }',
    'PayloadSerializationError',
    /^payload is not JSON-serialisable: BigInt \(encode it as a string\) at \$\.amount$/,
    withPayload(() => ({ amount: 10n })),
  ),
  {
    n: 9,
    surface: 'enqueue',
    input: 'payload with a cycle (a.self = a)',
    error: 'PayloadSerializationError',
    message: /^payload is not JSON-serialisable: circular reference at \$\.self$/,
    attempt: withPayload(() => {
      const a: Record<string, unknown> = { x: 1 };
      a.self = a;
      return a;
    }),
  },
  row(
    10,
    'enqueue',
    'payload of 1,048,577 bytes (cap 1 MiB)',
    'PayloadTooLargeError',
    /^payload is 1048577 bytes as JSON; the limit is 1048576 \(option maxPayloadBytes\)$/,
    withPayload(() => 'x'.repeat(MIB - 1)),
  ),
  row(
    10,
    'enqueue',
    'bytes payload of 1,048,577 bytes',
    'PayloadTooLargeError',
    /^payload is 1048577 bytes; the limit is 1048576 \(option maxPayloadBytes\)$/,
    withPayload(() => new Uint8Array(MIB + 1)),
  ),
  row(
    10,
    'enqueue',
    'payload of 101 bytes, Client maxPayloadBytes: 100',
    'PayloadTooLargeError',
    /^payload is 101 bytes as JSON; the limit is 100 \(option maxPayloadBytes\)$/,
    () => thrown(() => new Client({ pool, schema: db.schema, maxPayloadBytes: 100 }).enqueue(new Task('t', 'x'.repeat(99)))),
  ),
  {
    n: 10,
    surface: 'enqueue',
    input: 'enqueueMany, second payload over maxPayloadBytes: 100',
    error: 'PayloadTooLargeError',
    message: /^tasks\[1\]\.payload is 101 bytes as JSON; the limit is 100 \(option maxPayloadBytes\)$/,
    attempt: () =>
      thrown(() => new Client({ pool, schema: db.schema, maxPayloadBytes: 100 }).enqueueMany([new Task('t', 'ok'), new Task('t', 'x'.repeat(99))])),
  },
  row(10, 'config', 'Client maxPayloadBytes: 0', 'ConfigError', /^maxPayloadBytes must be an integer in \[1, 268435455\] \(got 0\)$/, () =>
    thrown(() => new Client({ pool, schema: db.schema, maxPayloadBytes: 0 })),
  ),
  row(
    11,
    'enqueue',
    'payload { f: () => 1 }',
    'PayloadSerializationError',
    /^payload is not JSON-serialisable: function at \$\.f$/,
    withPayload(() => ({ f: () => 1 })),
  ),
  row(
    12,
    'enqueue',
    'payload { ratio: NaN }',
    'PayloadSerializationError',
    /^payload is not JSON-serialisable: non-finite number NaN at \$\.ratio$/,
    withPayload(() => ({ ratio: Number.NaN })),
  ),
  row(
    13,
    'enqueue',
    'payload nested 1,000 levels deep',
    'PayloadSerializationError',
    /^payload nesting depth exceeds the limit of 64 levels at \$(\.a){59}\.…$/,
    withPayload(() => deep(1000)),
  ),
  row(14, 'enqueue', 'maxRetry: -1', 'InvalidOptionError', /^maxRetry must be an integer in \[0, 1000\] \(got -1\)$/, option({ maxRetry: -1 })),
  row(15, 'enqueue', 'maxRetry: 2.5', 'InvalidOptionError', /^maxRetry must be an integer in \[0, 1000\] \(got 2\.5\)$/, option({ maxRetry: 2.5 })),
  ...[-1000, Number.NaN, Number.POSITIVE_INFINITY].map((timeout): Row => ({
    n: 16,
    surface: 'enqueue',
    input: `timeout: ${timeout}`,
    error: 'InvalidOptionError',
    message: new RegExp(`^timeout must be a finite duration in ms in \\[0, 2147483647\\] \\(got ${timeout}\\)$`),
    attempt: option({ timeout }),
    note: 'timeout: 0 means "not set" (EnqueueOptions.timeout) and is accepted; the upper bound is 2^31-1 ms, not 24 h',
  })),
  row(17, 'enqueue', "processAt: new Date('nope')", 'InvalidOptionError', /^processAt is an Invalid Date$/, option({ processAt: new Date('nope') })),
  ...(
    [
      [18, 'public; DROP SCHEMA public CASCADE', /^schema must match \^\[a-z_\]\[a-z0-9_\]\*\$ \(found ";" at index 6\)$/],
      [19, 'pg_catalog', /^schema may not start with "pg_" \(reserved by PostgreSQL\)$/],
      [19, 'pg_pgq', /^schema may not start with "pg_" \(reserved by PostgreSQL\)$/],
      [20, "o'brien", /^schema must match .* \(found "'" at index 1\)$/],
      [20, 'a$$b', /^schema must match .* \(found "\$" at index 1\)$/],
      [20, 'Queue', /^schema must match .* \(found "Q" at index 0\)$/],
      [20, 'x.job', /^schema must match .* \(found "\." at index 1\)$/],
      [21, '', /^schema must be 1–55 characters \(got 0\): its notification channels, such as <schema>_delayed, must fit PostgreSQL's 63-byte names$/],
      [21, 'a'.repeat(64), /^schema must be 1–55 characters \(got 64\): .*_delayed/],
      // Issue #26 finding 11: <schema>_delayed must be an identifier (pg_notify refused 56–63 characters: 22023).
      [
        21,
        'a'.repeat(56),
        /^schema must be 1–55 characters \(got 56\): its notification channels, such as <schema>_delayed, must fit PostgreSQL's 63-byte names$/,
      ],
    ] as const
  ).flatMap(([n, schema, message]): Row[] => [
    {
      n,
      surface: 'client',
      input: `schema ${JSON.stringify(schema.length > 24 ? `${schema.slice(0, 24)}… (${schema.length} characters)` : schema)}`,
      error: 'InvalidSchemaNameError',
      message,
      attempt: () => thrown(() => new Client({ pool, schema })),
    },
    {
      n,
      surface: 'migrate',
      input: `schema ${JSON.stringify(schema.length > 24 ? `${schema.slice(0, 24)}… (${schema.length} characters)` : schema)}`,
      error: 'InvalidSchemaNameError',
      message,
      attempt: () => thrown(() => migrate({ pool, schema })),
    },
  ]),
  row(
    22,
    'enqueue',
    'task id "../etc/passwd"',
    'InvalidTaskIdError',
    /^taskId must start with a letter, a digit or _ \(found "\." at index 0\)$/,
    option({ taskId: '../etc/passwd' }),
  ),
  row(
    22,
    'enqueue',
    'task id "a b"',
    'InvalidTaskIdError',
    /^taskId may contain only A–Z a–z 0–9 _ \. : - \(found " " at index 1\)$/,
    option({ taskId: 'a b' }),
  ),
  row(22, 'enqueue', 'task id of 200 characters', 'InvalidTaskIdError', /^taskId must be 1–128 characters \(got 200\)$/, option({ taskId: 'i'.repeat(200) })),
  {
    n: 23,
    surface: 'enqueue',
    input: 'a task id that already exists in the queue',
    error: 'TaskIdConflictError',
    message: /^task ID conflicts with another task: id=x in queue "q"$/,
    setup: async () => {
      await db.query('DELETE FROM {{schema}}.tasks WHERE queue = $1 AND id = $2', ['q', 'x']);
      await client.enqueue(new Task('dup'), { queue: 'q', taskId: 'x' });
    },
    attempt: enqueue(() => new Task('dup:other'), { queue: 'q', taskId: 'x' }),
    sqlFree: false,
    note: "asynq's wording (ErrTaskIDConflict); needs the database, so SQL is sent",
  },
  row(
    24,
    'enqueue',
    'unique: 0',
    'InvalidOptionError',
    /^unique must be a finite duration in ms in \[1000, 31557600000000\] \(1000 years\) \(got 0\)$/,
    option({ unique: 0 }),
  ),
  row(
    24,
    'enqueue',
    'unique: -1000',
    'InvalidOptionError',
    /^unique must be a finite duration in ms in \[1000, 31557600000000\] \(1000 years\) \(got -1000\)$/,
    option({ unique: -1000 }),
  ),
  row(
    25,
    'enqueue',
    'processIn: -5000',
    'InvalidOptionError',
    /^processIn must be a finite duration in ms in \[0, 2147483647\] \(got -5000\)$/,
    option({ processIn: -5000 }),
  ),
];
