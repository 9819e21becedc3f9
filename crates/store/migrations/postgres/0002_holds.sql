-- Holds: which process drives a run, until when. A hold is taken by one store (`holder`, a
-- random id per process), renewed while it drives, and given back when it stops; it is
-- taken over once it has run out, or at once when the session that took it (`holder_pid`
-- started at `holder_since`) is gone — its process died. Each taking counts `epoch` up:
-- an append made under a hold checks that the hold is still its own (fencing), so a
-- process that stalled past its hold writes nothing after another took the run over. A run
-- may be held before it exists (its first events are written under the hold).
CREATE TABLE holds (
    run_id       TEXT PRIMARY KEY,
    holder       TEXT NOT NULL,
    holder_pid   INTEGER NOT NULL,
    holder_since TIMESTAMPTZ NOT NULL,
    until_us     BIGINT NOT NULL,
    epoch        BIGINT NOT NULL
);
CREATE INDEX holds_by_holder ON holds (holder);

-- A worker's lease on a run (`baton worker`) names the session of the worker's hold
-- connection too: a run whose leasing worker died is claimable at once, not only once the
-- lease has run out.
ALTER TABLE runs ADD COLUMN IF NOT EXISTS lease_pid INTEGER;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS lease_since TIMESTAMPTZ;
