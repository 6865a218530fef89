-- pgasynq 0010: the worker writes tasks only through the owner's functions.
-- {{schema}} is replaced by the quoted schema name before this file runs.
--
-- Every statement a server runs that changes task_states, task_inputs or
-- unique_locks (the claim, the fenced writes of a lease, the forwarder, the
-- recoverer, the janitor, the aggregator) is a SECURITY DEFINER function
-- here, with search_path pinned: the worker role holds no INSERT, UPDATE or
-- DELETE on those tables (broker/roles.ts), so it can take no row lock that
-- stops a claim, write no state the library would not, and skip no fence.
-- Each function decides time with task_clock(): the database's now(),
-- moved only for a login that is the owner (a test's DatabaseClock).

-- The database's now() as the task functions decide by it: PostgreSQL's,
-- moved forward by `shift_ms` (internal/clock.ts DatabaseClock, which only
-- tests move). Called from the owner's SECURITY DEFINER functions, where
-- current_user is the owner: a shift is honoured only when the login that
-- called them is the owner or a member of it, so no worker can move time to
-- recover another's lease early or keep its own past its expiry.
CREATE FUNCTION {{schema}}.task_clock(shift_ms float8) RETURNS timestamptz
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF shift_ms IS NULL OR shift_ms = 0 THEN
    RETURN now();
  END IF;
  IF shift_ms < 0 OR shift_ms = 'Infinity'::float8 OR shift_ms <> shift_ms
     OR NOT pg_has_role(session_user, current_user, 'MEMBER') THEN
    RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege', COLUMN = 'clock',
      MESSAGE = 'pgasynq: a moved clock is the owner''s alone (tests): other logins run on the database''s now()';
  END IF;
  RETURN now() + shift_ms * interval '1 millisecond';
END
$$;

-- The channel a task function notifies: '_tasks', '_delayed' or '_sweep'
-- after the schema's name (model/validate.ts CHANNEL_SUFFIXES), as
-- Db.channels names them. {{schema}} is the quoted name, and a schema name is
-- ^[a-z_][a-z0-9_]*$, so the quotes are all there is to take off.
CREATE FUNCTION {{schema}}.task_channel(suffix text) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp
RETURN btrim('{{schema}}', '"') || suffix;

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



REVOKE EXECUTE ON FUNCTION {{schema}}.task_clock(float8) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.task_channel(text) FROM PUBLIC;
