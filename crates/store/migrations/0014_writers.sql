-- Which process wrote each commit (issue 36): the writer a batch names (`host:pid`, or
-- the name its process gave). Batches written before are left without one.
ALTER TABLE batches ADD COLUMN writer TEXT;
