DROP VIEW IF EXISTS {{schema}}.active_tasks;
DROP VIEW IF EXISTS {{schema}}.queue_stats;
DROP FUNCTION IF EXISTS {{schema}}.queue_counts(text);
DROP INDEX IF EXISTS {{schema}}.tasks_due_queue_idx;
DROP INDEX IF EXISTS {{schema}}.tasks_completed_queue_idx;
