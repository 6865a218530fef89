/**
 * The bad-input table, rows 44 and up (bad-input-rows-trust.ts): roleSetupSql()
 * and the findings of issue #26, the database as the trust boundary.
 */
import { describe } from 'node:test';
import { setupBadInput, testRows } from './bad-input-kit.js';
import { TRUST_ROWS } from './bad-input-rows-trust.js';

setupBadInput('bad_input_trust');

describe('§6 bad input: the typed error, a message naming field and rule, no SQL, nothing written', () => testRows(TRUST_ROWS));
