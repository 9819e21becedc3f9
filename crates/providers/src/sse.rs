//! Server-Sent Events, parsed per the WHATWG HTML standard's event-stream algorithm.
//!
//! Bytes arrive in chunks that may split anything — a line, a CR LF pair, a UTF-8
//! sequence — and the parser yields the same events however the stream is cut (a property
//! test holds this). Lines end with CR LF, LF or CR; a leading byte-order mark is dropped;
//! `:` lines are comments; an empty line dispatches the event when it has data; an event
//! left incomplete at the end of the stream is discarded.

/// One dispatched event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Event {
    /// The `event:` field, or `message`.
    pub event: String,
    /// The `data:` lines joined with LF.
    pub data: String,
    /// The last event id seen so far in the stream.
    pub id: Option<String>,
    /// The reconnection time, in milliseconds, as last set by a `retry:` field.
    pub retry: Option<u64>,
}

/// An incremental event-stream parser.
#[derive(Debug, Default)]
pub struct Parser {
    line: Vec<u8>,
    /// The previous chunk ended with CR: a LF that starts the next one belongs to it.
    after_cr: bool,
    /// Whether the start of the stream (and a possible BOM) is behind us.
    started: bool,
    data: String,
    event: String,
    last_id: Option<String>,
    retry: Option<u64>,
    has_data: bool,
}

const BOM: &[u8] = b"\xEF\xBB\xBF";

impl Parser {
    /// A parser at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds a chunk; complete events are pushed onto `out`.
    pub fn feed(&mut self, mut chunk: &[u8], out: &mut Vec<Event>) {
        if chunk.is_empty() {
            // Nothing to see; above all, a pending CR must still swallow the next LF.
            return;
        }
        if !self.started {
            // The BOM may itself be split across chunks: hold bytes until we can tell.
            self.line.extend_from_slice(chunk);
            if self.line.len() < BOM.len() && BOM.starts_with(&self.line) {
                return;
            }
            self.started = true;
            let held = std::mem::take(&mut self.line);
            let rest = held.strip_prefix(BOM).unwrap_or(&held);
            return self.feed_lines(rest, out);
        }
        if self.after_cr {
            if let Some((&b'\n', rest)) = chunk.split_first() {
                chunk = rest;
            }
            self.after_cr = false;
        }
        self.feed_lines(chunk, out);
    }

    fn feed_lines(&mut self, mut chunk: &[u8], out: &mut Vec<Event>) {
        while let Some(i) = chunk.iter().position(|&b| b == b'\n' || b == b'\r') {
            self.line.extend_from_slice(&chunk[..i]);
            let line = std::mem::take(&mut self.line);
            self.process_line(&line, out);
            let ended_cr = chunk[i] == b'\r';
            chunk = &chunk[i + 1..];
            if ended_cr {
                match chunk.first() {
                    Some(b'\n') => chunk = &chunk[1..],
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
        }
        self.line.extend_from_slice(chunk);
    }

    /// Ends the stream: a line or an event without its terminating blank line is dropped.
    pub fn finish(&mut self) {
        self.line.clear();
        self.data.clear();
        self.event.clear();
        self.has_data = false;
    }

    fn process_line(&mut self, line: &[u8], out: &mut Vec<Event>) {
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        if line[0] == b':' {
            return;
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"data" => {
                self.data.push_str(&String::from_utf8_lossy(value));
                self.data.push('\n');
                self.has_data = true;
            }
            b"event" => self.event = String::from_utf8_lossy(value).into_owned(),
            b"id" if !value.contains(&0) => {
                self.last_id = Some(String::from_utf8_lossy(value).into_owned());
            }
            b"retry" if !value.is_empty() && value.iter().all(u8::is_ascii_digit) => {
                self.retry = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok());
            }
            _ => {}
        }
    }

    fn dispatch(&mut self, out: &mut Vec<Event>) {
        let retry = self.retry;
        if !self.has_data {
            self.event.clear();
            return;
        }
        let mut data = std::mem::take(&mut self.data);
        if data.ends_with('\n') {
            data.pop();
        }
        let event = std::mem::take(&mut self.event);
        self.has_data = false;
        out.push(Event {
            event: if event.is_empty() { "message".to_owned() } else { event },
            data,
            id: self.last_id.clone(),
            retry,
        });
    }
}

/// Parses a whole stream at once.
pub fn parse_all(bytes: &[u8]) -> Vec<Event> {
    let mut parser = Parser::new();
    let mut out = Vec::new();
    parser.feed(bytes, &mut out);
    parser.finish();
    out
}
