/**
 * pgasynq's public surface. Nothing else is part of the API.
 */
export { Client, type ClientOptions, type EnqueueCallOptions, type EnqueueAndWaitOptions, type WaitOptions } from './client.js';
export { Server, type ServerConfig, type ServerStatus } from './server.js';
export { Scheduler, InvalidCronSpecError, type SchedulerOptions, type SchedulerStatus } from './scheduler.js';
export { PeriodicTaskManager, type PeriodicTaskConfig, type PeriodicTaskManagerOptions } from './periodic-task-manager.js';
export { ServeMux, type Handler, type Middleware, type TaskContext } from './mux.js';
export { Task, TASK_STATES, type EnqueueOptions, type TaskInfo, type TaskState, type DependencyFailurePolicy } from './model/task.js';
export type { TaskRef } from './model/task-info.js';
export { MAX_HEADER_KEYS, MAX_HEADERS_BYTES } from './model/headers.js';
export { MAX_DURATION_MS, MAX_TIMER_MS, MIN_INSTANT_MS, MAX_INSTANT_MS } from './model/validate.js';
export { migrate, migrateDown, migrationStatus, type MigrationResult, type MigrationStatus } from './migrate.js';
export { defaultRetryDelay, MAX_LAST_ERROR_BYTES } from './server/retry.js';
export { MAX_PAYLOAD_BYTES } from './model/payload.js';
export { Snooze } from './model/snooze.js';
export type { ConnectionOptions } from './internal/connection.js';
export type { Transactional, AnyTransaction } from './broker/db.js';
export type { LeaseCounters } from './server/lease-table.js';
export { roleSetupSql, roleNames, ROLE_KINDS, type RoleKind, type RoleSetupOptions } from './roles.js';
export { createEmbeddedDatabase, type EmbeddedDatabase, type EmbeddedClient } from './embedded.js';
export type { QueryResult } from './internal/embedded-database.js';
export type { Logger, LogLevel } from './internal/logger.js';
export {
  PgasynqError,
  ValidationError,
  InvalidQueueNameError,
  InvalidTaskTypeError,
  InvalidTaskIdError,
  InvalidSchemaNameError,
  InvalidOptionError,
  PayloadSerializationError,
  PayloadTooLargeError,
  ConfigError,
  ClientClosedError,
  DuplicateTaskError,
  TaskIdConflictError,
  QueueNotFoundError,
  TaskNotFoundError,
  QueueNotEmptyError,
  FailedPreconditionError,
  DatabaseUnavailableError,
  type DatabaseUnavailableReason,
  ServerClosedError,
  LeaseExpiredError,
  TaskTimeoutError,
  TaskCanceledError,
  HandlerNotFoundError,
  TaskFailedError,
  WaitTimeoutError,
  SkipRetry,
  RevokeTask,
  isValidationError,
  isDuplicateTask,
  isTaskIdConflict,
  isQueueNotFound,
  isTaskNotFound,
  isLeaseExpired,
  isServerClosed,
  isTaskFailed,
  isWaitTimeout,
  isDatabaseUnavailable,
  isSkipRetry,
  isRevokeTask,
} from './model/errors.js';
export { Inspector, type InspectorOptions } from './inspector.js';
export type { AttemptInfo, AttemptOutcome, TaskEvent, TaskLogLine, TaskProgress } from './model/following.js';
export type {
  QueueInfo,
  QueueLimits,
  DailyStats,
  ListOptions,
  GroupInfo,
  ServerInfo,
  WorkerInfo,
  SchedulerEntry,
  SchedulerEnqueueEvent,
} from './model/inspector-types.js';
export {
  createDashboard,
  metricsHandler,
  serverMetrics,
  collectMetrics,
  renderPrometheus,
  PROMETHEUS_CONTENT_TYPE,
  type Dashboard,
  type DashboardOptions,
  type MetricFamily,
  type MetricSample,
  type MetricsHandler,
  type MetricsHandlerOptions,
} from './dashboard/index.js';
