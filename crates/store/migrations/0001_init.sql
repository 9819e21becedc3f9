-- Runs, and the append-only event log of each.
CREATE TABLE runs (
    run_id      TEXT PRIMARY KEY,
    scenario_id TEXT NOT NULL,
    status      TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    updated_at  TEXT NOT NULL,
    last_seq    INTEGER NOT NULL
);
CREATE INDEX runs_by_status ON runs (status, created_at);

CREATE TABLE events (
    run_id   TEXT NOT NULL,
    seq      INTEGER NOT NULL,
    at_us    INTEGER NOT NULL, -- microseconds since the Unix epoch, UTC
    kind     TEXT NOT NULL,
    version  INTEGER NOT NULL,
    level_id TEXT,
    attempt  INTEGER,
    data     TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
