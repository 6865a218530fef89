-- pgasynq: keeps every task
-- Back to schema v1: one tasks table, every task copied into it in its state.
DROP VIEW {{schema}}.active_tasks;
DROP VIEW {{schema}}.queue_stats;
DROP FUNCTION {{schema}}.queue_counts(text);

CREATE TABLE {{schema}}.tasks_v1 (
  queue            text NOT NULL,
  id               text NOT NULL,
  type             text NOT NULL,
  payload          jsonb,
  payload_bytes    bytea,
  headers          jsonb NOT NULL DEFAULT '{}',
  state            text NOT NULL,
  max_retry        integer NOT NULL DEFAULT 25,
  retried          integer NOT NULL DEFAULT 0,
  timeout          interval NOT NULL DEFAULT '0',
  deadline         timestamptz,
  unique_key       text,
  group_key        text,
  retention        interval NOT NULL DEFAULT '0',
  run_at           timestamptz,
  lease_owner      text,
  lease_expires_at timestamptz,
  lease_token      uuid,
  started_at       timestamptz,
  cancel_requested boolean NOT NULL DEFAULT false,
  error_msg        text,
  last_failed_at   timestamptz,
  completed_at     timestamptz,
  result           jsonb,
  result_bytes     bytea,
  enqueued_at      timestamptz NOT NULL DEFAULT now(),
  updated_at       timestamptz NOT NULL DEFAULT now(),
  seq              bigint GENERATED ALWAYS AS IDENTITY,
  CONSTRAINT tasks_pkey PRIMARY KEY (queue, id),
  CONSTRAINT tasks_state_valid CHECK (state IN
    ('pending', 'active', 'scheduled', 'retry', 'archived', 'completed', 'aggregating')),
  CONSTRAINT tasks_active_has_lease CHECK (state <> 'active' OR
    (lease_token IS NOT NULL AND lease_expires_at IS NOT NULL AND lease_owner IS NOT NULL)),
  CONSTRAINT tasks_due_has_run_at CHECK (state NOT IN ('pending', 'scheduled', 'retry') OR run_at IS NOT NULL),
  CONSTRAINT tasks_retry_counts CHECK (max_retry >= 0 AND retried >= 0),
  CONSTRAINT tasks_one_payload CHECK (payload IS NULL OR payload_bytes IS NULL)
) WITH (
  fillfactor = 80,
  autovacuum_vacuum_scale_factor = 0.01,
  autovacuum_vacuum_threshold = 1000,
  autovacuum_analyze_scale_factor = 0.02,
  autovacuum_vacuum_cost_limit = 2000,
  autovacuum_vacuum_insert_scale_factor = 0.05
);

