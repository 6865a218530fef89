/**
 * pgasynq/testing's statements on a test database's schema as a whole: empty
 * it between tests, drop it at the end. Both run on a pool of the test's (the
 * schema's owner), never on a server's or a client's.
 */
import type pg from 'pg';

const quote = (schema: string) => `"${schema.replaceAll('"', '""')}"`;

/**
 * Empties every table of `schema` but the migrations' record, read from the
 * catalog (so a table a later migration adds is emptied too), in one TRUNCATE.
 */
export async function emptySchema(pool: pg.Pool, schema: string): Promise<void> {
  const { rows } = await pool.query<{ name: string }>(
    `SELECT c.relname AS name FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') AND c.relname <> 'migrations' ORDER BY 1`,
    [schema],
  );
  if (rows.length === 0) return;
  await pool.query(`TRUNCATE ${rows.map((r) => `${quote(schema)}.${quote(r.name)}`).join(', ')} RESTART IDENTITY`);
}

/** Drops `schema` and everything in it. */
export async function dropSchema(pool: pg.Pool, schema: string): Promise<void> {
  await pool.query(`DROP SCHEMA IF EXISTS ${quote(schema)} CASCADE`);
}
