CREATE OR REPLACE VIEW {{schema}}.active_tasks AS
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

CREATE OR REPLACE FUNCTION {{schema}}.queue_counts(queue_name text)
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

DROP INDEX {{schema}}.tasks_active_idx;
CREATE INDEX tasks_active_idx ON {{schema}}.tasks (lease_expires_at) WHERE state = 'active';
