/** Log lines as pino writes them, captured from a logger or a child's stderr, for assertions. */
import pino from 'pino';
import type { Logger } from '../src/index.js';
import { waitFor } from './helpers.js';

/** One log line as pino writes it, parsed. */
export interface LogLine {
  level: number;
  msg: string;
  component?: string;
  [field: string]: unknown;
}

/** pino's numbers for the levels, for assertions on `line.level`. */
export const LEVEL = { debug: 20, info: 30, warn: 40, error: 50 } as const;

/**
 * A real pino logger (at `level`) whose destination keeps every line, parsed
 * as JSON: what a user's log collector would receive. `find` waits for the
 * first line with that message (and fields).
 */
export function captureLog(level: 'debug' | 'info' | 'warn' | 'error' = 'debug'): {
  logger: Logger;
  lines: LogLine[];
  raw: string[];
  find: (msg: string, match?: (line: LogLine) => boolean, timeoutMs?: number) => Promise<LogLine>;
} {
  const raw: string[] = [];
  const lines: LogLine[] = [];
  const logger = pino({ level }, { write: (line: string) => void (raw.push(line), lines.push(JSON.parse(line) as LogLine)) });
  const find = (msg: string, match: (line: LogLine) => boolean = () => true, timeoutMs = 20_000) =>
    waitFor(() => lines.find((l) => l.msg === msg && match(l)), timeoutMs, `log line "${msg}"`);
  return { logger, lines, raw, find };
}

/** The stderr of a child process as log lines: every line must be JSON. */
export function parseLogLines(stderr: string): LogLine[] {
  return stderr
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => {
      try {
        return JSON.parse(l) as LogLine;
      } catch {
        throw new Error(`not a JSON log line: ${l}`);
      }
    });
}
