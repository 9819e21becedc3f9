-- Which process wrote each commit (issue 36): the first event of every batch names its
-- writer (`host:pid`, or the name its process gave); the others, and events written
-- before, have none.
ALTER TABLE events ADD COLUMN writer TEXT;

-- The sessions that hand pieces of answers to followers (`baton serve`'s listen
-- connection, named by its backend's pid and start): a worker publishes pieces only while
-- one of them lives.
CREATE TABLE live_listeners (
    listener_pid   INTEGER NOT NULL,
    listener_since TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (listener_pid, listener_since)
);
