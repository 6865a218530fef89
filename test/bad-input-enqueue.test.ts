/**
 * The bad-input table, rows 1–25 (bad-input-rows-enqueue.ts: what enqueue(),
 * a Client and migrate() take), and the check that the whole table, every
 * slice of it, has every row of the plan (row 39 is left out on purpose: see
 * the header of bad-input-kit.ts).
 */
import assert from 'node:assert/strict';
import { describe } from 'node:test';
import { setupBadInput, testRows } from './bad-input-kit.js';
import { ENQUEUE_ROWS } from './bad-input-rows-enqueue.js';
import { OPERATIONS_ROWS } from './bad-input-rows-operations.js';
import { TRUST_ROWS } from './bad-input-rows-trust.js';
import { test } from './helpers.js';

setupBadInput('bad_input_enqueue');

/** The whole table: each slice is run by a file of its own (bad-input-enqueue, -operations, -trust). */
const ROWS = [...ENQUEUE_ROWS, ...OPERATIONS_ROWS, ...TRUST_ROWS];

describe('§6 bad input: the typed error, a message naming field and rule, no SQL, nothing written', () => {
  test('the table has every row of the plan, 1 to 43, but 39 (see the header); rows after 43 are ours', () => {
    const expected = Array.from({ length: 43 }, (_, i) => i + 1).filter((n) => n !== 39);
    assert.deepEqual(
      [...new Set(ROWS.map((r) => r.n))].filter((n) => n <= 43).sort((a, b) => a - b),
      expected,
    );
  });

  testRows(ENQUEUE_ROWS);
});
