//! A job's tree-wide event stream (`GET /runs/{id}/events?tree=true`): the events of the run
//! and of every run below it, as they are committed, each with its `run_id` and `seq`.
//!
//! A tree stream's event id is where the stream stands in every run of the tree, so a
//! reconnect with `Last-Event-ID` resumes exactly: `SEQ` for the root, followed by its
//! children's positions in parentheses, in the order the parent's log started them —
//! `12(5,3(2))` is root event 12 delivered, its first child's event 5, its second child's
//! event 3 and that one's first child's event 2. A child's place never moves (a log is only
//! appended to), so an id stays valid however the tree grows. The run and seq of the event
//! itself are in its data. The text of model answers of the tree's runs comes between them
//! as it arrives (`model_delta`, no id).

use std::sync::Arc;
use std::time::Duration;

use baton_engine::Status;
use baton_engine::event::{Event, EventData};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;

use crate::app::App;
use crate::event_wire::{Woke, event_json, live_event};
use crate::limits::StreamPlace;
use crate::problem::Problem;

/// How long a tree stream waits for any of its runs before it looks at all of them again.
const WAIT_EACH: Duration = Duration::from_secs(30);

/// Where a stream stands in one run and in the runs below it.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Place {
    pub(crate) after: u64,
    pub(crate) children: Vec<Place>,
}

impl Place {
    /// The id form: `SEQ` or `SEQ(CHILD,CHILD…)`.
    pub(crate) fn encode(&self, out: &mut String) {
        out.push_str(&self.after.to_string());
        if !self.children.is_empty() {
            out.push('(');
            for (i, c) in self.children.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                c.encode(out);
            }
            out.push(')');
        }
    }

    /// Reads an id made by [`Place::encode`]; at most `runs_max` places.
    pub(crate) fn decode(text: &str, runs_max: usize) -> Result<Place, String> {
        let bytes = text.trim().as_bytes();
        let mut at = 0;
        let mut count = 0;
        let place = Self::node(bytes, &mut at, &mut count, runs_max, 0)?;
        if at != bytes.len() {
            return Err(format!("unexpected {:?} at {at}", char::from(bytes[at])));
        }
        Ok(place)
    }

    fn node(
        b: &[u8],
        at: &mut usize,
        count: &mut usize,
        max: usize,
        depth: usize,
    ) -> Result<Place, String> {
        *count += 1;
        if *count > max || depth > 64 {
            return Err(format!("more than {max} runs or too deep"));
        }
        let start = *at;
        while *at < b.len() && b[*at].is_ascii_digit() {
            *at += 1;
        }
        let digits = std::str::from_utf8(&b[start..*at]).unwrap_or_default();
        let after = digits.parse::<u64>().map_err(|_| format!("a seq expected at {start}"))?;
        let mut children = Vec::new();
        if b.get(*at) == Some(&b'(') {
            *at += 1;
            loop {
                children.push(Self::node(b, at, count, max, depth + 1)?);
                match b.get(*at) {
                    Some(b',') => *at += 1,
                    Some(b')') => {
                        *at += 1;
                        break;
                    }
                    _ => return Err(format!("`,` or `)` expected at {at}")),
                }
            }
        }
        Ok(Place { after, children })
    }
}

/// One run of the followed tree.
struct Node {
    run_id: String,
    after: u64,
    /// The children its delivered events started, in its log's order.
    children: Vec<usize>,
    ended: bool,
}

/// A tree stream's state.
pub(crate) struct TreeFollower {
    live: tokio::sync::broadcast::Receiver<Arc<baton_engine::cancel::LiveText>>,
    app: Arc<App>,
    nodes: Vec<Node>,
    buffer: std::collections::VecDeque<(usize, Event)>,
    done: bool,
    _place: StreamPlace,
}

impl TreeFollower {
    /// Follows the tree of `root` from `from` (none: from the start).
    pub(crate) async fn new(
        app: Arc<App>,
        root: &str,
        from: Option<Place>,
        place: StreamPlace,
    ) -> Result<Self, Problem> {
        let mut follower = TreeFollower {
            live: app.live.subscribe(),
            app,
            nodes: vec![Node {
                run_id: root.to_owned(),
                after: 0,
                children: Vec::new(),
                ended: false,
            }],
            buffer: std::collections::VecDeque::new(),
            done: false,
            _place: place,
        };
        if let Some(from) = from {
            follower.restore(0, &from).await?;
        }
        Ok(follower)
    }

