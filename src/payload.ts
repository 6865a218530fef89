/**
 * Payloads and results are JSON values (stored as jsonb) or bytes (stored as
 * bytea and handed back as a Buffer). JSON.stringify silently drops functions,
 * turns NaN into null and throws an unhelpful error on BigInt or a cycle; we
 * check the value first so the error names the path and the rule.
 */
import { PayloadSerializationError, PayloadTooLargeError } from './errors.js';

/** The default cap on one payload, in bytes of its encoded form. */
export const MAX_PAYLOAD_BYTES = 1_048_576;
const MAX_DEPTH = 64;

export type EncodedPayload = { json: string | null; bytes: Buffer | null };

function keyPath(path: string, key: string): string {
  return /^[A-Za-z_$][\w$]*$/.test(key) ? `${path}.${key}` : `${path}[${JSON.stringify(key)}]`;
}

function check(value: unknown, path: string, depth: number, ancestors: object[], field: string): void {
  const fail = (rule: string): never => {
    throw new PayloadSerializationError(field, `${rule} at ${path}`);
  };
  if (depth > MAX_DEPTH) fail(`nesting depth exceeds ${MAX_DEPTH}`);
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
  if (obj instanceof Date) {
    if (Number.isNaN(obj.getTime())) fail('is not JSON-serialisable: Invalid Date');
    return;
  }
  if (obj instanceof Map || obj instanceof Set || ArrayBuffer.isView(obj) || obj instanceof ArrayBuffer) {
    fail(`is not JSON-serialisable: ${obj.constructor.name} (convert it to an array or object)`);
  }
  ancestors.push(obj);
  if (Array.isArray(obj)) {
    obj.forEach((item, i) => check(item === undefined ? null : item, `${path}[${i}]`, depth + 1, ancestors, field));
  } else {
    for (const [key, item] of Object.entries(obj)) {
      if (key.includes('\0')) fail('has a key with a NUL character');
      if (item !== undefined) check(item, keyPath(path, key), depth + 1, ancestors, field);
    }
  }
  ancestors.pop();
}

/**
 * Encodes a payload (or a result) for storage. `undefined` and `null` mean no
 * payload. Bytes are copied into a Buffer; anything else must be JSON.
 */
export function encodePayload(value: unknown, field = 'payload', maxBytes = MAX_PAYLOAD_BYTES): EncodedPayload {
  if (value === undefined || value === null) return { json: null, bytes: null };
  if (value instanceof Uint8Array) {
    if (value.byteLength > maxBytes) throw new PayloadTooLargeError(field, `is ${value.byteLength} bytes; the limit is ${maxBytes}`);
    // A copy, as JSON payloads are encoded at once: later writes to the caller's bytes are not enqueued.
    return { json: null, bytes: Buffer.from(value) };
  }
  check(value, '$', 0, [], field);
  const json = JSON.stringify(value);
  const size = Buffer.byteLength(json);
  if (size > maxBytes) throw new PayloadTooLargeError(field, `is ${size} bytes as JSON; the limit is ${maxBytes}`);
  return { json, bytes: null };
}

/** The stored form back to what handlers and TaskInfo see. */
export function decodePayload(json: unknown, bytes: Buffer | null): unknown {
  return bytes ?? json ?? null;
}
