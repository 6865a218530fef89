/**
 * The single place where names and numbers from users are checked. Queue
 * names, task types and ids are always bind parameters in SQL; the charsets
 * here keep them safe to print in a terminal, a log line or a web page.
 */
import type { QueueLimits } from './inspector-types.js';
import { InvalidOptionError, InvalidQueueNameError, InvalidSchemaNameError, InvalidTaskIdError, InvalidTaskTypeError, type ValidationError } from './errors.js';

type ErrorClass = new (field: string, rule: string) => ValidationError;

const NAME_CHARS = /^[A-Za-z0-9_.:-]*$/;
const ID_CHARS = /^[A-Za-z0-9_.:-]*$/;
const SCHEMA = /^[a-z_][a-z0-9_]*$/;

function describe(value: unknown): string {
  if (typeof value === 'string') return JSON.stringify(value.length > 40 ? `${value.slice(0, 40)}…` : value);
  if (typeof value === 'bigint') return `${value}n`;
  if (value instanceof Date) return Number.isNaN(value.getTime()) ? 'Invalid Date' : value.toISOString();
  return typeof value === 'object' && value !== null ? typeof value : String(value);
}

/** Index and character of the first character outside `allowed`, for the error message. */
function firstBadChar(value: string, allowed: RegExp): string {
  for (let i = 0; i < value.length; i++) {
    const ch = value[i] as string;
    if (!allowed.test(ch)) return ch === '\0' ? `NUL character at index ${i}` : `found ${JSON.stringify(ch)} at index ${i}`;
  }
  return '';
}

function checkName(value: unknown, field: string, Err: ErrorClass, max: number, allowed: RegExp, charsText: string, first = /./): string {
  if (typeof value !== 'string') throw new Err(field, `must be a string (got ${describe(value)})`);
  if (value.length < 1 || value.length > max) throw new Err(field, `must be 1–${max} characters (got ${value.length})`);
  // The earliest problem is reported: "../x" is refused for its first character, not its slash.
  const head = value[0] as string;
  if (/[A-Za-z0-9_.:-]/.test(head) && !first.test(head))
    throw new Err(field, `must start with a letter, a digit or _ (found ${JSON.stringify(head)} at index 0)`);
  if (!allowed.test(value)) throw new Err(field, `may contain only ${charsText} (${firstBadChar(value, /[A-Za-z0-9_.:-]/)})`);
  return value;
}

/** Queue names: 1–100 of A–Z a–z 0–9 _ . : - */
export function queueName(value: unknown, field = 'queue'): string {
  return checkName(value, field, InvalidQueueNameError, 100, NAME_CHARS, 'A–Z a–z 0–9 _ . : -');
}

/** Group names follow the queue-name rule. */
export function groupName(value: unknown, field = 'group'): string {
  return checkName(value, field, InvalidOptionError, 100, NAME_CHARS, 'A–Z a–z 0–9 _ . : -');
}

/** Task ids: 1–128 of A–Z a–z 0–9 _ . : -, not starting with . : or - (no "../x"). */
export function taskId(value: unknown, field = 'taskId'): string {
  return checkName(value, field, InvalidTaskIdError, 128, ID_CHARS, 'A–Z a–z 0–9 _ . : -', /[A-Za-z0-9_]/);
}

/** Task types: 1–100 characters of valid Unicode, no control characters (C0, DEL, C1), not blank. */
export function taskType(value: unknown, field = 'type'): string {
  return displayText(value, field, 100, InvalidTaskTypeError);
}

/** Concurrency keys (a tenant, a customer): 1–200 characters, as task types. */
export function concurrencyKey(value: unknown, field = 'concurrencyKey'): string {
  return displayText(value, field, 200, InvalidOptionError);
}

/** Free text that is shown (types, keys): valid Unicode without control characters, so it prints safely; not blank. */
function displayText(value: unknown, field: string, max: number, Err: ErrorClass): string {
  if (typeof value !== 'string') throw new Err(field, `must be a string (got ${describe(value)})`);
  if (value.trim().length === 0 || value.length > max) {
    throw new Err(field, `must be 1–${max} characters, not blank (got ${value.length})`);
  }
  for (let i = 0; i < value.length; i++) {
    const c = value.charCodeAt(i);
    if (c < 0x20 || (c >= 0x7f && c <= 0x9f))
      throw new Err(field, `may not contain control characters (found U+${c.toString(16).padStart(4, '0')} at index ${i})`);
  }
  if (!value.isWellFormed()) throw new Err(field, `is not valid Unicode (lone surrogate at index ${loneSurrogateIndex(value)})`);
  return value;
}

