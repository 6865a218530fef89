/**
 * Client.enqueue: payloads round trip, JSON and bytes, as TaskInfo and as the
 * stored row; the payload is taken when the Task is made; 1 MiB is accepted.
 */
import { describe } from 'node:test';
import assert from 'node:assert/strict';
import { Task, type TaskInfo } from '../src/index.js';
import { test } from './helpers.js';
import { MIB, setupClient } from './client-kit.js';

const { client, mustRow } = setupClient('t_client_payloads');

// ---------------------------------------------------------------------------
describe('payloads round trip', () => {
  const jsonCases: [string, unknown, unknown][] = [
    ['object', { a: 1, nested: { b: [1, 'x', null, true], c: { d: -2.5 } } }, { a: 1, nested: { b: [1, 'x', null, true], c: { d: -2.5 } } }],
    ['empty object', {}, {}],
    ['array', [1, 'two', { three: 3 }, [4]], [1, 'two', { three: 3 }, [4]]],
    ['empty array', [], []],
    ['string', 'hello', 'hello'],
    ['empty string', '', ''],
    ['unicode string', 'héllo ✓ 😀 \u2028', 'héllo ✓ 😀 \u2028'],
    ['string that looks like JSON', '{"a":1}', '{"a":1}'],
    ['integer', 42, 42],
    ['zero', 0, 0],
    ['negative float', -1.5, -1.5],
    ['true', true, true],
    ['false', false, false],
    ['null', null, null],
    ['undefined', undefined, null],
    ['undefined members as JSON.stringify does', { a: undefined, b: [undefined, 1] }, { b: [null, 1] }],
    ['a Date inside becomes its ISO string', { at: new Date(0) }, { at: '1970-01-01T00:00:00.000Z' }],
  ];
  for (const [name, payload, expected] of jsonCases) {
    test(`JSON: ${name}`, async () => {
      const info = await client.enqueue(new Task('payload:json', payload));
      assert.deepEqual(info.payload, expected);
      const r = await mustRow(info);
      assert.deepEqual(r.payload, expected);
      assert.equal(r.payload_bytes, null);
    });
  }

  const bytes = new Uint8Array([0, 1, 2, 127, 128, 254, 255]);
  const binaryCases: [string, Uint8Array, Buffer][] = [
    ['Uint8Array', bytes, Buffer.from(bytes)],
    ['Buffer', Buffer.from('binary\0data\xff', 'latin1'), Buffer.from('binary\0data\xff', 'latin1')],
    ['Uint8Array view with an offset', new Uint8Array([9, 9, 1, 2, 3, 9]).subarray(2, 5), Buffer.from([1, 2, 3])],
    ['empty Uint8Array', new Uint8Array(0), Buffer.alloc(0)],
  ];
  for (const [name, payload, expected] of binaryCases) {
    test(`binary: ${name} comes back as a Buffer with equal bytes`, async () => {
      const info = await client.enqueue(new Task('payload:bytes', payload));
      assert.ok(Buffer.isBuffer(info.payload), 'TaskInfo.payload is a Buffer');
      assert.ok(info.payload.equals(expected));
      const r = await mustRow(info);
      assert.equal(r.payload, null);
      assert.ok(Buffer.isBuffer(r.payload_bytes));
      assert.ok(r.payload_bytes.equals(expected));
    });
  }

  test('the payload is taken when the Task is made: later changes to the bytes or object are not enqueued', async () => {
    const bytes = new Uint8Array([1, 2, 3]);
    const obj = { a: 1 };
    const tb = new Task('payload:snapshot', bytes);
    const tj = new Task('payload:snapshot', obj);
    bytes[0] = 99;
    obj.a = 99;
    const [ib, ij] = await client.enqueueMany([tb, tj]);
    assert.ok((ib?.payload as Buffer).equals(Buffer.from([1, 2, 3])));
    assert.ok((await mustRow(ib as TaskInfo)).payload_bytes?.equals(Buffer.from([1, 2, 3])));
    assert.deepEqual(ij?.payload, { a: 1 });
  });

  test('a payload of exactly 1 MiB is accepted (JSON and bytes)', async () => {
    const json = 'x'.repeat(MIB - 2); // with its quotes: exactly MIB bytes
    const a = await client.enqueue(new Task('payload:cap', json));
    assert.equal((a.payload as string).length, MIB - 2);
    const b = await client.enqueue(new Task('payload:cap', new Uint8Array(MIB)));
    assert.equal((b.payload as Buffer).length, MIB);
    assert.equal((await mustRow(b)).payload_bytes?.length, MIB);
  });
});
