/**
 * Payloads and results are JSON values (stored as jsonb) or bytes (stored as
 * bytea and handed back as a Buffer). JSON.stringify silently drops functions,
 * turns NaN into null and throws an unhelpful error on BigInt or a cycle; we
 * check the value first so the error names the path and the rule.
 *
 * Keys named `__proto__`, `constructor` or `prototype` are ordinary data: they
 * are stored as written, and a handler gets them back (through JSON.parse) as
 * own data properties of a plain object, which never touches Object.prototype.
 * Code that deep-merges a payload into another object should still skip them.
 */
import { PayloadSerializationError, PayloadTooLargeError, type ValidationError } from './errors.js';
import * as v from './validate.js';

/** The default cap on one payload (and one result), in bytes of its encoded form: 1 MiB. */
export const MAX_PAYLOAD_BYTES = 1_048_576;
/** The largest cap `maxPayloadBytes` may be set to: just under PostgreSQL's 256 MiB jsonb limit. */
export const MAX_PAYLOAD_BYTES_LIMIT = 268_435_455;
/** How deeply arrays and objects may nest in a payload. */
export const MAX_PAYLOAD_DEPTH = 64;
/** Paths in messages are cut to this many characters (a key may be a megabyte long). */
const MAX_PATH_IN_MESSAGE = 120;

/** Checks a `maxPayloadBytes` option: an integer in [1, MAX_PAYLOAD_BYTES_LIMIT]. */
export function maxPayloadBytesOption(value: unknown, Err: new (field: string, rule: string) => ValidationError): number {
  return value === undefined ? MAX_PAYLOAD_BYTES : v.integer(value, 'maxPayloadBytes', 1, MAX_PAYLOAD_BYTES_LIMIT, Err);
}

export type EncodedPayload = { json: string | null; bytes: Buffer | null };

/** `$.a[0]["b c"]`: where in the value a rule was broken, from the keys and indexes walked to it. */
function pathOf(segments: readonly (string | number)[]): string {
  let path = '$';
  for (const s of segments) {
    path += typeof s === 'number' ? `[${s}]` : /^[A-Za-z_$][\w$]*$/.test(s) ? `.${s}` : `[${JSON.stringify(s)}]`;
    if (path.length > MAX_PATH_IN_MESSAGE) return `${path.slice(0, MAX_PATH_IN_MESSAGE)}…`;
  }
  return path;
}

/**
 * Walks the value as JSON.stringify will, refusing what it would drop, mangle
 * or choke on. The path is built only for the message: a bulk enqueue checks
 * tens of thousands of payloads that are all fine.
 */
function check(value: unknown, segments: (string | number)[], ancestors: object[], field: string, fromToJSON = false): void {
  const fail = (rule: string): never => {
    throw new PayloadSerializationError(field, `${rule} at ${pathOf(segments)}`);
  };
  if (segments.length > MAX_PAYLOAD_DEPTH) fail(`nesting depth exceeds the limit of ${MAX_PAYLOAD_DEPTH} levels`);
  switch (typeof value) {
    case 'string':
      if (value.includes('\0')) fail('contains a NUL character, which jsonb cannot store (send bytes instead),');
      if (!value.isWellFormed()) fail('contains a lone surrogate (not valid Unicode)');
      return;
    case 'number':
      if (!Number.isFinite(value)) fail(`is not JSON-serialisable: non-finite number ${value}`);
      return;
    case 'boolean':
      return;
    case 'bigint':
      return fail('is not JSON-serialisable: BigInt (encode it as a string)');
    case 'function':
      return fail('is not JSON-serialisable: function');
    case 'symbol':
      return fail('is not JSON-serialisable: symbol');
    case 'undefined':
      return fail('is not JSON-serialisable: undefined');
  }
  if (value === null) return;
  const obj = value as object;
  if (ancestors.includes(obj)) fail('is not JSON-serialisable: circular reference');
  const toJSON = fromToJSON ? undefined : (obj as { toJSON?: unknown }).toJSON;
  if (obj instanceof Date && toJSON === Date.prototype.toJSON) {
    if (Number.isNaN(obj.getTime())) fail('is not JSON-serialisable: Invalid Date');
    return;
  }
  // Before toJSON: a Buffer has one, and would be stored as {"type":"Buffer","data":[…]}.
  if (obj instanceof Map || obj instanceof Set || ArrayBuffer.isView(obj) || obj instanceof ArrayBuffer) {
    fail(`is not JSON-serialisable: ${obj.constructor.name} (convert it to an array or object)`);
  }
  if (typeof toJSON === 'function') {
    // JSON.stringify stores what toJSON returns (it calls it once, with the key), so that is what is checked.
    let replaced: unknown;
    try {
      replaced = toJSON.call(obj, String(segments.at(-1) ?? ''));
    } catch (err) {
      return fail(`is not JSON-serialisable: its toJSON() threw (${messageOf(err)})`);
    }
    if (replaced === undefined) fail('is not JSON-serialisable: its toJSON() returned undefined');
    // What toJSON returned is stored as it is: its own toJSON is not called, its members' are.
    ancestors.push(obj);
    check(replaced, segments, ancestors, field, true);
    ancestors.pop();
    return;
  }
  ancestors.push(obj);
  if (Array.isArray(obj)) {
    for (let i = 0; i < obj.length; i++) {
      segments.push(i);
      check(obj[i] === undefined ? null : obj[i], segments, ancestors, field);
      segments.pop();
    }
  } else {
    const record = obj as Record<string, unknown>;
    for (const key of Object.keys(record)) {
      if (key.includes('\0')) fail('has a key with a NUL character');
      if (!key.isWellFormed()) fail(`has a key with a lone surrogate (not valid Unicode): ${JSON.stringify(key.slice(0, 40))}`);
      const item = record[key];
      if (item === undefined) continue;
      segments.push(key);
      check(item, segments, ancestors, field);
      segments.pop();
    }
  }
  ancestors.pop();
}