    /// Sets node `index` and the nodes below it to `place`, finding each child from its
    /// parent's log.
    fn restore<'a>(
        &'a mut self,
        index: usize,
        place: &'a Place,
    ) -> futures_util::future::BoxFuture<'a, Result<(), Problem>> {
        Box::pin(async move {
            let run_id = self.nodes[index].run_id.clone();
            let delivered = self.app.store.load(&run_id, 0).await?;
            if delivered.len() < usize::try_from(place.after).unwrap_or(usize::MAX) {
                return Err(Problem::bad_request(format!(
                    "Last-Event-ID places run {run_id} at event {}, and its log has {}",
                    place.after,
                    delivered.len()
                )));
            }
            self.nodes[index].after = place.after;
            let started: Vec<String> = delivered
                .iter()
                .take_while(|e| e.seq <= place.after)
                .filter_map(|e| match &e.data {
                    EventData::ChildRunStarted(c) => Some(c.child_run_id.clone()),
                    _ => None,
                })
                .collect();
            if started.len() < place.children.len() {
                return Err(Problem::bad_request(format!(
                    "Last-Event-ID names {} runs below run {run_id}, which had started {}",
                    place.children.len(),
                    started.len()
                )));
            }
            for (i, child) in started.into_iter().enumerate() {
                let at = self.add(index, child)?;
                if let Some(p) = place.children.get(i) {
                    self.restore(at, p).await?;
                }
            }
            Ok(())
        })
    }

    fn add(&mut self, parent: usize, run_id: String) -> Result<usize, Problem> {
        if self.nodes.len() >= baton_engine::limits::TREE_RUNS_MAX {
            return Err(Problem::conflict(format!(
                "the tree has more than {} runs; follow its runs one by one",
                baton_engine::limits::TREE_RUNS_MAX
            )));
        }
        self.nodes.push(Node { run_id, after: 0, children: Vec::new(), ended: false });
        let at = self.nodes.len() - 1;
        self.nodes[parent].children.push(at);
        Ok(at)
    }

    fn place(&self, index: usize) -> Place {
        let n = &self.nodes[index];
        Place { after: n.after, children: n.children.iter().map(|c| self.place(*c)).collect() }
    }

    /// The next event as an SSE event, or None once every run of the tree has ended.
    pub(crate) async fn next(
        mut self,
    ) -> Option<(Result<axum::response::sse::Event, std::convert::Infallible>, Self)> {
        loop {
            if let Some((index, e)) = self.buffer.pop_front() {
                self.nodes[index].after = e.seq;
                if let EventData::ChildRunStarted(c) = &e.data
                    && self.add(index, c.child_run_id.clone()).is_err()
                {
                    self.done = true;
                }
                if matches!(e.data, EventData::ScenarioFinished(_)) {
                    self.nodes[index].ended = true;
                }
                let mut id = String::new();
                self.place(0).encode(&mut id);
                let data = event_json(&self.nodes[index].run_id, &e).to_string();
                let sse =
                    axum::response::sse::Event::default().id(id).event(e.data.kind()).data(data);
                return Some((Ok(sse), self));
            }
            if self.done || self.app.stop.is_cancelled() {
                return None;
            }
            let mut found = false;
            for index in 0..self.nodes.len() {
                if self.nodes[index].ended {
                    continue;
                }
                let run_id = self.nodes[index].run_id.clone();
                match self.app.events_after(&run_id, self.nodes[index].after).await {
                    Ok(events) if !events.is_empty() => {
                        found = true;
                        // One run's new events at a time, so a parent's child_run_started
                        // comes before the child's first event.
                        self.buffer.extend(events.into_iter().map(|e| (index, e)));
                        break;
                    }
                    Ok(_) => {
                        // A run that ended without a `scenario_finished` after this point.
                        if let Ok(Some(r)) = self.app.store.run(&run_id).await
                            && Status::from_name(&r.status).is_some_and(Status::is_final)
                            && r.last_seq <= self.nodes[index].after
                        {
                            self.nodes[index].ended = true;
                        }
                    }
                    // A child recorded but not created yet is looked at again later.
                    Err(baton_engine::store::Error::NotFound(_)) if index > 0 => {}
                    Err(_) => return None,
                }
            }
            if found {
                continue;
            }
            if self.nodes.iter().all(|n| n.ended) {
                return None;
            }
            let app = Arc::clone(&self.app);
            let mut waits: FuturesUnordered<_> = self
                .nodes
                .iter()
                .filter(|n| !n.ended)
                .map(|n| {
                    let (store, run_id, after) =
                        (Arc::clone(&app.store), n.run_id.clone(), n.after);
                    async move { store.wait_for_events(&run_id, after, WAIT_EACH).await }
                })
                .collect();
            // Text of runs outside the tree wakes this stream without a look at the store.
            let woke = loop {
                tokio::select! {
                    _ = waits.next() => break Woke::Events,
                    got = self.live.recv() => match got {
                        Ok(t) if self.nodes.iter().any(|n| !n.ended && *n.run_id == *t.run_id) => {
                            break Woke::Text(t);
                        }
                        Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                            break Woke::Events;
                        }
                    },
                    () = app.stop.cancelled() => break Woke::Stop,
                }
            };
            drop(waits);
            match woke {
                Woke::Text(t) => {
                    return Some((Ok(live_event(&t)), self));
                }
                Woke::Stop => return None,
                Woke::Events => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Place;

    #[test]
    fn places_read_back_what_they_wrote() {
        let p = Place {
            after: 12,
            children: vec![
                Place { after: 5, children: vec![] },
                Place { after: 3, children: vec![Place { after: 2, children: vec![] }] },
            ],
        };
        let mut s = String::new();
        p.encode(&mut s);
        assert_eq!(s, "12(5,3(2))");
        assert_eq!(Place::decode(&s, 10), Ok(p));
        assert_eq!(Place::decode("7", 10), Ok(Place { after: 7, children: vec![] }));
        for bad in ["", "(", "1(", "1(2", "1(2,)", "x", "1)", "1(2)(3)"] {
            assert!(Place::decode(bad, 10).is_err(), "{bad:?}");
        }
        assert!(Place::decode("1(1,1,1)", 3).is_err(), "the number of runs is bounded");
    }
}