/** Index of the first UTF-16 surrogate without its pair, or -1. */
export function loneSurrogateIndex(value: string): number {
  for (let i = 0; i < value.length; i++) {
    const c = value.charCodeAt(i);
    if (c >= 0xd800 && c <= 0xdbff) {
      const next = value.charCodeAt(i + 1);
      if (next >= 0xdc00 && next <= 0xdfff) i++;
      else return i;
    } else if (c >= 0xdc00 && c <= 0xdfff) return i;
  }
  return -1;
}

/**
 * The NOTIFY channels of a schema: `<schema>_tasks` and so on (broker/db.ts
 * names them from here). A channel is an identifier, so the schema's name
 * leaves room for the longest suffix.
 */
export const CHANNEL_SUFFIXES = { tasks: '_tasks', delayed: '_delayed', cancel: '_cancel', sweep: '_sweep', done: '_done', events: '_events' } as const;

/** PostgreSQL's longest identifier, in bytes (NAMEDATALEN − 1); longer ones are cut, and pg_notify() refuses them. */
export const MAX_IDENTIFIER_BYTES = 63;

const LONGEST_SUFFIX = Object.values(CHANNEL_SUFFIXES).reduce((a, b) => (b.length > a.length ? b : a));

/** The longest schema name: 55 characters, so that `<schema>_delayed` is still an identifier. */
export const MAX_SCHEMA_NAME_LENGTH = MAX_IDENTIFIER_BYTES - LONGEST_SUFFIX.length;

/** The schema pgasynq's tables live in when no `schema` option names another. */
export const DEFAULT_SCHEMA = 'pgasynq';

/**
 * Schema names are the one identifier we put into SQL text, so the rule is
 * strict: ^[a-z_][a-z0-9_]*$, at most MAX_SCHEMA_NAME_LENGTH characters, and
 * not pg_… (reserved by PostgreSQL).
 */
export function schemaName(value: unknown, field = 'schema'): string {
  if (typeof value !== 'string') throw new InvalidSchemaNameError(field, `must be a string (got ${describe(value)})`);
  if (value.length < 1 || value.length > MAX_SCHEMA_NAME_LENGTH) {
    throw new InvalidSchemaNameError(
      field,
      `must be 1–${MAX_SCHEMA_NAME_LENGTH} characters (got ${value.length}): its notification channels, such as <schema>${LONGEST_SUFFIX}, must fit PostgreSQL's ${MAX_IDENTIFIER_BYTES}-byte names`,
    );
  }
  if (!SCHEMA.test(value)) {
    throw new InvalidSchemaNameError(
      field,
      `must match ^[a-z_][a-z0-9_]*$ (${firstBadChar(value, value[0] && /[a-z_]/.test(value[0]) ? /[a-z0-9_]/ : /[a-z_]/)})`,
    );
  }
  if (value.startsWith('pg_')) throw new InvalidSchemaNameError(field, 'may not start with "pg_" (reserved by PostgreSQL)');
  return value;
}

/** An integer in [min, max]. */
export function integer(value: unknown, field: string, min: number, max: number, Err: ErrorClass = InvalidOptionError): number {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < min || value > max) {
    throw new Err(field, `must be an integer in [${min}, ${max}] (got ${describe(value)})`);
  }
  return value;
}

/** The longest duration a Node.js timer can wait (about 24.8 days): the bound of every duration something waits on. */
export const MAX_TIMER_MS = 2_147_483_647;

/**
 * The longest duration pgasynq takes anywhere (retention, unique): 1000
 * Julian years. PostgreSQL's interval holds it, and added to any instant
 * pgasynq takes (MAX_INSTANT_MS) it stays within a JavaScript Date.
 */
export const MAX_DURATION_MS = 31_557_600_000_000;

/**
 * The earliest and latest instants pgasynq takes (processAt, deadline): years
 * 0001 to 9999 UTC, which both PostgreSQL's timestamptz and a JavaScript Date
 * hold and print as ISO 8601 without a sign.
 */
export const MIN_INSTANT_MS = Date.parse('0001-01-01T00:00:00.000Z');
export const MAX_INSTANT_MS = Date.parse('9999-12-31T23:59:59.999Z');

/** Whether `d` is a valid Date in years 0001–9999 UTC: what readers print as an instant, rather than "—". */
export function inInstantRange(d: Date): boolean {
  const t = d.getTime();
  return t >= MIN_INSTANT_MS && t <= MAX_INSTANT_MS;
}