/** A thrown value's message, cut short: it goes into ours. */
function messageOf(err: unknown): string {
  const text = err instanceof Error ? err.message : String(err);
  return text.length > 200 ? `${text.slice(0, 200)}…` : text;
}

/** Size in bytes of an encoded payload as stored (UTF-8 JSON text, or the bytes). */
export function encodedSize(encoded: EncodedPayload): number {
  return encoded.bytes !== null ? encoded.bytes.byteLength : encoded.json === null ? 0 : Buffer.byteLength(encoded.json);
}

/**
 * Refuses an encoded payload over `maxBytes`, before anything is sent:
 * "payload is 1048577 bytes as JSON; the limit is 1048576 (option maxPayloadBytes)".
 */
export function checkPayloadSize(encoded: EncodedPayload, field = 'payload', maxBytes = MAX_PAYLOAD_BYTES): EncodedPayload {
  const size = encodedSize(encoded);
  if (size > maxBytes) {
    throw new PayloadTooLargeError(field, `is ${size} bytes${encoded.bytes !== null ? '' : ' as JSON'}; the limit is ${maxBytes} (option maxPayloadBytes)`);
  }
  return encoded;
}

/**
 * Encodes a payload (or a result) for storage. `undefined` and `null` mean no
 * payload. Bytes are copied into a Buffer; anything else must be JSON. A
 * payload over `maxBytes` (1 MiB by default) is a PayloadTooLargeError.
 */
export function encodePayload(value: unknown, field = 'payload', maxBytes = MAX_PAYLOAD_BYTES): EncodedPayload {
  if (value === undefined || value === null) return { json: null, bytes: null };
  if (value instanceof Uint8Array) {
    checkPayloadSize({ json: null, bytes: value as Buffer }, field, maxBytes);
    // A copy, as JSON payloads are encoded at once: later writes to the caller's bytes are not enqueued.
    return { json: null, bytes: Buffer.from(value) };
  }
  check(value, [], [], field);
  let json: string;
  try {
    json = JSON.stringify(value);
  } catch (err) {
    // What check() cannot see: a getter that throws, or JSON longer than V8's longest string (about 512 MiB).
    if (err instanceof RangeError)
      throw new PayloadTooLargeError(
        field,
        `is longer as JSON than JavaScript can hold in one string; the limit is ${maxBytes} bytes (option maxPayloadBytes)`,
      );
    throw new PayloadSerializationError(field, `is not JSON-serialisable: ${messageOf(err)}`);
  }
  return checkPayloadSize({ json, bytes: null }, field, maxBytes);
}

/** The stored form back to what handlers and TaskInfo see. */
export function decodePayload(json: unknown, bytes: Buffer | null): unknown {
  return bytes ?? json ?? null;
}
