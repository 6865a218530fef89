/**
 * Where the examples keep their tasks: DATABASE_URL when it is set, else an
 * embedded database in this process (no server needed).
 */
import { createEmbeddedDatabase, migrate, type ConnectionOptions, type EmbeddedDatabase } from '../src/index.js';

export async function connect(): Promise<{ conn: ConnectionOptions; embedded: EmbeddedDatabase | undefined }> {
  const url = process.env.PGASYNQ_EMBEDDED === '1' ? undefined : process.env.DATABASE_URL;
  const embedded = url ? undefined : await createEmbeddedDatabase();
  const conn: ConnectionOptions = embedded ? { embedded, schema: 'examples' } : { connectionString: url, schema: 'examples' };
  await migrate(conn);
  return { conn, embedded };
}
