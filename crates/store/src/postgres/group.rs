//! Group appends on PostgreSQL. The appends a process makes on the ends of logs it knows —
//! its drivers' appends, about one a level — are gathered while the statement before them
//! runs and written together: one statement, so one transaction and one commit, for every
//! run of the group. Each run's events are applied only where the run still ends where this
//! process knows (last seq, head hash, the stored hash of its last event) and its hold is
//! still this process's at the epoch it took it; a run that misses is told so and takes the
//! slow path alone, which says exactly what differs. One task owns the gathering: the
//! statements follow each other, so a run never has two of them in flight; while other runs
//! of the process may append, a group gathers for up to a millisecond ([`GATHER`]).

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use baton_engine::chain::Hash;
use baton_engine::store::Error;
use deadpool_postgres::Pool;
use tokio::sync::{mpsc, oneshot};

use super::common::{Batch, CHANNEL, Held, NOW_US, knows, lock, pg, seq_param};

/// The most runs one group statement writes.
const GROUP_RUNS_MAX: usize = 128;

/// The most events one group statement writes.
const GROUP_EVENTS_MAX: usize = 4096;

/// The most payload bytes one group statement carries (a larger append is written alone).
const GROUP_BYTES_MAX: usize = 8 << 20;

/// How long a group gathers after its first append while other runs this process holds may
/// append too (one tick of the runtime's timer, at most 1 ms). The server's CPU goes into
/// each statement as much as into each row: at 100 runs in flight, gathering this long
/// wrote a fifth fewer statements, for a fifth more levels a second and a shorter wait per
/// level. A process driving one run never waits.
const GATHER: std::time::Duration = std::time::Duration::from_millis(1);

/// The most give-backs of holds one group statement writes.
const GROUP_GIVES_MAX: usize = 1024;

/// What the group writer is asked to write.
pub(super) enum Queued {
    Append(Box<KnownAppend>),
    /// Give back the run's hold taken at this epoch (its guard was dropped).
    Give(String, i64),
}

/// An append on the end of a run's log this process knows, waiting for its group.
pub(super) struct KnownAppend {
    pub run_id: String,
    /// The end it builds on: last seq and head hash.
    pub known: (u64, Hash),
    /// The epoch of this process's hold on the run.
    pub epoch: i64,
    pub status: String,
    pub batch: Batch,
    /// The run this append creates (its first events; its known end is the genesis), or
    /// none for an append on a run that exists.
    pub new: Option<NewRun>,
    /// Whether it was applied (false: the run's end or hold differ — take the slow path).
    pub reply: oneshot::Sender<Result<bool, Error>>,
}

/// What the row of a run created in a group holds besides its end.
pub(super) struct NewRun {
    pub scenario_id: String,
    pub created_us: i64,
    /// When its last event happened (when it was made, without events).
    pub updated_us: i64,
    pub parent_run_id: Option<String>,
    pub root_run_id: Option<String>,
    pub tenant: Option<String>,
    /// Whether the statement takes the run's hold (epoch 1), for a new run's id.
    pub take_hold: bool,
}

/// Who the group statements write for: the process's holder name, its hold connection's
/// session (named by the holds a creation takes) and how long a hold lasts unrenewed.
pub(super) struct Holder {
    pub name: String,
    pub session: (i32, std::time::SystemTime),
    pub hold_us: i64,
}

impl KnownAppend {
    fn bytes(&self) -> usize {
        self.batch.datas.iter().map(String::len).sum()
    }
}

/// Starts the task that writes groups of known appends; its queue.
pub(super) fn start(
    pool: Pool,
    holder: Holder,
    held: Held,
    commits: Arc<AtomicU64>,
) -> mpsc::UnboundedSender<Queued> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(write_groups(pool, holder, held, commits, rx));
    tx
}

