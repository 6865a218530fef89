-- pgasynq 0018: Inspector.watch()'s events cut into notifications by slices of the batch.
-- {{schema}} is replaced by the quoted schema name before this file runs.
--
-- send_task_events() built each notification's text one event at a time, in a plpgsql loop
-- that copied the growing text at every event: about 3 µs an event, two events a task, most
-- of what one watcher cost a drain's database. It now joins a slice of the events at once
-- (array_to_string, a fifth of that), as many as fit 7,000 bytes on the batch's average,
-- halving a slice that still comes out longer than 7,900 bytes. The notifications carry the
-- same JSON arrays, in the same order, each under NOTIFY's 8,000 bytes.
CREATE OR REPLACE FUNCTION {{schema}}.send_task_events(events json[]) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  channel constant text := {{schema}}.task_channel('_events');
  n constant integer := coalesce(cardinality(events), 0);
  piece text := array_to_string(events, ',');
  -- Events per notification, on the batch's average length.
  per constant integer := greatest(1, (n::bigint * 7000 / greatest(octet_length(piece), 1))::integer);
  i integer := 1;
  k integer;
BEGIN
  WHILE i <= n LOOP
    k := least(per, n - i + 1);
    IF k < n THEN
      piece := array_to_string(events[i:i + k - 1], ',');
    END IF;
    -- Longer events than the average here: fewer of them.
    WHILE octet_length(piece) > 7900 AND k > 1 LOOP
      k := k / 2;
      piece := array_to_string(events[i:i + k - 1], ',');
    END LOOP;
    PERFORM pg_notify(channel, '[' || piece || ']');
    i := i + k;
  END LOOP;
END
$$;
REVOKE EXECUTE ON FUNCTION {{schema}}.send_task_events(json[]) FROM PUBLIC;
