/**
 * The library's log lines as the CLI shows them: pino still formats each line
 * (same levels, fields and serializers as everywhere), and a small
 * destination turns its JSON into one line a person reads, on the CLI's
 * stderr:
 *
 *   12:04:05.120 WARN  server: queue has pending tasks but no running server serves it queue=emails pending=12 servedQueues=["default"]
 *
 * Errors show their message; passwords are masked as in every CLI output.
 * Commands run at `warn` (their own output is the point); `dash` at `info`,
 * so its actions are on record; the demo at `error` (see demo.ts).
 */
import pino from 'pino';
import type { Logger, LogLevel } from '../internal/logger.js';

/** Fields every pino line has that the human form leaves out. */
const HIDDEN = new Set(['level', 'time', 'pid', 'hostname', 'name', 'msg', 'component', 'v']);
const LABELS: Record<number, string> = { 10: 'TRACE', 20: 'DEBUG', 30: 'INFO ', 40: 'WARN ', 50: 'ERROR', 60: 'FATAL' };

function scalar(value: unknown): string {
  if (typeof value === 'string') return value !== '' && !/[\s"=]/.test(value) ? value : JSON.stringify(value);
  if (typeof value === 'object' && value !== null) return JSON.stringify(value);
  return String(value);
}

/** key=value pairs; one level of nesting is flattened (task.id=…), an error shows as its message. */
function fields(line: Record<string, unknown>): string[] {
  const out: string[] = [];
  for (const [key, value] of Object.entries(line)) {
    if (HIDDEN.has(key)) continue;
    if (key === 'err' && typeof value === 'object' && value !== null) {
      out.push(`err=${scalar((value as { message?: unknown }).message ?? value)}`);
    } else if (typeof value === 'object' && value !== null && !Array.isArray(value)) {
      for (const [k, v] of Object.entries(value)) out.push(`${key}.${k}=${scalar(v)}`);
    } else {
      out.push(`${key}=${scalar(value)}`);
    }
  }
  return out;
}

/** Local wall-clock time, HH:MM:SS.mmm. */
function clock(d: Date): string {
  const two = (n: number) => String(n).padStart(2, '0');
  return `${two(d.getHours())}:${two(d.getMinutes())}:${two(d.getSeconds())}.${String(d.getMilliseconds()).padStart(3, '0')}`;
}

/** One pino JSON line as one human line (with its newline); a line that is not JSON is passed on as it is. */
export function humanLine(json: string): string {
  let line: Record<string, unknown>;
  try {
    line = JSON.parse(json) as Record<string, unknown>;
  } catch {
    return json.endsWith('\n') ? json : `${json}\n`;
  }
  const time = typeof line.time === 'number' ? clock(new Date(line.time)) : '';
  const level = LABELS[line.level as number] ?? String(line.level);
  const component = typeof line.component === 'string' ? `${line.component}: ` : '';
  const rest = fields(line);
  return `${time} ${level} ${component}${String(line.msg ?? '')}${rest.length > 0 ? ` ${rest.join(' ')}` : ''}\n`;
}

/** A pino logger at `level` that writes human lines through `write` (synchronously, as pino writes to any object stream). */
export function humanLogger(level: LogLevel, write: (text: string) => void): Logger {
  return pino({ name: 'pgasynq', level }, { write: (json: string) => write(humanLine(json)) });
}
