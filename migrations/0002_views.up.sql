-- pgasynq 0002: views for people (what `asynq stats` answers, in SQL) and the
-- indexes that keep the Inspector's per-queue counts and lists index-only.
-- {{schema}} is replaced by the quoted schema name before this file runs.
--
-- CREATE INDEX (not CONCURRENTLY: migrations run in a transaction) blocks
-- writes to tasks while it builds: about a second per million rows.

-- Per-queue counts and pages of completed, scheduled and retry tasks. 0001's
-- indexes on these states are keyed by run_at alone (for the janitor and the
-- forwarder, which scan across queues), so counting one queue's completed
-- tasks was a scan of the table. Only rows in these states are indexed; the
-- claim path (pending → active) does not touch them.
CREATE INDEX tasks_completed_queue_idx ON {{schema}}.tasks (queue, run_at) WHERE state = 'completed';
CREATE INDEX tasks_due_queue_idx       ON {{schema}}.tasks (queue, state, run_at) WHERE state IN ('scheduled', 'retry');

-- The counts of one queue. Each is its own subquery so that it is an
-- index-only scan of that state's partial index, filtered by queue: the cost
-- grows with the rows of that queue in that state, never with the table.
-- A function, not an inline subquery, for its SET clauses. These scans are
-- cheap per row but costed high on large tables: JIT compiling them
-- (PostgreSQL's default above a cost of 100 000) took longer than running
-- them (0.4 s of JIT for a 50 ms query on 1M rows), and parallel workers,
-- planned from a generic plan that cannot tell a big queue from a small one,
-- tripled the time (1M rows, 3 queues: 390 ms → 52 ms for all queues, 139 ms
-- → 34 ms for the largest, 95 ms → 9 ms for a small one).
CREATE FUNCTION {{schema}}.queue_counts(queue_name text)
RETURNS TABLE (pending bigint, active bigint, scheduled bigint, retry bigint, archived bigint,
               completed bigint, aggregating bigint, groups bigint, oldest_pending timestamptz)
LANGUAGE sql STABLE
SET jit = off
SET max_parallel_workers_per_gather = 0
AS $$
  SELECT
    (SELECT count(*) FROM {{schema}}.tasks t WHERE t.queue = queue_name AND t.state = 'pending'),
    (SELECT count(*) FROM {{schema}}.tasks t WHERE t.queue = queue_name AND t.state = 'active'),
    (SELECT count(*) FROM {{schema}}.tasks t WHERE t.queue = queue_name AND t.state = 'scheduled'),
    (SELECT count(*) FROM {{schema}}.tasks t WHERE t.queue = queue_name AND t.state = 'retry'),
    (SELECT count(*) FROM {{schema}}.tasks t WHERE t.queue = queue_name AND t.state = 'archived'),
    (SELECT count(*) FROM {{schema}}.tasks t WHERE t.queue = queue_name AND t.state = 'completed'),
    (SELECT count(*) FROM {{schema}}.tasks t WHERE t.queue = queue_name AND t.state = 'aggregating'),
    (SELECT count(DISTINCT t.group_key) FROM {{schema}}.tasks t WHERE t.queue = queue_name AND t.state = 'aggregating'),
    (SELECT min(t.run_at) FROM {{schema}}.tasks t WHERE t.queue = queue_name AND t.state = 'pending')
$$;

-- One row per queue: `SELECT * FROM {{schema}}.queue_stats` is `asynq stats`.
-- Inspector.getQueueInfo reads this view, so the two always agree; a filter
-- on queue reaches the queues table, so one queue's row counts one queue.
CREATE VIEW {{schema}}.queue_stats AS
SELECT
  q.name AS queue,
  q.paused,
  c.pending + c.active + c.scheduled + c.retry + c.archived + c.completed + c.aggregating AS size,
  c.groups,
  -- How long the oldest pending task has waited (asynq's Latency); 0 when none waits.
  greatest(coalesce(now() - c.oldest_pending, interval '0'), interval '0') AS latency,
  greatest(coalesce(extract(epoch FROM now() - c.oldest_pending) * 1000, 0), 0)::float8 AS latency_ms,
  c.pending, c.active, c.scheduled, c.retry, c.archived, c.completed, c.aggregating,
  -- Today is the UTC day, as for asynq's processed:<date> keys.
  coalesce(d.processed, 0) AS processed,
  coalesce(d.failed, 0) AS failed,
  q.processed_total,
  q.failed_total,
  now() AS timestamp
FROM {{schema}}.queues q
CROSS JOIN LATERAL {{schema}}.queue_counts(q.name) c
LEFT JOIN {{schema}}.daily_stats d ON d.queue = q.name AND d.day = (now() AT TIME ZONE 'UTC')::date;

-- Every task being processed, and by whom. `orphaned`: the lease has expired
-- and no recoverer has taken the task yet (its worker is gone or stalled).
CREATE VIEW {{schema}}.active_tasks AS
SELECT
  t.queue,
  t.id,
  t.type,
  t.lease_owner,
  t.started_at,
  t.lease_expires_at,
  t.lease_expires_at < now() AS orphaned,
  t.cancel_requested,
  t.retried,
  t.max_retry
FROM {{schema}}.tasks t
WHERE t.state = 'active';
