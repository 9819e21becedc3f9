//! Model answers streaming in, shared between processes on PostgreSQL. A worker's drives
//! publish each piece on [`LIVE_CHANNEL`] (`pg_notify`: never stored), and a server's
//! listen connection hands the pieces to its event streams, so that a follower of a
//! worker-driven run sees its answers arrive as a follower of a server-driven run does.
//!
//! Only while someone listens: a process that relays pieces to its followers names its
//! listen connection in `live_listeners` ([`LISTENER`]); a publisher looks at most every
//! [`AUDIENCE_LOOK_EVERY`] whether one of them lives, and drops its pieces while none does
//! (a fleet of workers with no server pays nothing for them).
//!
//! Best effort and bounded, like the live text of one process: a piece waits in a queue of
//! [`QUEUE_MAX`] (past it, pieces are dropped — the whole answer is in the log anyway); the
//! publisher gathers what queued for [`GATHER`], joins the pieces of one call that follow
//! each other, cuts texts into notifications well under PostgreSQL's 8 000-byte payload
//! limit, and sends up to [`PIECES_PER_STATEMENT`] in one statement.

use std::time::Duration;

use baton_engine::cancel::LiveText;
use deadpool_postgres::Pool;
use serde_json::json;
use tokio::sync::mpsc;

/// The channel pieces of answers are published on.
pub(crate) const LIVE_CHANNEL: &str = "baton_live";

/// Pieces waiting to be published, at most; more are dropped.
const QUEUE_MAX: usize = 4096;

/// How long the publisher gathers after a first piece.
const GATHER: Duration = Duration::from_millis(20);

/// Characters of text in one notification, at most: escaped as JSON (at most six bytes a
/// character) with its run, level and call, it stays under PostgreSQL's payload limit.
const CHARS_PER_NOTICE: usize = 1000;

/// Notifications one statement sends, at most.
const PIECES_PER_STATEMENT: usize = 256;

/// The longest run or level id a notification carries (ids are far shorter).
const ID_MAX: usize = 200;

/// How often a publisher looks whether anyone listens.
const AUDIENCE_LOOK_EVERY: Duration = Duration::from_secs(1);

/// Run on a listen connection that relays pieces: forgets listeners whose sessions are
/// gone, names this one, and listens.
pub(crate) const LISTENER: &str = "DELETE FROM live_listeners l WHERE NOT EXISTS
      (SELECT 1 FROM pg_stat_activity a
        WHERE a.pid = l.listener_pid AND a.backend_start = l.listener_since);
    INSERT INTO live_listeners (listener_pid, listener_since)
      SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()
      ON CONFLICT DO NOTHING;
    LISTEN baton_live";

/// Whether a listener named in `live_listeners` lives.
const AUDIENCE: &str = "SELECT EXISTS (SELECT 1 FROM live_listeners l JOIN pg_stat_activity a
    ON a.pid = l.listener_pid AND a.backend_start = l.listener_since)";

/// Starts the publisher; its queue.
pub(crate) fn start(pool: Pool) -> mpsc::Sender<LiveText> {
    let (tx, rx) = mpsc::channel(QUEUE_MAX);
    tokio::spawn(publish(pool, rx));
    tx
}

async fn publish(pool: Pool, mut rx: mpsc::Receiver<LiveText>) {
    // Whether anyone listened when last looked, and when that was.
    let mut audience: Option<(bool, tokio::time::Instant)> = None;
    while let Some(first) = rx.recv().await {
        let mut pieces = vec![first];
        let until = tokio::time::Instant::now() + GATHER;
        while pieces.len() < PIECES_PER_STATEMENT {
            match tokio::time::timeout_at(until, rx.recv()).await {
                Ok(Some(piece)) => pieces.push(piece),
                Ok(None) | Err(_) => break,
            }
        }
        let stale = audience.is_none_or(|(_, at)| at.elapsed() >= AUDIENCE_LOOK_EVERY);
        if stale {
            let listened = match pool.get().await {
                Ok(client) => client.query_one(AUDIENCE, &[]).await.map(|r| r.get::<_, bool>(0)),
                Err(_) => Ok(true),
            };
            // A failed look publishes (pieces are dropped only when nobody listens).
            audience = Some((listened.unwrap_or(true), tokio::time::Instant::now()));
        }
        if audience.is_some_and(|(any, _)| !any) {
            continue;
        }
        let notices = notices(pieces);
        // A failure loses these pieces only: followers still get the whole answer when
        // its event is committed.
        if let Ok(client) = pool.get().await
            && let Ok(stmt) = client
                .prepare_cached(&format!(
                    "SELECT pg_notify('{LIVE_CHANNEL}', p) FROM UNNEST($1::text[]) AS p"
                ))
                .await
        {
            let _ = client.execute(&stmt, &[&notices]).await;
        }
    }
}

