-- Back to 0009: the server writes the tables itself again (rerun `pgasynq
-- roles` after migrating down, to give the worker its table grants back).

-- ---------------------------------------------------------------------
-- The claim (broker/claim.ts)
-- ---------------------------------------------------------------------



-- ---------------------------------------------------------------------
-- The fenced writes of a lease (broker/leases.ts)
-- ---------------------------------------------------------------------



-- ---------------------------------------------------------------------
-- The forwarder, the recoverer and the janitor (broker/maintenance.ts)
-- and the aggregator (broker/aggregation.ts)
-- ---------------------------------------------------------------------

DROP FUNCTION {{schema}}.forward_due(integer, float8);
DROP FUNCTION {{schema}}.recover_leases(bigint[], uuid[], boolean[], float8[], float8, float8, float8);
DROP FUNCTION {{schema}}.drop_orphans(bigint[], uuid[], float8, float8, float8);
DROP FUNCTION {{schema}}.check_recovery_bounds(float8, float8);
DROP FUNCTION {{schema}}.delete_expired_completed(integer, float8);
DROP FUNCTION {{schema}}.delete_expired_locks(integer, float8);
DROP FUNCTION {{schema}}.trim_archive(integer, float8);
DROP FUNCTION {{schema}}.commit_group(text, text, bigint[]);

DROP FUNCTION {{schema}}.task_clock(float8);
DROP FUNCTION {{schema}}.task_channel(text);
