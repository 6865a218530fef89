-- pgasynq 0018 down: 0013's send_task_events(), which builds each notification event by event.
CREATE OR REPLACE FUNCTION {{schema}}.send_task_events(events json[]) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  channel constant text := {{schema}}.task_channel('_events');
  chunk text := '';
  e text;
BEGIN
  FOREACH e IN ARRAY events::text[] LOOP
    IF chunk <> '' AND pg_catalog.octet_length(chunk) + pg_catalog.octet_length(e) > 7900 THEN
      PERFORM pg_catalog.pg_notify(channel, '[' || chunk || ']');
      chunk := '';
    END IF;
    chunk := CASE WHEN chunk = '' THEN e ELSE chunk || ',' || e END;
  END LOOP;
  IF chunk <> '' THEN
    PERFORM pg_catalog.pg_notify(channel, '[' || chunk || ']');
  END IF;
END
$$;
REVOKE EXECUTE ON FUNCTION {{schema}}.send_task_events(json[]) FROM PUBLIC;
