/**
 * The bad-input table, rows 26–43 (bad-input-rows-operations.ts): cron specs,
 * Server and DSN config, the CLI, the Inspector's list options, handlers at
 * runtime, and objects used after close().
 */
import { describe } from 'node:test';
import { setupBadInput, testRows } from './bad-input-kit.js';
import { OPERATIONS_ROWS } from './bad-input-rows-operations.js';

setupBadInput('bad_input_operations');

describe('§6 bad input: the typed error, a message naming field and rule, no SQL, nothing written', () => testRows(OPERATIONS_ROWS));