async fn write_groups(
    pool: Pool,
    holder: Holder,
    held: Held,
    commits: Arc<AtomicU64>,
    mut rx: mpsc::UnboundedReceiver<Queued>,
) {
    // Appends put off to the next group because their run already had one in this group.
    let mut later: VecDeque<KnownAppend> = VecDeque::new();
    // Give-backs waiting for the next group.
    let mut gives: Vec<(String, i64)> = Vec::new();
    loop {
        let first = match later.pop_front() {
            Some(a) => Some(a),
            None if !gives.is_empty() => None,
            None => match rx.recv().await {
                Some(Queued::Append(a)) => Some(*a),
                Some(Queued::Give(run_id, epoch)) => {
                    gives.push((run_id, epoch));
                    None
                }
                None => return,
            },
        };
        if lock(&held).len() > 1 {
            tokio::time::sleep(GATHER).await;
        }
        let (mut runs, mut events, mut bytes) = (HashSet::new(), 0, 0);
        let mut group = Vec::new();
        if let Some(first) = first {
            runs.insert(first.run_id.clone());
            events = first.batch.seqs.len();
            bytes = first.bytes();
            group.push(first);
        }
        let mut again = VecDeque::new();
        let mut from_later = std::mem::take(&mut later);
        loop {
            if group.len() >= GROUP_RUNS_MAX || gives.len() >= GROUP_GIVES_MAX {
                break;
            }
            let next = match from_later.pop_front() {
                Some(a) => a,
                None => match rx.try_recv() {
                    Ok(Queued::Append(a)) => *a,
                    Ok(Queued::Give(run_id, epoch)) => {
                        gives.push((run_id, epoch));
                        continue;
                    }
                    Err(_) => break,
                },
            };
            let n = next.batch.seqs.len();
            let b = next.bytes();
            if runs.contains(&next.run_id)
                || events + n > GROUP_EVENTS_MAX
                || bytes + b > GROUP_BYTES_MAX
            {
                again.push_back(next);
                continue;
            }
            runs.insert(next.run_id.clone());
            events += n;
            bytes += b;
            group.push(next);
        }
        again.extend(from_later);
        later = again;
        // A run's hold is given back after its last append has been answered, so never in
        // the group of one of its appends; were it, it would wait for the next.
        let given: Vec<(String, i64)>;
        (given, gives) = gives.into_iter().partition(|(run_id, _)| !runs.contains(run_id));
        group.sort_unstable_by(|a, b| a.run_id.cmp(&b.run_id));
        write_group(&pool, &holder, &held, &commits, group, given).await;
    }
}

/// The group statement: `$1`–`$8` one row per run that exists, in run id order (the order
/// rows are locked in, so two groups never wait on each other crosswise), `$9` the holder,
/// `$10`–`$18` one row per event, `$19`–`$30` one row per run it creates (made only while
/// the process's hold on it stands, or — for a new run's id — with its hold taken here, by
/// the session `$31`, `$32` for `$33` µs; an id already taken fails the whole statement,
/// and each of its appends and creations takes the slow path, which names the conflict;
/// a run with an idempotency key is never created here). `$34`, `$35` the runs whose holds
/// this process gives back, and at which epochs. Returns the runs it applied, and notifies
/// each on [`CHANNEL`] (PostgreSQL sends one notice per run and commit, however many
/// events), so that followers and steps waiting on a run in other processes wake at once.
///
/// A run created here has the default placement (a run with its own takes the one-run
/// path); each run's `events_version` becomes at least this build's.
///
/// Each run's row and hold are looked up by key, one input row at a time (a `LATERAL`
/// subquery that `OFFSET 0` keeps from being merged into a join): the statement is
/// planned once per connection, often while the tables are nearly empty, and a plan that
/// joined the input to a scan of `runs` would read the whole table on every group once it
/// has grown.
static GROUP_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    use baton_engine::event::VERSION;
    format!(
        "WITH input AS (
   SELECT * FROM UNNEST($1::text[], $2::bigint[], $3::bytea[], $4::bigint[], $5::bigint[],
                        $6::text[], $7::bigint[], $8::bytea[])
     AS i(run_id, known_last, known_head, epoch, new_last, status, updated_us, new_head)
 ), ended AS (
   SELECT r.run_id FROM input i CROSS JOIN LATERAL (
     SELECT r.run_id FROM runs r
      WHERE r.run_id = i.run_id AND r.last_seq = i.known_last AND r.head_hash = i.known_head
        AND (i.known_last = 0 OR r.head_hash =
             (SELECT e.hash FROM events e WHERE e.run_id = r.run_id AND e.seq = i.known_last))
      OFFSET 0 FOR UPDATE OF r) r
 ), fresh AS (
   SELECT * FROM UNNEST($19::text[], $20::text[], $21::text[], $22::bigint[], $23::bigint[],
                        $24::bigint[], $25::bytea[], $26::text[], $27::text[], $28::text[],
                        $29::bigint[], $30::bool[])
     AS n(run_id, scenario_id, status, created_us, updated_us, last_seq, head_hash,
          parent_run_id, root_run_id, tenant, epoch, take_hold)
 ), held AS (
   SELECT h.run_id
     FROM (SELECT run_id, epoch FROM input UNION ALL SELECT run_id, epoch FROM fresh) w
    CROSS JOIN LATERAL (
     SELECT h.run_id FROM holds h
      WHERE h.run_id = w.run_id AND h.holder = $9 AND h.epoch = w.epoch
      OFFSET 0 FOR SHARE OF h) h
 ), ok AS (
   SELECT run_id FROM ended WHERE run_id IN (SELECT run_id FROM held)
 ), fresh_taken AS (
   INSERT INTO holds (run_id, holder, holder_pid, holder_since, until_us, epoch)
   SELECT n.run_id, $9, $31, $32, {NOW_US} + $33, 1
     FROM fresh n WHERE n.take_hold
   ON CONFLICT (run_id) DO NOTHING
   RETURNING run_id
 ), created AS (
   INSERT INTO runs (run_id, scenario_id, status, created_us, updated_us, last_seq, head_hash,
                     parent_run_id, root_run_id, tenant, chain, events_version)
   SELECT n.run_id, n.scenario_id, n.status, n.created_us, n.updated_us, n.last_seq,
          n.head_hash, n.parent_run_id, n.root_run_id, n.tenant, 2, {VERSION}
     FROM fresh n
    WHERE n.run_id IN (SELECT run_id FROM held UNION ALL SELECT run_id FROM fresh_taken)
   RETURNING run_id
 ), given AS (
   DELETE FROM holds h USING UNNEST($34::text[], $35::bigint[]) AS g(run_id, epoch)
    WHERE h.run_id = g.run_id AND h.holder = $9 AND h.epoch = g.epoch
 ), inserted AS (
   INSERT INTO events (run_id, seq, at_us, kind, version, level_id, attempt, data, hash, writer)
   SELECT ev.*, CASE WHEN ev.seq = min(ev.seq) OVER (PARTITION BY ev.run_id)
                     THEN current_setting('baton.writer', true) END
     FROM UNNEST($10::text[], $11::bigint[], $12::bigint[], $13::text[], $14::int[],
                        $15::text[], $16::bigint[], $17::text[], $18::bytea[])
     AS ev(run_id, seq, at_us, kind, version, level_id, attempt, data, hash)
    WHERE ev.run_id IN (SELECT run_id FROM ok UNION ALL SELECT run_id FROM created)
 ), updated AS (
   UPDATE runs r SET last_seq = i.new_last, status = i.status, updated_us = i.updated_us,
                     head_hash = i.new_head, events_version = GREATEST(r.events_version, {VERSION})
     FROM input i
    WHERE r.run_id = i.run_id AND r.run_id IN (SELECT run_id FROM ok)
   RETURNING r.run_id
 )
 SELECT w.run_id, pg_notify('{CHANNEL}', w.run_id)
   FROM (SELECT run_id FROM updated UNION ALL SELECT run_id FROM created) w"
    )
});

