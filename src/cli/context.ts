/**
 * What every CLI command shares: where output goes, the global options, and
 * the one place that turns them into the ConnectionOptions the library takes.
 * Commands print through `emit()` so `--json` behaves the same everywhere.
 */
import type { ConnectionOptions } from '../internal/connection.js';
import type { Logger, LogLevel } from '../internal/logger.js';
import { escapeInvisible } from '../internal/printable.js';
import { printable } from './format.js';
import { humanLogger } from './log.js';
import { sanitize } from './sanitize.js';

/** Anything output can be written to: process.stdout, or a buffer in tests. */
export interface Output {
  write(chunk: string): unknown;
}

export interface CliIO {
  out: Output;
  err: Output;
  env: Record<string, string | undefined>;
}

/** The options that come before the command. */
export interface GlobalOptions {
  databaseUrl?: string | undefined;
  schema: string;
  json?: boolean | undefined;
  debug?: boolean | undefined;
}

/** Bad usage found after commander has parsed the line (exit code 2). */
export class UsageError extends Error {
  override readonly name = 'UsageError';
}

export class CliContext {
  constructor(
    readonly io: CliIO,
    private readonly readGlobals: () => GlobalOptions,
  ) {}

  get globals(): GlobalOptions {
    return this.readGlobals();
  }

  /** The connection string in use (flag, then DATABASE_URL), or undefined. */
  get databaseUrl(): string | undefined {
    const url = this.globals.databaseUrl ?? this.io.env.DATABASE_URL;
    return url === undefined || url === '' ? undefined : url;
  }

  /**
   * Options for a library call; a missing database URL is bad usage. The
   * library logs through `logger(level)`: human lines on stderr, from `warn` up
   * unless the command asks for more.
   */
  connection(level: LogLevel = 'warn'): ConnectionOptions & { connectionString: string; schema: string; logger: Logger } {
    const connectionString = this.databaseUrl;
    if (connectionString === undefined) {
      throw new UsageError('no database: pass --database-url URL or set DATABASE_URL');
    }
    return { connectionString, schema: this.globals.schema, logger: this.logger(level) };
  }

  /**
   * The library's log lines, readable, on this run's stderr (never JSON: the
   * CLI is for people; scripts read --json on stdout). Passwords are masked.
   */
  logger(level: LogLevel = 'warn', write: (text: string) => void = (text) => void this.io.err.write(text)): Logger {
    return humanLogger(level, (text) => {
      // One log line each: a newline inside (an error message's) is shown, not obeyed.
      const line = sanitize(text, this.databaseUrl, this.io.env);
      write(line.endsWith('\n') ? `${escapeInvisible(line.slice(0, -1))}\n` : escapeInvisible(line));
    });
  }

  /**
   * With --json, prints `value` as one line of JSON; otherwise the
   * human-readable lines. Either way no control or other invisible character
   * reaches the terminal raw: JSON gets them as \u escapes (still the same
   * JSON), and human lines that format.ts did not build are escaped.
   */
  emit(value: unknown, human: () => string | string[]): void {
    if (this.globals.json) {
      this.io.out.write(`${escapeInvisible(JSON.stringify(value))}\n`);
      return;
    }
    const text = human();
    const lines = Array.isArray(text) ? text : [text];
    for (const line of lines) this.io.out.write(`${printable(line)}\n`);
  }
}