-- v1 orders pending tasks by (run_at, seq): pending tasks are numbered in v2's order,
-- above every seq. Not their pending_seq: a requeue puts a task before the queue's
-- first position, on a number another task may hold as its seq, and v1's seq must
-- stay unique for 0004 to apply again (task_inputs' primary key).
INSERT INTO {{schema}}.tasks_v1 (queue, id, type, payload, payload_bytes, headers, state, max_retry, retried, timeout,
                                 deadline, unique_key, group_key, retention, run_at, lease_owner, lease_expires_at,
                                 lease_token, started_at, cancel_requested, error_msg, last_failed_at, completed_at,
                                 result, result_bytes, enqueued_at, updated_at, seq)
OVERRIDING SYSTEM VALUE
SELECT queue, id, type, payload, payload_bytes, headers, state, max_retry, retried, timeout, deadline, unique_key,
       group_key, retention, run_at, lease_owner, lease_expires_at, lease_token, started_at, cancel_requested,
       error_msg, last_failed_at, completed_at, result, result_bytes, enqueued_at, updated_at,
       CASE WHEN state = 'pending' THEN m.top + row_number() OVER (PARTITION BY state = 'pending' ORDER BY pending_seq, seq) ELSE seq END
FROM {{schema}}.tasks CROSS JOIN (SELECT coalesce(max(seq), 0) AS top FROM {{schema}}.task_inputs) m;
SELECT setval(pg_get_serial_sequence('{{schema}}.tasks_v1', 'seq'),
              greatest((SELECT max(seq) FROM {{schema}}.tasks_v1), (SELECT last_value FROM {{schema}}.task_seq), 1));

DROP VIEW {{schema}}.tasks;
DROP FUNCTION {{schema}}.tasks_write();
DROP TABLE {{schema}}.task_states;
DROP TABLE {{schema}}.task_inputs;
ALTER TABLE {{schema}}.tasks_v1 RENAME TO tasks;

CREATE INDEX tasks_pending_idx     ON {{schema}}.tasks (queue, run_at, seq) WHERE state = 'pending';
CREATE INDEX tasks_due_idx         ON {{schema}}.tasks (run_at) WHERE state IN ('scheduled', 'retry');
CREATE INDEX tasks_active_idx      ON {{schema}}.tasks (queue, started_at, seq) WHERE state = 'active' AND lease_owner IS NOT NULL;
CREATE INDEX tasks_completed_idx   ON {{schema}}.tasks (run_at) WHERE state = 'completed';
CREATE INDEX tasks_archived_idx    ON {{schema}}.tasks (queue, run_at) WHERE state = 'archived';
CREATE INDEX tasks_aggregating_idx ON {{schema}}.tasks (queue, group_key, enqueued_at) WHERE state = 'aggregating';
CREATE INDEX tasks_completed_queue_idx ON {{schema}}.tasks (queue, run_at) WHERE state = 'completed';
CREATE INDEX tasks_due_queue_idx       ON {{schema}}.tasks (queue, state, run_at) WHERE state IN ('scheduled', 'retry');

CREATE FUNCTION {{schema}}.queue_counts(queue_name text)
RETURNS TABLE (pending bigint, active bigint, scheduled bigint, retry bigint, archived bigint,
               completed bigint, aggregating bigint, groups bigint, oldest_pending timestamptz)
LANGUAGE sql STABLE
SET jit = off
SET max_parallel_workers_per_gather = 0
AS $$
  SELECT
    (SELECT count(*) FROM {{schema}}.tasks t WHERE t.queue = queue_name AND t.state = 'pending'),
    (SELECT count(*) FROM {{schema}}.tasks t WHERE t.queue = queue_name AND t.state = 'active' AND t.lease_owner IS NOT NULL),
    (SELECT count(*) FROM {{schema}}.tasks t WHERE t.queue = queue_name AND t.state = 'scheduled'),
    (SELECT count(*) FROM {{schema}}.tasks t WHERE t.queue = queue_name AND t.state = 'retry'),
    (SELECT count(*) FROM {{schema}}.tasks t WHERE t.queue = queue_name AND t.state = 'archived'),
    (SELECT count(*) FROM {{schema}}.tasks t WHERE t.queue = queue_name AND t.state = 'completed'),
    (SELECT count(*) FROM {{schema}}.tasks t WHERE t.queue = queue_name AND t.state = 'aggregating'),
    (SELECT count(DISTINCT t.group_key) FROM {{schema}}.tasks t WHERE t.queue = queue_name AND t.state = 'aggregating'),
    (SELECT min(t.run_at) FROM {{schema}}.tasks t WHERE t.queue = queue_name AND t.state = 'pending')
$$;

CREATE VIEW {{schema}}.queue_stats AS
SELECT
  q.name AS queue,
  q.paused,
  c.pending + c.active + c.scheduled + c.retry + c.archived + c.completed + c.aggregating AS size,
  c.groups,
  greatest(coalesce(now() - c.oldest_pending, interval '0'), interval '0') AS latency,
  greatest(coalesce(extract(epoch FROM now() - c.oldest_pending) * 1000, 0), 0)::float8 AS latency_ms,
  c.pending, c.active, c.scheduled, c.retry, c.archived, c.completed, c.aggregating,
  coalesce(d.processed, 0) AS processed,
  coalesce(d.failed, 0) AS failed,
  q.processed_total,
  q.failed_total,
  now() AS timestamp
FROM {{schema}}.queues q
CROSS JOIN LATERAL {{schema}}.queue_counts(q.name) c
LEFT JOIN {{schema}}.daily_stats d ON d.queue = q.name AND d.day = (now() AT TIME ZONE 'UTC')::date;

CREATE VIEW {{schema}}.active_tasks AS
SELECT t.queue, t.id, t.type, t.lease_owner, t.started_at, t.lease_expires_at, t.lease_expires_at < now() AS orphaned,
       t.cancel_requested, t.retried, t.max_retry
FROM {{schema}}.tasks t
WHERE t.state = 'active' AND t.lease_owner IS NOT NULL;
