/**
 * The operations every system under test offers the workloads. One adapter
 * per system, each as small as that system's documented API allows.
 */

/** A small JSON task: its index, and whatever clock a workload needs. */
export interface Payload {
  i: number;
  /** A realistic document (lib/payload.ts), the same bytes for every system; absent in the no-op workloads. */
  doc?: Record<string, unknown>;
  /** W3: the enqueuer's monotonic clock just before the enqueue call. */
  sentAt?: number;
  /** W4: when the task is due, wall-clock ms since the epoch. */
  due?: number;
}

/** A handler may return a promise (WAL: handlers that block until released); every adapter awaits it. */
export type TaskHandler = (payload: Payload) => void | Promise<void>;

export type ClaimObserver = (ms: number, rows: number, statement: { text: string; values: unknown[] }) => void;

export interface Workers {
  /** Stops claiming, waits for running handlers, closes the workers' connections. */
  stop(): Promise<void>;
}

export interface Adapter {
  /** The name used by --systems and in the tables. */
  readonly name: string;
  /** Human-readable: library, version, backend. */
  readonly label: string;
  /**
   * Connects. With `fresh`, first drops everything the system stored (its
   * schema, or its Redis keys) and migrates: a clean slate.
   */
  setup(opts?: { fresh?: boolean }): Promise<void>;
  enqueueOne(payload: Payload): Promise<void>;
  /** One call of the system's bulk API for all of `payloads`. */
  enqueueMany(payloads: Payload[]): Promise<void>;
  /** RT: enqueues one task and resolves once a worker has completed it; absent when the system has no such call. */
  enqueueAndWait?(payload: Payload): Promise<void>;
  /** A delayed task due at `at` (W4); absent when the system has no delayed tasks. */
  enqueueAt?(payload: Payload, at: Date): Promise<void>;
  /** Starts a worker pool in this process running `handler` for every task. */
  startWorkers(opts: { concurrency: number; handler: TaskHandler }): Promise<Workers>;
  /** Tasks not yet finished (pending, delayed, active): 0 once every completion is recorded. */
  remaining(): Promise<number>;
  /** Closes what setup() opened. */
  teardown(): Promise<void>;
  /**
   * PostgreSQL systems: the schema holding everything the system stores. W7,
   * W8 and WAL read sizes and dead tuples summed over all its tables.
   */
  readonly schema?: string;
  /**
   * W5: adds `n` finished rows (completed/archived, or that system's
   * equivalent) with one INSERT … SELECT generate_series. The one place where
   * the bench writes into a system's tables by hand.
   */
  fillFinished?(n: number): Promise<void>;
  /**
   * W5: starts workers whose claim statements are timed. `onClaim` gets the
   * round-trip ms, the number of rows and the statement (text and parameters,
   * for EXPLAIN ANALYZE) of every claim that returned rows.
   */
  startTimedWorkers?(opts: { concurrency: number; handler: TaskHandler; onClaim: ClaimObserver }): Promise<Workers>;
}
