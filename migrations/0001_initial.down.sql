DROP TABLE IF EXISTS {{schema}}.scheduler_events;
DROP TABLE IF EXISTS {{schema}}.scheduler_entries;
DROP TABLE IF EXISTS {{schema}}.daily_stats;
DROP TABLE IF EXISTS {{schema}}.servers;
DROP TABLE IF EXISTS {{schema}}.unique_locks;
DROP TABLE IF EXISTS {{schema}}.tasks;
DROP TABLE IF EXISTS {{schema}}.queues;
