/**
 * roleSetupSql(): the script that creates pgasynq's least-privilege roles
 * and grants them what its statements need (`pgasynq roles` prints it).
 * This front checks the options; broker/roles.ts writes the SQL.
 */
import { DEFAULT_SCHEMA } from './model/validate.js';
import { buildRoleSetupSql } from './broker/roles.js';
import { DEFAULT_ROLE_PREFIX, roleNames } from './model/roles.js';
import * as v from './model/validate.js';

export { DEFAULT_ROLE_PREFIX, ROLE_KINDS, roleNames, type RoleKind } from './model/roles.js';

/** Options of roleSetupSql(). */
export interface RoleSetupOptions {
  /** The schema the roles are for. @defaultValue 'pgasynq' */
  schema?: string;
  /** Role names are `<prefix>_owner`, `<prefix>_worker`, … @defaultValue 'pgasynq' */
  prefix?: string;
  /**
   * Also create one LOGIN role per group role, `<prefix>_<kind>_login`, with
   * no password (set one with `\password` in psql, or use certificates or
   * peer authentication). The owner's login switches to the owner role at
   * connect, so objects that migrations create belong to the owner role.
   * @defaultValue false
   */
  logins?: boolean;
}

/**
 * The SQL that creates the roles and grants them exactly what pgasynq's
 * statements need on `schema`. Run it as a superuser (or as a role with
 * CREATEROLE that may SET ROLE to these roles) before and after each
 * `pgasynq migrate`; it is safe to run any number of times. A bad option is
 * an InvalidOptionError naming it.
 */
export function roleSetupSql(opts: RoleSetupOptions = {}): string {
  const o = v.plainObject(opts, 'options');
  v.knownKeys(o, ['schema', 'prefix', 'logins'], 'options');
  const schema = v.schemaName(o.schema ?? DEFAULT_SCHEMA);
  const names = roleNames((o.prefix as string | undefined) ?? DEFAULT_ROLE_PREFIX);
  const logins = o.logins === undefined ? false : v.boolean(o.logins, 'logins');
  return buildRoleSetupSql(schema, names, logins);
}
