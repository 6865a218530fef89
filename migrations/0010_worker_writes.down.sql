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



DROP FUNCTION {{schema}}.task_clock(float8);
DROP FUNCTION {{schema}}.task_channel(text);
