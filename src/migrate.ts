/**
 * migrate() and migrationStatus(): apply the SQL files in migrations/ to a
 * schema, or list which are applied. Safe to run twice and from two processes.
 */
import { Db } from './broker/db.js';
import type { ConnectionOptions } from './internal/connection.js';
import { appliedMigrations, applyMigration, loadMigrations, revertLastMigration } from './broker/migrations.js';
import { InvalidOptionError } from './model/errors.js';
import { resolveLogger } from './internal/logger.js';

export interface MigrationResult {
  /** Files applied by this call, in order; empty when the schema was up to date. */
  applied: string[];
}

export interface MigrationStatus {
  name: string;
  applied: boolean;
  appliedAt: Date | null;
}

async function withDb<T>(opts: ConnectionOptions, fn: (db: Db) => Promise<T>): Promise<T> {
  const db = new Db(opts, 'pgasynq:migrate', { logger: resolveLogger(opts).child({ component: 'migrate' }) });
  try {
    return await fn(db);
  } finally {
    await db.close();
  }
}

/** Applies pending migrations, up to and including `to` when given. */
export async function migrate(opts: ConnectionOptions & { to?: string } = {}): Promise<MigrationResult> {
  const all = await loadMigrations();
  const upTo = opts.to === undefined ? all.length : all.findIndex((m) => m.name === opts.to) + 1;
  if (upTo === 0) throw new InvalidOptionError('to', `is not a known migration (expected one of ${all.map((m) => m.name).join(', ')})`);
  return withDb(opts, async (db) => {
    const applied: string[] = [];
    for (const m of all.slice(0, upTo)) {
      if (!(await applyMigration(db, m))) continue;
      applied.push(m.name);
      db.logger.info({ schema: db.schema, migration: m.name }, 'migration applied');
    }
    return { applied };
  });
}

/**
 * Rolls back the newest applied migration. Resolves to its name, or null when none was applied.
 * Rejects with FailedPreconditionError, changing nothing, when the rollback would drop a table
 * that holds rows (tasks, history), unless `force` is true.
 */
export async function migrateDown(opts: ConnectionOptions & { force?: boolean } = {}): Promise<string | null> {
  if (opts.force !== undefined && typeof opts.force !== 'boolean') throw new InvalidOptionError('force', `must be a boolean (got ${typeof opts.force})`);
  const all = await loadMigrations();
  return withDb(opts, async (db) => {
    const reverted = await revertLastMigration(db, all, opts.force ?? false);
    if (reverted !== null) db.logger.info({ schema: db.schema, migration: reverted }, 'migration reverted');
    return reverted;
  });
}

/** Every shipped migration and whether it is applied. */
export async function migrationStatus(opts: ConnectionOptions = {}): Promise<MigrationStatus[]> {
  const all = await loadMigrations();
  return withDb(opts, async (db) => {
    const applied = await appliedMigrations(db);
    return all.map((m) => ({ name: m.name, applied: applied.has(m.name), appliedAt: applied.get(m.name) ?? null }));
  });
}
