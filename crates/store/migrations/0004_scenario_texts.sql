-- Scenario versions (issue 10): what a run needs to continue on the version it started
-- with (the canonical scenario and every template, rubric, schema and rules file it read,
-- as the JSON of baton_scenario::Texts), kept under the version's checksum. Written once,
-- by the first run of that version; never changed.
CREATE TABLE scenario_texts (
    checksum TEXT PRIMARY KEY,
    scenario_id TEXT NOT NULL,
    texts TEXT NOT NULL,
    created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
