/**
 * The embedded database's public front: starts PGlite (an optional package)
 * and wraps it in the pool lookalike of internal/embedded-database.ts that
 * Client, Server, Inspector and migrate() accept as `embedded`.
 */
import { EmbeddedDatabase, type PGliteLike } from './internal/embedded-database.js';
import { ConfigError } from './model/errors.js';

export { EmbeddedDatabase, EmbeddedClient } from './internal/embedded-database.js';

/**
 * Starts an embedded database: in memory, or kept in `dataDir`. Needs the
 * optional package @electric-sql/pglite (`npm install @electric-sql/pglite`).
 */
export async function createEmbeddedDatabase(opts: { dataDir?: string } = {}): Promise<EmbeddedDatabase> {
  if (opts.dataDir !== undefined && (typeof opts.dataDir !== 'string' || opts.dataDir === '')) {
    throw new ConfigError('dataDir', 'must be a non-empty path');
  }
  let mod: { PGlite: { create(dataDir?: string): Promise<PGliteLike> } };
  try {
    // A string the bundlers and TypeScript leave alone: the package is optional.
    const name = '@electric-sql/pglite';
    mod = (await import(name)) as typeof mod;
  } catch (err) {
    throw new ConfigError('embedded', `needs the optional package @electric-sql/pglite: npm install @electric-sql/pglite (${(err as Error).message})`);
  }
  return new EmbeddedDatabase(await mod.PGlite.create(opts.dataDir), opts.dataDir);
}
