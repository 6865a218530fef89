/**
 * Where the examples keep their tasks; every example imports it, so copy it
 * along with the one you take. DATABASE_URL when it is set, else an embedded
 * database in this process, so no server is needed: PGlite, PostgreSQL compiled
 * to WebAssembly, from the optional package @electric-sql/pglite (a
 * devDependency of this repository; in a project of yours,
 * `npm install @electric-sql/pglite`). PGASYNQ_EMBEDDED=1 picks the embedded
 * database even when DATABASE_URL is set. Either way pgasynq's tables live in
 * schema "examples", which migrate() creates or brings up to date; the embedded
 * database is in memory and gone when the example exits.
 */
import { createEmbeddedDatabase, migrate, type ConnectionOptions, type EmbeddedDatabase } from 'pgasynq';

export async function connect(): Promise<{ conn: ConnectionOptions; embedded: EmbeddedDatabase | undefined }> {
  const url = process.env.PGASYNQ_EMBEDDED === '1' ? undefined : process.env.DATABASE_URL;
  const embedded = url ? undefined : await createEmbeddedDatabase();
  const conn: ConnectionOptions = embedded ? { embedded, schema: 'examples' } : { connectionString: url, schema: 'examples' };
  await migrate(conn);
  return { conn, embedded };
}
