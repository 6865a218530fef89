/**
 * A task's headers: strings to strings, checked where a Task or an enqueue
 * gives them and capped on their own, apart from the payload.
 */
import { InvalidOptionError, PayloadTooLargeError } from './errors.js';
import * as v from './validate.js';

/** The most keys a task's headers may have. */
export const MAX_HEADER_KEYS = 1000;
/** The most bytes a task's headers may take as stored (UTF-8 JSON text): 64 KiB. */
export const MAX_HEADERS_BYTES = 65_536;
/** The longest header key, in characters. */
const MAX_HEADER_KEY_LENGTH = 256;

/**
 * Headers are strings to strings that jsonb stores as given: no NUL, no lone
 * surrogate. Their cap is their own (MAX_HEADER_KEYS, MAX_HEADERS_BYTES), not
 * a share of maxPayloadBytes, so it holds wherever headers are written and
 * the payload's limit means what it says.
 */
export function validateHeaders(input: unknown): Record<string, string> {
  const h = v.plainObject(input, 'headers');
  const keys = Object.keys(h);
  if (keys.length > MAX_HEADER_KEYS) throw new PayloadTooLargeError('headers', `have ${keys.length} keys; the limit is ${MAX_HEADER_KEYS}`);
  const out = Object.create(null) as Record<string, string>;
  for (const key of keys) {
    if (key.length === 0 || key.length > MAX_HEADER_KEY_LENGTH) {
      throw new InvalidOptionError('headers', `keys must be 1–${MAX_HEADER_KEY_LENGTH} characters (got ${key.length})`);
    }
    checkHeaderText(key, 'headers', `key ${v.describeValue(key)}`);
    const value = h[key];
    if (typeof value !== 'string') throw new InvalidOptionError(`headers.${key}`, `must be a string (got ${v.describeValue(value)})`);
    checkHeaderText(value, `headers.${key}`, 'value');
    out[key] = value;
  }
  return checkHeadersSize({ ...out });
}

function checkHeaderText(text: string, field: string, what: string): void {
  const nul = text.indexOf('\0');
  if (nul >= 0) throw new InvalidOptionError(field, `${what} may not contain a NUL character (found at index ${nul})`);
  const lone = v.loneSurrogateIndex(text);
  if (lone >= 0) throw new InvalidOptionError(field, `${what} is not valid Unicode (lone surrogate at index ${lone})`);
}

/** Refuses headers over MAX_HEADERS_BYTES as stored: the Task's and the enqueue's together, once merged. */
export function checkHeadersSize(headers: Record<string, string>, field = 'headers'): Record<string, string> {
  const size = Buffer.byteLength(JSON.stringify(headers));
  if (size > MAX_HEADERS_BYTES)
    throw new PayloadTooLargeError(field, `are ${size} bytes as JSON; the limit is ${MAX_HEADERS_BYTES} (headers have a cap of their own)`);
  return headers;
}