/// Gives back holds on their own: `$1` the runs, `$2` the holder, `$3` the epochs.
const GIVE_SQL: &str =
    "DELETE FROM holds h USING UNNEST($1::text[], $3::bigint[]) AS g(run_id, epoch)
  WHERE h.run_id = g.run_id AND h.holder = $2 AND h.epoch = g.epoch";

/// Writes one group and tells each append whether it was applied. A refusal by the server
/// (a deadlock with another process taking a run over, say) sends every append of the
/// group to the slow path; a lost connection is an error for each, as it would be alone.
async fn write_group(
    pool: &Pool,
    holder: &Holder,
    held: &Held,
    commits: &AtomicU64,
    group: Vec<KnownAppend>,
    given: Vec<(String, i64)>,
) {
    let runs = group.len();
    let events: usize = group.iter().map(|a| a.batch.seqs.len()).sum();
    let given_ids: Vec<&str> = given.iter().map(|(run_id, _)| run_id.as_str()).collect();
    let given_epochs: Vec<i64> = given.iter().map(|(_, epoch)| *epoch).collect();
    let mut refused = false;
    let mut run_ids = Vec::with_capacity(runs);
    let mut known_last = Vec::with_capacity(runs);
    let mut known_head = Vec::with_capacity(runs);
    let mut epochs = Vec::with_capacity(runs);
    let mut new_last = Vec::with_capacity(runs);
    let mut statuses = Vec::with_capacity(runs);
    let mut updated = Vec::with_capacity(runs);
    let mut new_head = Vec::with_capacity(runs);
    let mut ev_runs: Vec<&str> = Vec::with_capacity(events);
    let mut seqs = Vec::with_capacity(events);
    let mut ats = Vec::with_capacity(events);
    let mut kinds = Vec::with_capacity(events);
    let mut versions = Vec::with_capacity(events);
    let mut levels = Vec::with_capacity(events);
    let mut attempts = Vec::with_capacity(events);
    let mut datas: Vec<&str> = Vec::with_capacity(events);
    let mut hashes: Vec<&[u8]> = Vec::with_capacity(events);
    let mut fresh = Fresh::default();
    for a in &group {
        let b = &a.batch;
        ev_runs.extend(std::iter::repeat_n(a.run_id.as_str(), b.seqs.len()));
        seqs.extend_from_slice(&b.seqs);
        ats.extend_from_slice(&b.ats);
        kinds.extend_from_slice(&b.kinds);
        versions.extend_from_slice(&b.versions);
        levels.extend(b.levels.iter().map(Option::as_deref));
        attempts.extend_from_slice(&b.attempts);
        datas.extend(b.datas.iter().map(String::as_str));
        hashes.extend(b.hashes.iter().map(Vec::as_slice));
        if let Some(new) = &a.new {
            fresh.push(a, new);
            continue;
        }
        run_ids.push(a.run_id.as_str());
        known_last.push(seq_param(a.known.0));
        known_head.push(a.known.1.as_slice());
        epochs.push(a.epoch);
        new_last.push(b.last_param);
        statuses.push(a.status.as_str());
        updated.push(b.updated_us);
        new_head.push(b.head_param.as_slice());
    }
    let answer: Result<HashSet<String>, Error> = async {
        let c = pool
            .get()
            .await
            .map_err(|e| Error::Backend(format!("postgres: no connection: {e}")))?;
        let stmt = c.prepare_cached(&GROUP_SQL).await.map_err(pg)?;
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 35] = [
            &run_ids,
            &known_last,
            &known_head,
            &epochs,
            &new_last,
            &statuses,
            &updated,
            &new_head,
            &holder.name,
            &ev_runs,
            &seqs,
            &ats,
            &kinds,
            &versions,
            &levels,
            &attempts,
            &datas,
            &hashes,
            &fresh.run_ids,
            &fresh.scenario_ids,
            &fresh.statuses,
            &fresh.created,
            &fresh.updated,
            &fresh.last,
            &fresh.head,
            &fresh.parents,
            &fresh.roots,
            &fresh.tenants,
            &fresh.epochs,
            &fresh.take_hold,
            &holder.session.0,
            &holder.session.1,
            &holder.hold_us,
            &given_ids,
            &given_epochs,
        ];
        match c.query(&stmt, &params).await {
            Ok(rows) => {
                commits.fetch_add(1, Ordering::Relaxed);
                Ok(rows.iter().filter_map(|r| r.try_get::<_, String>(0).ok()).collect())
            }
            // The server refused the statement as a whole: each append alone.
            Err(e) if e.as_db_error().is_some() => {
                refused = true;
                Ok(HashSet::new())
            }
            Err(e) => Err(pg(e)),
        }
    }
    .await;
    // The give-backs of a refused group, once more on their own. Left undone (the server
    // unreachable), a hold is taken over once it runs out, or at once when this process's
    // session ends, or by this process's next taking of the run.
    if refused && !given.is_empty() {
        let gave = async {
            let c = pool.get().await.ok()?;
            c.execute(GIVE_SQL, &[&given_ids, &holder.name, &given_epochs]).await.ok()
        };
        if gave.await.is_some_and(|rows| rows > 0) {
            commits.fetch_add(1, Ordering::Relaxed);
        }
    }
    match answer {
        Ok(applied) => {
            for a in group {
                let done = applied.contains(&a.run_id);
                if done {
                    knows(held, &a.run_id, a.batch.end());
                }
                let _ = a.reply.send(Ok(done));
            }
        }
        Err(e) => {
            for a in group {
                let _ = a.reply.send(Err(e.clone()));
            }
        }
    }
}

