/**
 * Cron specs: parsing and next/previous tick arithmetic, as pure functions of
 * an instant (no clock is read here, so every form is testable at any date).
 *
 * Accepted forms (asynq's, through robfig/cron, plus a seconds field):
 *
 *   "m h dom mon dow"            five fields, evaluated in the zone
 *   "s m h dom mon dow"          an optional leading seconds field
 *   "@yearly" "@annually" "@monthly" "@weekly" "@daily" "@midnight" "@hourly"
 *   "@every <duration>"          30s, 5m, 1h30m (h, m, s, ms; a whole number
 *                                of seconds, at least 1 s): ticks at the
 *                                multiples of the duration since the Unix
 *                                epoch, so independent schedulers agree
 *   "CRON_TZ=Zone <spec>"        (or "TZ=Zone <spec>") evaluates <spec> in Zone
 *
 * Field syntax and the DST rules are croner's: a time that a spring-forward
 * skips runs at the first valid instant after the gap for a fixed-time spec
 * ("30 2 * * *") and is skipped for an interval spec ("*\/30 * * * *"); a time
 * that a fall-back repeats runs once for a fixed-time spec and at both
 * instants for an interval spec. Zones are IANA names; UTC by default.
 */
import { Cron } from 'croner';
import { ValidationError } from './errors.js';

/** A cron spec or zone that does not parse; `field` is `cronspec` or `location`. */
export class InvalidCronSpecError extends ValidationError {}

/** The longest spec accepted, prefix included. */
export const MAX_SPEC_LENGTH = 256;

/** A parsed spec: its zone and its tick arithmetic. */
export interface Schedule {
  /** The spec as given. */
  readonly spec: string;
  /** The IANA zone the spec is evaluated in (CRON_TZ prefix, else the location). */
  readonly zone: string;
  /** For `@every`, the period in ms; null for calendar specs. */
  readonly everyMs: number | null;
  /** The first tick strictly after `after`, or null when there is none. */
  next(after: Date): Date | null;
  /** The last tick at or before `at`, or null when there is none. */
  latest(at: Date): Date | null;
}

/**
 * Checks an IANA zone name and returns it as given: not canonicalised, since
 * the zone is part of the entry id and ICU versions canonicalise differently.
 */
export function validateZone(zone: unknown, field = 'location', Err: new (field: string, rule: string) => ValidationError = InvalidCronSpecError): string {
  if (typeof zone !== 'string' || zone.length === 0 || zone.length > 64) {
    throw new Err(field, `must be an IANA time zone name such as "Europe/Berlin" (got ${typeof zone === 'string' ? JSON.stringify(zone) : typeof zone})`);
  }
  try {
    new Intl.DateTimeFormat('en-US', { timeZone: zone });
  } catch {
    throw new Err(field, `is not a known IANA time zone (got ${JSON.stringify(zone)})`);
  }
  return zone;
}

const UNIT_MS: Record<string, number> = { h: 3_600_000, m: 60_000, s: 1000, ms: 1 };

/** Parses a Go-style duration ("30s", "5m", "1h30m", "1.5h"): ms, or null when it is not one. */
export function parseDuration(text: string): number | null {
  if (!/^(\d+(\.\d+)?(h|ms|m|s))+$/.test(text)) return null;
  let total = 0;
  for (const [, num, , unit] of text.matchAll(/(\d+(\.\d+)?)(h|ms|m|s)/g)) total += Number(num) * (UNIT_MS[unit as string] as number);
  return Math.round(total);
}

/** ms as parseDuration reads it back, exactly: 1000 → "1s", 1500 → "1s500ms", 5_400_000 → "1h30m", 0 → "0ms". */
export function formatDuration(ms: number): string {
  if (!Number.isSafeInteger(ms) || ms < 0) return `${ms}ms`;
  let rest = ms;
  let out = '';
  for (const unit of ['h', 'm', 's', 'ms'] as const) {
    const size = UNIT_MS[unit] as number;
    const n = Math.floor(rest / size);
    rest -= n * size;
    if (n > 0) out += `${n}${unit}`;
  }
  return out === '' ? '0ms' : out;
}

