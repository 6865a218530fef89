/**
 * The driver's errors, sorted at the broker boundary into what callers can
 * act on:
 *
 *   - permanent: the database cannot be used and waiting will not change it
 *     (unknown database 3D000, unknown role or failed authentication 28000 /
 *     28P01, a server asking for a password the connection string lacks, an
 *     unknown host ENOTFOUND) → DatabaseUnavailableError;
 *   - transient: the database is unreachable or restarting (ECONNREFUSED,
 *     timeouts, resets, 57P0x, class 08, too many connections): the error is
 *     passed on unchanged, and long-running components retry it;
 *   - an unmigrated schema: a table, schema or function of ours missing
 *     (42P01, 3F000, 42883 naming our schema) → FailedPreconditionError that
 *     says to run `pgasynq migrate`. Detected when it happens, so no call pays
 *     for a check beforehand.
 *
 * EAI_AGAIN (a name server that did not answer) is transient: DNS comes back.
 */
import { DatabaseUnavailableError, FailedPreconditionError } from '../model/errors.js';

/** Codes of connection failures that may go away: network errors, and SQLSTATEs of a server shutting down, starting up, or full. */
const TRANSIENT_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ECONNABORTED',
  'ETIMEDOUT',
  'EHOSTUNREACH',
  'EHOSTDOWN',
  'ENETUNREACH',
  'ENETDOWN',
  'EPIPE',
  'EAI_AGAIN',
  '57P01', // admin_shutdown
  '57P02', // crash_shutdown
  '57P03', // cannot_connect_now (starting up, recovering)
  '53300', // too_many_connections
]);

/** pg's messages for connection failures that carry no code. */
const TRANSIENT_MESSAGES =
  /Connection terminated|timeout exceeded when trying to connect|Connection ended unexpectedly|Client has encountered a connection error/i;

/** The code of an error; for a host with several addresses (an AggregateError of one error per address), the first one's. */
export function errorCode(err: unknown): string | undefined {
  const code = (err as { code?: unknown } | null)?.code;
  if (typeof code === 'string') return code;
  if (err instanceof AggregateError) return errorCode(err.errors[0]);
  return undefined;
}

/** True for a failure to reach or keep the database that may go away by itself. */
export function isTransientConnectionError(err: unknown): boolean {
  const code = errorCode(err);
  if (code !== undefined && (TRANSIENT_CODES.has(code) || code.startsWith('08'))) return true;
  return err instanceof Error && code === undefined && TRANSIENT_MESSAGES.test(err.message);
}

/** The DatabaseUnavailableError for a permanent connection failure, or undefined. `target` names the server: "host:port/database". */
export function permanentConnectionError(err: unknown, target: string): DatabaseUnavailableError | undefined {
  if (err instanceof DatabaseUnavailableError) return err;
  const code = errorCode(err);
  const message = err instanceof Error ? err.message : String(err);
  const on = target === '' ? '' : ` (server ${target})`;
  switch (code) {
    case '3D000':
      return new DatabaseUnavailableError('database-not-found', `${message}${on}: create it, or correct the database name in the connection string`, {
        cause: err,
      });
    case '28000':
    case '28P01':
      return new DatabaseUnavailableError('authentication-failed', `${message}${on}: check the user and password of the connection string`, { cause: err });
    case 'ENOTFOUND': {
      const host = (err as { hostname?: unknown }).hostname;
      const name = typeof host === 'string' ? `"${host}"` : `of ${target}`;
      return new DatabaseUnavailableError('host-not-found', `unknown host ${name} (${message}): check the host in the connection string`, { cause: err });
    }
  }
  // pg's SCRAM client, when the server asks for a password and none was given.
  if (code === undefined && /^SASL: .*password must be a string/.test(message)) {
    return new DatabaseUnavailableError('authentication-failed', `the server${on} asks for a password and the connection string has none`, { cause: err });
  }
  return undefined;
}

const MISSING_OBJECT = new Set(['42P01', '3F000', '42883']);

/** The FailedPreconditionError for a table, function or schema of `schema` that does not exist, or undefined. */
export function notMigratedError(err: unknown, schema: string): FailedPreconditionError | undefined {
  const code = errorCode(err);
  if (code === undefined || !MISSING_OBJECT.has(code) || !(err instanceof Error)) return undefined;
  // Ours only: 'relation "s.tasks" does not exist', 'schema "s" does not exist', 'function s.queue_counts(text) does not exist'.
  // The schema was validated as [a-z_][a-z0-9_]*, so it needs no escaping in a pattern.
  if (!new RegExp(`(?:^|[\\s"])${schema}(?:\\.|")`).test(err.message)) return undefined;
  return new FailedPreconditionError(`schema "${schema}" is not migrated (${err.message}): run \`pgasynq migrate\` (or migrate()) first`, { cause: err });
}

/**
 * What a statement's error becomes at the broker boundary: a
 * DatabaseUnavailableError, a FailedPreconditionError for an unmigrated
 * schema, or the error itself.
 */
export function mapDbError(err: unknown, db: { readonly schema: string; readonly target: string }): unknown {
  return permanentConnectionError(err, db.target) ?? notMigratedError(err, db.schema) ?? err;
}
