-- Back to 0004: no dependencies. Refused while task_dependencies holds rows
-- (migrateDown names it); a task still `waiting` without any becomes pending.
DROP VIEW {{schema}}.queue_stats;
DROP FUNCTION {{schema}}.queue_counts(text);
DROP TRIGGER task_states_finished ON {{schema}}.task_states;
DROP TRIGGER task_states_deleted ON {{schema}}.task_states;
DROP FUNCTION {{schema}}.task_states_finished();
DROP FUNCTION {{schema}}.task_states_deleted();
DROP FUNCTION {{schema}}.settle_completed(bigint[], jsonb[], bytea[], text);
DROP FUNCTION {{schema}}.settle_failed(bigint, text);
DROP TABLE {{schema}}.task_dependencies;

UPDATE {{schema}}.task_states
SET state = 'pending', pending_seq = nextval('{{schema}}.task_seq'), run_at = now(), updated_at = now()
WHERE state = 'waiting';

DROP VIEW {{schema}}.tasks;
CREATE VIEW {{schema}}.tasks AS
SELECT i.queue, i.id, i.type, i.payload, i.payload_bytes, i.headers, s.state, i.max_retry, s.retried,
       i.timeout, i.deadline, i.unique_key, s.group_key, i.retention, s.run_at, s.lease_owner,
       s.lease_expires_at, s.lease_token, s.started_at, s.cancel_requested, s.error_msg, s.last_failed_at,
       s.completed_at, s.result, s.result_bytes, i.enqueued_at, s.updated_at, i.seq, s.pending_seq
FROM {{schema}}.task_states s
JOIN {{schema}}.task_inputs i ON i.seq = s.seq;
CREATE TRIGGER tasks_write INSTEAD OF INSERT OR UPDATE OR DELETE ON {{schema}}.tasks
  FOR EACH ROW EXECUTE FUNCTION {{schema}}.tasks_write();

DROP INDEX {{schema}}.task_states_waiting_idx;
ALTER TABLE {{schema}}.task_states
  DROP CONSTRAINT tasks_waiting_counts,
  DROP CONSTRAINT tasks_state_valid,
  ADD CONSTRAINT tasks_state_valid CHECK (state IN
    ('pending', 'active', 'scheduled', 'retry', 'archived', 'completed', 'aggregating')),
  DROP COLUMN waiting_for,
  DROP COLUMN has_dependents;

-- The counts of one queue, each an index-only scan of its state's partial
-- index on the narrow table (see 0002 for the SET clauses).
CREATE FUNCTION {{schema}}.queue_counts(queue_name text)
RETURNS TABLE (pending bigint, active bigint, scheduled bigint, retry bigint, archived bigint,
               completed bigint, aggregating bigint, groups bigint, oldest_pending timestamptz)
LANGUAGE sql STABLE
SET jit = off
SET max_parallel_workers_per_gather = 0
AS $$
  SELECT
    (SELECT count(*) FROM {{schema}}.task_states t WHERE t.queue = queue_name AND t.state = 'pending'),
    (SELECT count(*) FROM {{schema}}.task_states t WHERE t.queue = queue_name AND t.state = 'active' AND t.lease_owner IS NOT NULL),
    (SELECT count(*) FROM {{schema}}.task_states t WHERE t.queue = queue_name AND t.state = 'scheduled'),
    (SELECT count(*) FROM {{schema}}.task_states t WHERE t.queue = queue_name AND t.state = 'retry'),
    (SELECT count(*) FROM {{schema}}.task_states t WHERE t.queue = queue_name AND t.state = 'archived'),
    (SELECT count(*) FROM {{schema}}.task_states t WHERE t.queue = queue_name AND t.state = 'completed'),
    (SELECT count(*) FROM {{schema}}.task_states t WHERE t.queue = queue_name AND t.state = 'aggregating'),
    (SELECT count(DISTINCT t.group_key) FROM {{schema}}.task_states t WHERE t.queue = queue_name AND t.state = 'aggregating'),
    (SELECT min(t.run_at) FROM {{schema}}.task_states t WHERE t.queue = queue_name AND t.state = 'pending')
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