/**
 * Parses `spec` (validated: a bad spec or zone throws InvalidCronSpecError,
 * a ValidationError naming `cronspec` or `location`).
 */
export function parseSchedule(spec: unknown, location = 'UTC'): Schedule {
  if (typeof spec !== 'string') throw new InvalidCronSpecError('cronspec', `must be a string (got ${typeof spec})`);
  if (spec.length > MAX_SPEC_LENGTH) throw new InvalidCronSpecError('cronspec', `must be at most ${MAX_SPEC_LENGTH} characters (got ${spec.length})`);
  let body = spec.trim();
  if (body.length === 0) throw new InvalidCronSpecError('cronspec', 'is empty');
  let zone = validateZone(location, 'location');
  const tz = /^(?:CRON_TZ|TZ)=(\S*)\s+(.*)$/.exec(body);
  if (tz) {
    zone = validateZone(tz[1], 'cronspec');
    body = (tz[2] as string).trim();
  } else if (/^(?:CRON_TZ|TZ)=/.test(body)) {
    throw new InvalidCronSpecError('cronspec', `has a zone prefix but no schedule after it (${JSON.stringify(spec)})`);
  }

  const every = /^@every\s+(\S+)$/i.exec(body);
  if (every) return everySchedule(spec, zone, every[1] as string);
  if (/^@every\b/i.test(body)) throw new InvalidCronSpecError('cronspec', `"@every" needs one duration such as 30s, 5m or 1h30m (got ${JSON.stringify(spec)})`);

  let cron: Cron;
  try {
    cron = new Cron(body, { timezone: zone, mode: '5-or-6-parts' });
  } catch (err) {
    const why = (err as Error).message.replace(/^Cron\w*: /, '');
    throw new InvalidCronSpecError('cronspec', `does not parse: ${why} (got ${JSON.stringify(spec)})`);
  }
  // "0 0 30 2 *" parses but never fires; croner would search centuries for it on every call.
  if (cron.nextRun(new Date(0)) === null) throw new InvalidCronSpecError('cronspec', `never fires (got ${JSON.stringify(spec)})`);
  return {
    spec,
    zone,
    everyMs: null,
    next: (after) => cron.nextRun(after),
    latest: (at) => {
      // croner's previousRuns is strict; 1 ms past `at` includes a tick at `at` itself.
      // The loops make the answer exact even if a DST edge trips the backward search.
      let p: Date | null = cron.previousRuns(1, new Date(at.getTime() + 1))[0] ?? null;
      while (p !== null && p > at) p = cron.previousRuns(1, p)[0] ?? null;
      for (let n = p && cron.nextRun(p); n !== null && n <= at; n = cron.nextRun(n)) p = n;
      return p;
    },
  };
}

function everySchedule(spec: string, zone: string, text: string): Schedule {
  const ms = parseDuration(text);
  if (ms === null) throw new InvalidCronSpecError('cronspec', `"@every" takes a duration such as 30s, 5m or 1h30m (got ${JSON.stringify(text)})`);
  if (ms < 1000) throw new InvalidCronSpecError('cronspec', `"@every" must be at least 1s (got ${text})`);
  if (ms % 1000 !== 0) throw new InvalidCronSpecError('cronspec', `"@every" must be a whole number of seconds (got ${text})`);
  if (ms > 100 * 366 * 86_400_000) throw new InvalidCronSpecError('cronspec', `"@every" must be at most 100 years (got ${text})`);
  return {
    spec,
    zone,
    everyMs: ms,
    next: (after) => new Date((Math.floor(after.getTime() / ms) + 1) * ms),
    latest: (at) => new Date(Math.floor(at.getTime() / ms) * ms),
  };
}