/** A duration in ms: a finite number in [min, max]. */
export function duration(value: unknown, field: string, min = 0, max = MAX_TIMER_MS, Err: ErrorClass = InvalidOptionError): number {
  if (typeof value !== 'number' || !Number.isFinite(value) || value < min || value > max) {
    const years = max === MAX_DURATION_MS ? ' (1000 years)' : '';
    throw new Err(field, `must be a finite duration in ms in [${min}, ${max}]${years} (got ${describe(value)})`);
  }
  return value;
}

/** An instant: a valid Date in years 0001–9999 UTC. */
export function date(value: unknown, field: string): Date {
  if (!(value instanceof Date)) throw new InvalidOptionError(field, `must be a Date (got ${describe(value)})`);
  if (Number.isNaN(value.getTime())) throw new InvalidOptionError(field, 'is an Invalid Date');
  if (!inInstantRange(value)) throw new InvalidOptionError(field, `must lie in years 0001–9999 UTC (got ${value.toISOString()})`);
  return value;
}

export function boolean(value: unknown, field: string, Err: ErrorClass = InvalidOptionError): boolean {
  if (typeof value !== 'boolean') throw new Err(field, `must be a boolean (got ${describe(value)})`);
  return value;
}

export function func<F>(value: unknown, field: string, Err: ErrorClass = InvalidOptionError): F {
  if (typeof value !== 'function') throw new Err(field, `must be a function (got ${describe(value)})`);
  return value as F;
}

export function plainObject(value: unknown, field: string, Err: ErrorClass = InvalidOptionError): Record<string, unknown> {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw new Err(field, `must be an object (got ${Array.isArray(value) ? 'array' : describe(value)})`);
  }
  return value as Record<string, unknown>;
}

/** Refuses keys outside `known`: a misspelt option is an error, never ignored. */
export function knownKeys(obj: Record<string, unknown>, known: readonly string[], what: string, Err: ErrorClass = InvalidOptionError): void {
  for (const key of Object.keys(obj)) {
    if (!known.includes(key)) throw new Err(`${what}.${key}`, `is not a known option (expected one of ${known.join(', ')})`);
  }
}

export { describe as describeValue };

/** The highest page number a list accepts. */
export const MAX_PAGE = 1_000_000_000;

/** A list's page when none is asked for, and the largest page one call may ask for. */
const DEFAULT_PAGE_SIZE = 30;
const MAX_PAGE_SIZE = 1000;

/** The Inspector's ListOptions ({ page?, pageSize? }) as the rows to read. */
export function listPage(opts: unknown): { limit: number; offset: number } {
  if (opts === undefined) return { limit: DEFAULT_PAGE_SIZE, offset: 0 };
  const o = plainObject(opts, 'options');
  knownKeys(o, ['page', 'pageSize'], 'options');
  const page = o.page === undefined ? 1 : integer(o.page, 'page', 1, MAX_PAGE);
  const size = o.pageSize === undefined ? DEFAULT_PAGE_SIZE : integer(o.pageSize, 'pageSize', 1, MAX_PAGE_SIZE);
  return { limit: size, offset: (page - 1) * size };
}

/** The most a queue limit (a count, or the rate's interval in ms) may be: an int4 in the queues table. */
export const MAX_LIMIT = 2_147_483_647;

/**
 * Inspector.setQueueLimits's limits: each a positive integer (the rate's
 * interval in ms), or null or left out to clear it.
 */
export function queueLimits(value: unknown): QueueLimits {
  const o = plainObject(value, 'limits');
  knownKeys(o, ['concurrency', 'keyConcurrency', 'rateLimit'], 'limits');
  const count = (v: unknown, field: string) => (v == null ? null : integer(v, field, 1, MAX_LIMIT));
  let rateLimit: QueueLimits['rateLimit'] = null;
  if (o.rateLimit != null) {
    const r = plainObject(o.rateLimit, 'rateLimit');
    knownKeys(r, ['limit', 'interval'], 'rateLimit');
    rateLimit = { limit: integer(r.limit, 'rateLimit.limit', 1, MAX_LIMIT), interval: integer(r.interval, 'rateLimit.interval', 1, MAX_LIMIT) };
  }
  return { concurrency: count(o.concurrency, 'concurrency'), keyConcurrency: count(o.keyConcurrency, 'keyConcurrency'), rateLimit };
}
