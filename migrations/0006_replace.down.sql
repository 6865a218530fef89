DROP FUNCTION {{schema}}.replace_tasks(json, timestamptz, text);
