/**
 * The statements of the migration runner. Each migration file runs in its own
 * transaction, after taking a transaction-scoped advisory lock keyed by the
 * schema, so two processes migrating at once apply each file exactly once.
 */
import { readdir, readFile } from 'node:fs/promises';
import type pg from 'pg';
import { FailedPreconditionError } from '../model/errors.js';
import type { Db } from './db.js';

export interface MigrationFile {
  name: string;
  up: string;
  down: string | null;
}

const MIGRATIONS_DIR = new URL('../../migrations/', import.meta.url);

/** Every migration shipped in the package, in order. */
export async function loadMigrations(): Promise<MigrationFile[]> {
  const files = (await readdir(MIGRATIONS_DIR)).filter((f) => /^\d{4}_[a-z0-9_]+\.up\.sql$/.test(f)).sort();
  return Promise.all(
    files.map(async (file) => {
      const name = file.replace(/\.up\.sql$/, '');
      const down = await readFile(new URL(`${name}.down.sql`, MIGRATIONS_DIR), 'utf8').catch(() => null);
      return { name, up: await readFile(new URL(file, MIGRATIONS_DIR), 'utf8'), down };
    }),
  );
}

function render(db: Db, text: string): string {
  // The schema was validated as ^[a-z_][a-z0-9_]*$, so quoting it is all it needs.
  return text.replaceAll('{{schema}}', `"${db.schema}"`);
}

/** Opens a transaction holding the schema's migration lock, with the bookkeeping table in place. */
async function lockedTransaction<T>(db: Db, fn: (client: pg.PoolClient, applied: Map<string, Date>) => Promise<T>): Promise<T> {
  const client = await connect(db);
  try {
    await client.query('BEGIN');
    await client.query('SELECT pg_advisory_xact_lock(hashtext($1))', [`pgasynq:migrate:${db.schema}`]);
    await client.query(`CREATE SCHEMA IF NOT EXISTS "${db.schema}"`);
    // The real clock on purpose: applied_at records when a migration ran, and decides nothing.
    await client.query(`CREATE TABLE IF NOT EXISTS "${db.schema}".migrations (name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`);
    const rows = (await client.query<{ name: string; applied_at: Date }>(`SELECT name, applied_at FROM "${db.schema}".migrations`)).rows;
    const result = await fn(client, new Map(rows.map((r) => [r.name, r.applied_at])));
    await client.query('COMMIT');
    return result;
  } catch (err) {
    await client.query('ROLLBACK').catch(() => {});
    throw err;
  } finally {
    client.release();
  }
}

/** Applies one migration unless another process already did; returns whether it ran. */
export function applyMigration(db: Db, m: MigrationFile): Promise<boolean> {
  return lockedTransaction(db, async (client, applied) => {
    if (applied.has(m.name)) return false;
    await client.query(render(db, m.up));
    await client.query(`INSERT INTO "${db.schema}".migrations (name) VALUES ($1)`, [m.name]);
    return true;
  });
}

/**
 * Rolls back the newest applied migration; returns its name, or null when none is applied.
 * Unless `force`, refuses (FailedPreconditionError) when the rollback would drop a table
 * that holds rows: a `migrate down` typed by mistake must not delete queued tasks.
 */
export function revertLastMigration(db: Db, all: MigrationFile[], force = false): Promise<string | null> {
  return lockedTransaction(db, async (client, applied) => {
    const last = all.filter((m) => applied.has(m.name)).at(-1);
    if (!last) return null;
    if (last.down === null) throw new Error(`migration ${last.name} cannot be rolled back (no down file)`);
    if (!force) {
      const held = await populatedTables(client, db, last.down);
      if (held.length > 0) {
        throw new FailedPreconditionError(
          `rolling back ${last.name} would drop ${held.map((t) => `${t.table} (${t.rows} row${t.rows === 1 ? '' : 's'})`).join(', ')}: pass --force (force: true) to drop them anyway`,
        );
      }
    }
    await client.query(render(db, last.down));
    await client.query(`DELETE FROM "${db.schema}".migrations WHERE name = $1`, [last.name]);
    return last.name;
  });
}

/**
 * A down script whose first line is this copies every task into the tables it
 * restores before it drops any (0004 goes back to v1's one table): nothing to refuse.
 */
const KEEPS_TASKS = '-- pgasynq: keeps every task';

/** The tables a down script drops that hold rows, with how many (at most 1,000 counted). */
async function populatedTables(client: pg.PoolClient, db: Db, down: string): Promise<{ table: string; rows: number }[]> {
  if (down.startsWith(KEEPS_TASKS)) return [];
  const dropped = [...down.matchAll(/DROP\s+TABLE\s+(?:IF\s+EXISTS\s+)?\{\{schema\}\}\.([a-z_][a-z0-9_]*)/gi)].map((m) => m[1] as string);
  const held: { table: string; rows: number }[] = [];
  for (const table of dropped) {
    const exists = await client.query<{ t: string | null }>('SELECT to_regclass($1)::text AS t', [`"${db.schema}".${table}`]);
    if (exists.rows[0]?.t == null) continue;
    // Bounded: a table of millions of tasks needs no exact count to be refused.
    const { rows } = await client.query<{ n: number }>(`SELECT count(*)::int AS n FROM (SELECT 1 FROM "${db.schema}".${table} LIMIT 1000) s`);
    const n = rows[0]?.n ?? 0;
    if (n > 0) held.push({ table, rows: n });
  }
  return held;
}

/**
 * A connection of the pool, or DatabaseUnavailableError when the database
 * cannot be used at all (unknown database, role or host); a connection
 * failure counts toward the owner's health log. Statements on the connection
 * are not mapped: while migrating, a missing table is the migration's own error.
 */
async function connect(db: Db): Promise<pg.PoolClient> {
  try {
    return await db.pool.connect();
  } catch (err) {
    throw db.failed(err);
  }
}

/** Names and times of applied migrations; empty when the schema does not exist yet. */
export async function appliedMigrations(db: Db): Promise<Map<string, Date>> {
  const client = await connect(db);
  try {
    const exists = await client.query<{ t: string | null }>('SELECT to_regclass($1)::text AS t', [`"${db.schema}".migrations`]);
    if (exists.rows[0]?.t == null) return new Map();
    const rows = (await client.query<{ name: string; applied_at: Date }>(`SELECT name, applied_at FROM "${db.schema}".migrations`)).rows;
    return new Map(rows.map((r) => [r.name, r.applied_at]));
  } finally {
    client.release();
  }
}

/**
 * The shipped migrations not applied to the schema, in order. An empty
 * schema (no migrations table) lacks them all.
 */
export async function missingMigrations(db: Db): Promise<string[]> {
  const [all, applied] = await Promise.all([loadMigrations(), appliedMigrations(db)]);
  return all.map((m) => m.name).filter((name) => !applied.has(name));
}
