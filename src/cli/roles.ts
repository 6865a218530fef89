/**
 * `pgasynq roles [--prefix P] [--logins]`: prints the SQL that creates the
 * least-privilege roles (owner, producer, worker, monitor, inspector, admin)
 * and grants them what pgasynq needs on the --schema; roleSetupSql() in the
 * library. It connects to nothing: pipe it to psql as a superuser, before the
 * first migrate and again after every migrate that applied something.
 * With --json: the SQL as one JSON string.
 */
import { DEFAULT_ROLE_PREFIX, roleSetupSql } from '../roles.js';
import { jsonNote } from './common.js';
import type { CliContext } from './context.js';
import type { CliProgram } from './root.js';

export function registerRoles(program: CliProgram, ctx: CliContext): void {
  program
    .command('roles')
    .description('print the SQL for least-privilege roles on the schema (pipe it to psql as a superuser)')
    .option('--prefix <prefix>', 'role names are <prefix>_owner, <prefix>_worker, ...', DEFAULT_ROLE_PREFIX)
    .option('--logins', 'also create a LOGIN role <prefix>_<role>_login per role, without a password')
    .addHelpText(
      'after',
      `
Roles: owner (migrate), producer (enqueue), worker (Server, Scheduler),
monitor (stats without payloads), inspector (read-only, payloads included),
admin (inspector + task and queue actions). Rerun after every migrate.
Example: pgasynq --schema jobs roles | psql -v ON_ERROR_STOP=1 "$ADMIN_URL"
${jsonNote('the SQL as one JSON string')}`,
    )
    .action((opts) => {
      const text = roleSetupSql({ schema: ctx.globals.schema, prefix: opts.prefix, logins: opts.logins === true });
      if (ctx.globals.json) ctx.emit(text, () => text);
      else ctx.io.out.write(text);
    });
}
