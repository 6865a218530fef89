/**
 * The database is the trust boundary: what a login that is not the owner can
 * do to other tenants' tasks through its grants, tried as the roles of
 * `pgasynq roles` with the exploits a security review found
 * (trust-roles-producer, -worker and -session test it).
 *
 * What those files share (not a test file itself): the roles with their
 * logins, made for each file under a prefix of its own on the test database
 * (roles are the cluster's, so two files never share one), a pool per login,
 * SQL run as one of them, and the refusal a statement must meet.
 */
import assert from 'node:assert/strict';
import { after, before } from 'node:test';
import pg from 'pg';
import { roleSetupSql } from '../src/index.js';
import { dsnWith, testDb, type TestDb } from './helpers.js';

const KINDS = ['owner', 'producer', 'worker', 'monitor', 'inspector', 'admin'] as const;
type Kind = (typeof KINDS)[number];

// The file's database and its roles' prefix, set by setupTrustRoles() (each test file is a process of its own).
export let db: TestDb;
let PREFIX: string;
export const pools = new Map<Kind, pg.Pool>();
/** The logins' password: a server that asks for one (the embedded PostgreSQL) gets it; trust ignores it. */
const PASSWORD = 'trust-roles-pw';
export const url = (kind: Kind) => dsnWith({ user: `${PREFIX}_${kind}_login`, password: PASSWORD });
export const as = (kind: Kind, text: string, values?: unknown[]) => pools.get(kind)!.query(text.replaceAll('{{S}}', `"${db.schema}"`), values);

/** Rejects with SQLSTATE `code`, and nothing else. */
export async function refused(p: Promise<unknown>, what: string, code = '42501'): Promise<Error & { column?: string }> {
  let error: unknown;
  await assert.rejects(p, (err: { code?: string; message?: string }) => {
    assert.equal(err?.code, code, `${what}: expected SQLSTATE ${code}, got ${err?.code}: ${err?.message}`);
    error = err;
    return true;
  });
  return error as Error & { column?: string };
}

/** Drops the file's roles and logins, and what they own. */
async function dropRoles(): Promise<void> {
  for (const kind of KINDS) {
    for (const role of [`${PREFIX}_${kind}_login`, `${PREFIX}_${kind}`]) {
      const exists = await db.pool.query('SELECT 1 FROM pg_roles WHERE rolname = $1', [role]);
      if (exists.rowCount === 0) continue;
      await db.pool.query(`DROP OWNED BY "${role}" CASCADE`);
      await db.pool.query(`DROP ROLE "${role}"`);
    }
  }
}

/** The advisory lock that {@link oneAtATime} holds. */
const ROLES_LOCK = 0x74323672;

/**
 * Runs `work` while no other trust-boundary file makes or drops its roles:
 * both write the database's own ACL (GRANT CONNECT ON DATABASE, DROP OWNED
 * BY), and two at once fail with "tuple concurrently updated".
 */
async function oneAtATime(work: () => Promise<void>): Promise<void> {
  const lock = await db.pool.connect();
  try {
    await lock.query('SELECT pg_advisory_lock($1)', [ROLES_LOCK]);
    await work();
  } finally {
    await lock.query('SELECT pg_advisory_unlock($1)', [ROLES_LOCK]).catch(() => {});
    lock.release();
  }
}

/**
 * Registers a trust-boundary file's hooks: its schema `name`, and the roles
 * of roleSetupSql() with logins under `prefix` (plus TEST_SCHEMA_SUFFIX),
 * each with a pool; all dropped at the end, after `teardown`. Returns the
 * prefix.
 */
export function setupTrustRoles(
  name: string,
  prefix: string,
  { setup, teardown }: { setup?: () => Promise<unknown>; teardown?: () => Promise<unknown> } = {},
): string {
  PREFIX = `${prefix}${process.env.TEST_SCHEMA_SUFFIX ?? ''}`;
  before(async () => {
    db = await testDb(name);
    await setup?.();
    await oneAtATime(async () => {
      await dropRoles();
      await db.pool.query(roleSetupSql({ schema: db.schema, prefix: PREFIX, logins: true }));
      for (const kind of KINDS) await db.pool.query(`ALTER ROLE "${PREFIX}_${kind}_login" PASSWORD '${PASSWORD}'`);
    });
    for (const kind of KINDS) pools.set(kind, new pg.Pool({ connectionString: url(kind), max: 4 }));
  });
  after(async () => {
    await Promise.all([...pools.values()].map((p) => p.end().catch(() => {})));
    await db.pool.query(`DROP SCHEMA IF EXISTS "${db.schema}" CASCADE`);
    await teardown?.();
    await oneAtATime(dropRoles);
    await db.close();
  });
  return PREFIX;
}
