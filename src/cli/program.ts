/**
 * The `pgasynq` program: global options, commander configured for our exit
 * codes, the command list, and `run()`, which turns anything thrown into one
 * line on stderr and an exit code:
 *
 *   0  done
 *   1  runtime failure ("error: <message>"; the stack only with --debug)
 *   2  bad usage: unknown command or option, bad argument, no database URL,
 *      or a ValidationError from the library (a bad --schema)
 *   3  a wait timed out (`task wait --timeout`: WaitTimeoutError)
 *
 * To add a command: write src/cli/<name>.ts exporting a `register…(program, ctx)`
 * that calls only the library, and list it in COMMANDS below.
 */
import { readFileSync } from 'node:fs';
import { CommanderError } from '@commander-js/extra-typings';
import { escapeInvisible } from '../internal/printable.js';
import { redactConnectionString } from '../internal/redact.js';
import { FailedPreconditionError, isValidationError, WaitTimeoutError } from '../model/errors.js';
import { CliContext, UsageError, type CliIO } from './context.js';
import { sanitize } from './sanitize.js';
import { rootCommand, type CliProgram, type RegisterCommand } from './root.js';
import { DEFAULT_SCHEMA } from '../model/validate.js';
import { registerCron } from './cron.js';
import { registerDash } from './dash.js';
import { registerDemo } from './demo.js';
import { registerGroup } from './group.js';
import { registerMigrate } from './migrate.js';
import { registerQueue } from './queue.js';
import { registerRoles } from './roles.js';
import { registerServer } from './server.js';
import { registerStats } from './stats.js';
import { registerTask } from './task.js';

export const EXIT_OK = 0;
export const EXIT_FAILURE = 1;
export const EXIT_USAGE = 2;
export const EXIT_TIMEOUT = 3;

/** Every command, in the order `--help` lists them. */
const COMMANDS: RegisterCommand[] = [
  registerMigrate,
  registerStats,
  registerQueue,
  registerTask,
  registerGroup,
  registerServer,
  registerCron,
  registerRoles,
  registerDash,
  registerDemo,
];

function version(): string {
  try {
    // src/cli/ and dist/cli/ are both two levels below the package root.
    const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version?: string };
    return pkg.version ?? 'unknown';
  } catch {
    return 'unknown';
  }
}

/** Builds the program. Settings are made before the commands, which inherit them. */
export function createProgram(io: CliIO): { program: CliProgram; ctx: CliContext } {
  const program = rootCommand();
  program
    .version(version(), '-V, --version')
    .exitOverride()
    .configureOutput({
      // Commander quotes the arguments it refuses: escaped, as all our output.
      writeOut: (s) => io.out.write(escapeInvisible(s, { keepLineBreaks: true })),
      writeErr: (s) => io.err.write(escapeInvisible(s, { keepLineBreaks: true })),
    })
    .showHelpAfterError('(run pgasynq --help for usage)');
  const ctx = new CliContext(io, () => program.opts());
  for (const register of COMMANDS) register(program, ctx);
  return { program, ctx };
}

const UNREACHABLE = new Set(['ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN', 'ETIMEDOUT', 'EHOSTUNREACH', 'ENETUNREACH', 'ECONNRESET']);
/** undefined_table, invalid_schema_name, undefined_function. */
const NOT_MIGRATED = new Set(['42P01', '3F000', '42883']);

function codeOf(err: unknown): string | undefined {
  const code = (err as { code?: unknown } | null)?.code;
  if (typeof code === 'string') return code;
  // Node reports a host with several addresses as an AggregateError of per-address errors.
  if (err instanceof AggregateError) return codeOf(err.errors[0]);
  return undefined;
}

function messageOf(err: unknown): string {
  if (err instanceof AggregateError && err.message === '') {
    return [...new Set(err.errors.map(messageOf))].join('; ');
  }
  if (err instanceof Error) return err.message || err.name;
  return String(err);
}

function oneLine(text: string): string {
  return text.replace(/\s*\n\s*/g, ' ').trim();
}

/**
 * Runs the CLI on `argv` (the arguments after the script name) and resolves
 * to the exit code; it never throws and never calls process.exit.
 */
export async function run(argv: readonly string[], io: Partial<CliIO> = {}): Promise<number> {
  const full: CliIO = { out: io.out ?? process.stdout, err: io.err ?? process.stderr, env: io.env ?? process.env };
  const { program, ctx } = createProgram(full);
  try {
    await program.parseAsync([...argv], { from: 'user' });
    return EXIT_OK;
  } catch (err) {
    return report(err, ctx);
  }
}

function report(err: unknown, ctx: CliContext): number {
  // Commander has already printed its own message (help, version, usage errors).
  if (err instanceof CommanderError) return err.exitCode === 0 ? EXIT_OK : err.exitCode === 1 ? EXIT_USAGE : err.exitCode;

  let debug = false;
  let url: string | undefined;
  let schema: string | undefined;
  try {
    debug = ctx.globals.debug === true;
    url = ctx.databaseUrl;
    schema = ctx.globals.schema;
  } catch {
    // globals unavailable: report without them
  }
  const usage = err instanceof UsageError || isValidationError(err);
  let message = messageOf(err);
  if (!usage && UNREACHABLE.has(codeOf(err) ?? '')) {
    message = `cannot reach the database${url === undefined ? '' : ` at ${redactConnectionString(url)}`}: ${message}`;
  }
  const migrateCommand = `pgasynq${schema === undefined || schema === DEFAULT_SCHEMA ? '' : ` --schema ${schema}`} migrate`;
  if (err instanceof FailedPreconditionError && NOT_MIGRATED.has(codeOf(err.cause) ?? '')) {
    // The library's message says to run `pgasynq migrate`; here, with this run's --schema.
    message = `schema "${schema ?? DEFAULT_SCHEMA}" is not migrated (${messageOf(err.cause)}): run: ${migrateCommand}`;
  } else if (!usage && NOT_MIGRATED.has(codeOf(err) ?? '')) {
    // undefined_table, invalid_schema_name: most likely a schema nobody migrated yet.
    message = `${message} (is the schema migrated? run: ${migrateCommand})`;
  }
  // Messages carry text from the database (a type, an error): shown escaped, never obeyed by the terminal.
  ctx.io.err.write(`error: ${escapeInvisible(oneLine(sanitize(message, url, ctx.io.env)))}\n`);
  if (err instanceof UsageError) ctx.io.err.write('(run pgasynq --help for usage)\n');
  if (debug && err instanceof Error && err.stack) ctx.io.err.write(`${escapeInvisible(sanitize(err.stack, url, ctx.io.env), { keepLineBreaks: true })}\n`);
  return usage ? EXIT_USAGE : err instanceof WaitTimeoutError ? EXIT_TIMEOUT : EXIT_FAILURE;
}
