/**
 * The root command with the global options every command inherits, and the
 * shape of a command's registration: what program.ts assembles and each
 * command file fills in.
 */
import { Command } from '@commander-js/extra-typings';
import { DEFAULT_SCHEMA } from '../model/validate.js';
import type { CliContext } from './context.js';

export function rootCommand() {
  return new Command('pgasynq')
    .description("asynq's task-queue model on PostgreSQL: migrations, inspection, workers")
    .option('--database-url <url>', 'PostgreSQL connection string (default: $DATABASE_URL)')
    .option('--schema <name>', 'schema holding the pgasynq tables', DEFAULT_SCHEMA)
    .option('--json', 'machine-readable output: what the library call returns, as JSON')
    .option('--debug', 'print stack traces of errors');
}

/** The root command with the global options; commands hang off it. */
export type CliProgram = ReturnType<typeof rootCommand>;

export type RegisterCommand = (program: CliProgram, ctx: CliContext) => void;