/// The columns of the runs a group creates, one entry per run.
#[derive(Default)]
struct Fresh<'a> {
    run_ids: Vec<&'a str>,
    scenario_ids: Vec<&'a str>,
    statuses: Vec<&'a str>,
    created: Vec<i64>,
    updated: Vec<i64>,
    last: Vec<i64>,
    head: Vec<&'a [u8]>,
    parents: Vec<Option<&'a str>>,
    roots: Vec<Option<&'a str>>,
    tenants: Vec<Option<&'a str>>,
    epochs: Vec<i64>,
    take_hold: Vec<bool>,
}

impl<'a> Fresh<'a> {
    fn push(&mut self, a: &'a KnownAppend, new: &'a NewRun) {
        self.run_ids.push(&a.run_id);
        self.scenario_ids.push(&new.scenario_id);
        self.statuses.push(&a.status);
        self.created.push(new.created_us);
        self.updated.push(new.updated_us);
        self.last.push(a.batch.last_param);
        self.head.push(&a.batch.head_param);
        self.parents.push(new.parent_run_id.as_deref());
        self.roots.push(new.root_run_id.as_deref());
        self.tenants.push(new.tenant.as_deref());
        self.epochs.push(a.epoch);
        self.take_hold.push(new.take_hold);
    }
}
