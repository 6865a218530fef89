/**
 * The least-privilege roles by name: the six kinds and how a prefix names
 * them. What each may do is the broker's (broker/roles.ts writes the grants);
 * the script is made by roleSetupSql() in src/roles.ts.
 */
import { InvalidOptionError } from './errors.js';

export const DEFAULT_ROLE_PREFIX = 'pgasynq';

/** The six group roles, by what they are for. */
export const ROLE_KINDS = ['owner', 'producer', 'worker', 'monitor', 'inspector', 'admin'] as const;
export type RoleKind = (typeof ROLE_KINDS)[number];

/** `<prefix>_<kind>` for every kind. */
export function roleNames(prefix: string = DEFAULT_ROLE_PREFIX): Record<RoleKind, string> {
  const p = rolePrefix(prefix);
  return Object.fromEntries(ROLE_KINDS.map((k) => [k, `${p}_${k}`])) as Record<RoleKind, string>;
}

// `<prefix>_inspector_login` must fit in 63 bytes.
const MAX_PREFIX = 63 - '_inspector_login'.length;

function rolePrefix(value: unknown): string {
  if (typeof value !== 'string' || !/^[a-z_][a-z0-9_]*$/.test(value) || value.length > MAX_PREFIX) {
    throw new InvalidOptionError('prefix', `must match ^[a-z_][a-z0-9_]*$ and be at most ${MAX_PREFIX} characters (got ${JSON.stringify(value)})`);
  }
  if (value.startsWith('pg_')) throw new InvalidOptionError('prefix', 'may not start with "pg_" (reserved by PostgreSQL)');
  return value;
}
