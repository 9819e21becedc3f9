-- Which process wrote each commit (issue 36): the first event of every batch names its
-- writer (`host:pid`, or the name its process gave); the others, and events written
-- before, have none.
ALTER TABLE events ADD COLUMN writer TEXT;