/// The notifications for `pieces`: the pieces of one call that follow each other joined,
/// each text cut at [`CHARS_PER_NOTICE`].
fn notices(pieces: Vec<LiveText>) -> Vec<String> {
    let mut joined: Vec<LiveText> = Vec::with_capacity(pieces.len());
    for piece in pieces {
        if piece.run_id.len() > ID_MAX || piece.level_id.len() > ID_MAX {
            continue;
        }
        match joined.last_mut() {
            Some(last)
                if last.run_id == piece.run_id
                    && last.level_id == piece.level_id
                    && last.call == piece.call =>
            {
                last.text.push_str(&piece.text);
            }
            _ => joined.push(piece),
        }
    }
    let mut out = Vec::with_capacity(joined.len());
    for piece in &joined {
        let mut rest = piece.text.as_str();
        while !rest.is_empty() {
            let cut = rest.char_indices().nth(CHARS_PER_NOTICE).map_or(rest.len(), |(i, _)| i);
            let (text, after) = rest.split_at(cut);
            out.push(
                json!({"run": &*piece.run_id, "level": piece.level_id, "call": piece.call, "text": text})
                    .to_string(),
            );
            rest = after;
        }
    }
    out
}

/// The piece a notification on [`LIVE_CHANNEL`] carries, if it is one.
pub(crate) fn parse(payload: &str) -> Option<LiveText> {
    let v: serde_json::Value = serde_json::from_str(payload).ok()?;
    let run = v.get("run")?.as_str()?;
    let level = v.get("level")?.as_str()?;
    if run.len() > ID_MAX || level.len() > ID_MAX {
        return None;
    }
    Some(LiveText {
        run_id: run.into(),
        level_id: level.to_owned(),
        call: u32::try_from(v.get("call")?.as_u64()?).ok()?,
        text: v.get("text")?.as_str()?.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn piece(run: &str, call: u32, text: &str) -> LiveText {
        LiveText { run_id: run.into(), level_id: "l".to_owned(), call, text: text.to_owned() }
    }

    #[test]
    fn pieces_of_one_call_are_joined_and_long_texts_cut_under_the_payload_limit() {
        let long = "\u{1}é".repeat(1500);
        let n = notices(vec![
            piece("a", 0, "Hel"),
            piece("a", 0, "lo"),
            piece("b", 0, "other"),
            piece("a", 1, &long),
        ]);
        let parsed: Vec<LiveText> = n.iter().map(|p| parse(p).unwrap()).collect();
        assert_eq!(parsed[0], piece("a", 0, "Hello"));
        assert_eq!(parsed[1], piece("b", 0, "other"));
        let rest: String = parsed[2..].iter().map(|p| p.text.as_str()).collect();
        assert_eq!(rest, long);
        assert_eq!(parsed.len(), 2 + 3);
        assert!(n.iter().all(|p| p.len() < 8000), "{:?}", n.iter().map(String::len).max());
    }

    #[test]
    fn a_notification_that_is_not_a_piece_is_ignored() {
        assert_eq!(parse("not json"), None);
        assert_eq!(parse(r#"{"run": "a", "level": "l", "call": -1, "text": "x"}"#), None);
        let long =
            format!(r#"{{"run": "{}", "level": "l", "call": 0, "text": "x"}}"#, "r".repeat(300));
        assert_eq!(parse(&long), None);
    }
}
