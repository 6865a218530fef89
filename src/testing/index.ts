/**
 * `pgasynq/testing`: what an application's tests need to test their own
 * handlers and enqueues. A test database with a pool and Kysely for the
 * application's tables, one run of a handler without a server, waits that
 * resolve when the work is done, and enqueue assertions. Not for production
 * code: nothing in the main entry point depends on it.
 */
export { createTestDatabase, type TestDatabase, type TestDatabaseOptions } from './test-database.js';
export { runTask, type RunTaskOptions, type TaskRun } from './run-task.js';
export { drain, waitForTask, type DrainOptions, type DrainResult, type TestConnection } from './waits.js';
export { requireEnqueued, requireNotEnqueued, payloadMatches, type EnqueuedMatch } from './enqueued.js';
export { DrainTimeoutError } from '../model/errors.js';
