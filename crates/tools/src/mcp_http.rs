//! A client of an MCP server over Streamable HTTP: each JSON-RPC message is a POST to the
//! server's URL (through the egress guard's client), answered with JSON or with an event
//! stream whose events carry the answer; the session the server names on `initialize`
//! (`Mcp-Session-Id`) goes with every later request and is ended (`DELETE`) when the
//! attempt is done. Answers are read up to a bound.

use std::sync::atomic::{AtomicU64, Ordering};

use baton_verifiers::mcp_client::{Answer, PROTOCOL_VERSION, answer_of};
use serde_json::{Value, json};

/// Largest answer read, in bytes.
const ANSWER_BYTES_MAX: usize = 8 * 1024 * 1024;

/// The longest the `DELETE` that ends a session may take (it is sent in the background as
/// the attempt ends; a server that does not answer in time keeps the session until it
/// expires it).
pub(crate) const END_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// A session with one server.
#[derive(Debug)]
pub(crate) struct HttpServer {
    client: reqwest::Client,
    url: reqwest::Url,
    session: Option<String>,
    next_id: AtomicU64,
}

impl HttpServer {
    /// Opens a session: `initialize`, then `notifications/initialized`.
    pub(crate) async fn start(
        client: reqwest::Client,
        url: reqwest::Url,
    ) -> Result<HttpServer, String> {
        let mut server = HttpServer { client, url, session: None, next_id: AtomicU64::new(1) };
        let init = json!({
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "baton", "version": env!("CARGO_PKG_VERSION")},
        });
        let (answer, session) = server.exchange("initialize", Some(init)).await?;
        if let Answer::Error { code, message } = answer {
            return Err(format!(
                "the server refused `initialize`: JSON-RPC error {code}: {message}"
            ));
        }
        server.session = session;
        server.exchange("notifications/initialized", None).await?;
        Ok(server)
    }

    /// One request and its answer.
    pub(crate) async fn request(&self, method: &str, params: Value) -> Result<Answer, String> {
        Ok(self.exchange(method, Some(params)).await?.0)
    }

    /// Sends a request (with `params`) or a notification (without), and reads the answer of
    /// a request; also the session the server names, if it does.
    async fn exchange(
        &self,
        method: &str,
        params: Option<Value>,
    ) -> Result<(Answer, Option<String>), String> {
        let id = params.as_ref().map(|_| self.next_id.fetch_add(1, Ordering::Relaxed));
        let message = match (&params, id) {
            (Some(p), Some(id)) => {
                json!({"jsonrpc": "2.0", "id": id, "method": method, "params": p})
            }
            _ => json!({"jsonrpc": "2.0", "method": method}),
        };
        let mut request = self
            .client
            .post(self.url.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(reqwest::header::ACCEPT, "application/json, text/event-stream")
            .header("MCP-Protocol-Version", PROTOCOL_VERSION)
            .body(message.to_string());
        if let Some(session) = &self.session {
            request = request.header("Mcp-Session-Id", session);
        }
        let mut response =
            request.send().await.map_err(|e| format!("`{method}`: {}", describe(&e)))?;
        let status = response.status();
        let session = response
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let stream = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("text/event-stream"));
        let Some(id) = id else {
            if !status.is_success() {
                return Err(format!("`{method}`: HTTP {status}"));
            }
            return Ok((Answer::Result(Value::Null), session));
        };
        if !status.is_success() {
            let body = read(&mut response, 4096).await.unwrap_or_default();
            return Err(format!("`{method}`: HTTP {status}: {}", String::from_utf8_lossy(&body)));
        }
        let body = read(&mut response, ANSWER_BYTES_MAX).await?;
        let messages: Vec<Value> = if stream {
            events(&body)
        } else {
            serde_json::from_slice::<Value>(&body).map(|v| vec![v]).unwrap_or_default()
        };
        let answer = messages
            .into_iter()
            .find(|m| m.get("id").and_then(Value::as_u64) == Some(id) && m.get("method").is_none())
            .ok_or_else(|| format!("`{method}`: the server's answer holds no response to it"))?;
        Ok((answer_of(&answer), session))
    }

    /// Ends the session (best effort, within [`END_TIMEOUT`]).
    pub(crate) async fn end(&self) {
        if let Some(session) = &self.session {
            let _ = self
                .client
                .delete(self.url.clone())
                .header("Mcp-Session-Id", session)
                .timeout(END_TIMEOUT)
                .send()
                .await;
        }
    }
}

/// The JSON messages of an event stream's `data:` lines, one per event.
fn events(body: &[u8]) -> Vec<Value> {
    let text = String::from_utf8_lossy(body);
    let mut out = Vec::new();
    let mut data = String::new();
    for line in text.lines().chain(std::iter::once("")) {
        if line.is_empty() {
            if !data.is_empty() {
                if let Ok(v) = serde_json::from_str(&data) {
                    out.push(v);
                }
                data.clear();
            }
        } else if let Some(rest) = line.strip_prefix("data:") {
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(rest.strip_prefix(' ').unwrap_or(rest));
        }
    }
    out
}

/// Reads a body up to `max` bytes; more is an error.
async fn read(response: &mut reqwest::Response, max: usize) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| describe(&e))? {
        if body.len() + chunk.len() > max {
            return Err(format!("the server's answer is over {max} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

fn describe(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_stream_gives_each_events_json() {
        let body = b"event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\nid: 2\ndata: {\"jsonrpc\":\"2.0\",\"id\":2,\ndata: \"result\":{}}\n\n";
        let got = events(body);
        assert_eq!(got.len(), 2);
        assert_eq!(got[1]["id"], 2);
    }
}
