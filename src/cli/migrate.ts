/**
 * `pgasynq migrate [up|down|status]`: the library's migrate(), migrateDown()
 * and migrationStatus(), nothing more.
 */
import { Argument } from '@commander-js/extra-typings';
import { migrate, migrateDown, migrationStatus } from '../migrate.js';
import type { CliContext } from './context.js';
import { instant, table } from './format.js';
import type { CliProgram } from './root.js';

const ACTIONS = ['up', 'down', 'status'] as const;

export function registerMigrate(program: CliProgram, ctx: CliContext): void {
  program
    .command('migrate')
    .description('apply pending migrations (up), roll back the newest one (down), or list them (status)')
    .addArgument(new Argument('[action]', 'what to do').choices(ACTIONS).default('up' as const))
    .option('--force', 'down: drop tables even when they hold tasks')
    .action(async (action, opts) => {
      const conn = ctx.connection();
      switch (action) {
        case 'up': {
          const result = await migrate(conn);
          ctx.emit(result, () => (result.applied.length === 0 ? 'up to date' : result.applied.map((name) => `applied ${name}`)));
          return;
        }
        case 'down': {
          const reverted = await migrateDown({ ...conn, force: opts.force === true });
          ctx.emit({ reverted }, () => (reverted === null ? 'nothing to roll back' : `reverted ${reverted}`));
          return;
        }
        case 'status': {
          const status = await migrationStatus(conn);
          ctx.emit(status, () =>
            table(
              ['name', 'applied', 'applied at'],
              status.map((m) => [m.name, m.applied ? 'yes' : 'no', instant(m.appliedAt)]),
            ),
          );
          return;
        }
      }
    });
}
