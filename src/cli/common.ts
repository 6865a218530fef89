/**
 * What the Inspector-backed commands (stats, queue, task, group, server,
 * cron) share: one Inspector per run, closed afterwards (a Client likewise,
 * for `task wait`); the task states; number and duration parsers for
 * options; colours on a TTY only.
 *
 * The Inspector and the Client are imported lazily, inside actions, so
 * `--help` loads nothing that talks to a database.
 */
import { InvalidArgumentError } from '@commander-js/extra-typings';
import type { Client } from '../client.js';
import type { Inspector } from '../inspector.js';
import { parseDuration } from '../model/cron.js';
import { MAX_TIMER_MS } from '../model/validate.js';
import type { TaskState } from '../model/task.js';
import { UsageError, type CliContext } from './context.js';
import { style, type Style } from './format.js';

/** Every task state, in the order asynq's CLI lists them. */
export const STATES = ['active', 'pending', 'waiting', 'aggregating', 'scheduled', 'retry', 'archived', 'completed'] as const satisfies readonly TaskState[];

/** What `--json` prints for an action the Inspector answers with nothing (void). */
export const OK = { ok: true } as const;

/** Runs `fn` with what `open` makes on the configured database and schema, and closes it. */
async function withOpened<R extends { close(): Promise<void> }, T>(
  ctx: CliContext,
  open: (conn: ReturnType<CliContext['connection']>) => Promise<R>,
  fn: (opened: R) => Promise<T>,
): Promise<T> {
  const opened = await open(ctx.connection());
  try {
    return await fn(opened);
  } finally {
    await opened.close().catch(() => {});
  }
}

/** Runs `fn` with an Inspector on the configured database and schema, and closes it. */
export const withInspector = <T>(ctx: CliContext, fn: (inspector: Inspector) => Promise<T>): Promise<T> =>
  withOpened(ctx, async (conn) => new (await import('../inspector.js')).Inspector(conn), fn);

/** Runs `fn` with a Client on the configured database and schema, and closes it. */
export const withClient = <T>(ctx: CliContext, fn: (client: Client) => Promise<T>): Promise<T> =>
  withOpened(ctx, async (conn) => new (await import('../client.js')).Client(conn), fn);

/**
 * An option parser for a duration as `queue limit --rate` and cron's `@every`
 * take one (units h, m, s, ms, combined: 30s, 500ms, 2m, 1m30s), from 1 ms to
 * MAX_TIMER_MS (about 24.8 days); in ms. Anything else is bad usage (exit 2).
 */
export function durationArg(value: string): number {
  const ms = parseDuration(value.trim());
  if (ms === null) throw new InvalidArgumentError('must be a duration with its unit (h, m, s, ms), e.g. 30s, 500ms, 2m or 1m30s.');
  if (ms < 1 || ms > MAX_TIMER_MS) throw new InvalidArgumentError(`must be from 1ms to ${MAX_TIMER_MS}ms (about 24.8 days).`);
  return ms;
}

/** An option parser for an integer in [min, max]; anything else is bad usage (exit 2). */
export function intInRange(min: number, max: number) {
  return (value: string): number => {
    const n = Number(value);
    if (!/^\s*\d+\s*$/.test(value) || !Number.isSafeInteger(n) || n < min || n > max) {
      throw new InvalidArgumentError(`must be an integer from ${min} to ${max}.`);
    }
    return n;
  };
}

/** Checks a state given as an argument; an unknown one is bad usage naming the allowed ones. */
export function parseState(value: string): TaskState {
  if ((STATES as readonly string[]).includes(value)) return value as TaskState;
  throw new UsageError(`invalid state '${value}': the states are ${STATES.join(', ')}`);
}

/** Colours for human output: only when stdout is a terminal and NO_COLOR is not set. */
export function colours(ctx: CliContext): Style {
  const tty = (ctx.io.out as { isTTY?: boolean }).isTTY === true;
  const env = ctx.io.env;
  return style(tty && (env.NO_COLOR === undefined || env.NO_COLOR === '') && env.TERM !== 'dumb');
}

/** The help text's note on what `--json` prints for a command. */
export function jsonNote(what: string): string {
  return `\nWith --json (a global flag: pgasynq --json ...) it prints ${what}.\n`;
}
