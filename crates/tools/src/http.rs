//! `http` tools: one request per call, through the egress guard. The URL's placeholders
//! take the call's arguments percent-encoded; header values take secrets of baton.toml,
//! each only on its way to a host it lists and only for the tenants it lists; a write
//! call carries its idempotency key as `Idempotency-Key`; a redirect to another host is
//! not followed; the answer is read up to a bound.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Instant;

use baton_engine::cancel::CancelToken;
use baton_engine::tools::{OwnCall, RESULT_BYTES_MAX};
use baton_engine::workspace::ToolOutcome;
use baton_providers::egress::{EgressPolicy, host_matches};
use baton_providers::tool_client::same_host_client;
use baton_scenario::model::{HttpRequest, secret_references, url_placeholders};
use serde_json::Value;

/// The header a write call's idempotency key goes in.
pub const KEY_HEADER: &str = "Idempotency-Key";

/// A secret HTTP tools may send, as this process knows it.
#[derive(Clone)]
pub struct Secret {
    /// Its value; `None` when its variable is not set.
    pub value: Option<String>,
    /// The variable it comes from, for messages.
    pub env: String,
    pub hosts: Vec<String>,
    pub tenants: Option<Vec<String>>,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secret")
            .field("env", &self.env)
            .field("hosts", &self.hosts)
            .field("tenants", &self.tenants)
            .finish_non_exhaustive()
    }
}

/// Where HTTP tools may go and what they may send.
#[derive(Clone, Debug, Default)]
pub struct HttpSettings {
    pub egress: EgressPolicy,
    pub secrets: BTreeMap<String, Secret>,
}

/// Makes `http` tool calls.
#[derive(Debug)]
pub(crate) struct HttpTools {
    settings: HttpSettings,
    client: Result<reqwest::Client, String>,
}

/// The longest any one request may take, whatever the tool's timeout: an hour.
const REQUEST_TIMEOUT_MAX: std::time::Duration = std::time::Duration::from_secs(3600);

impl HttpTools {
    pub(crate) fn new(settings: HttpSettings) -> Self {
        let client = same_host_client(&settings.egress, REQUEST_TIMEOUT_MAX);
        HttpTools { settings, client }
    }

    /// Where requests may go.
    pub(crate) fn egress(&self) -> &EgressPolicy {
        &self.settings.egress
    }

    /// The client requests are sent with, or why there is none.
    pub(crate) fn client(&self) -> Result<&reqwest::Client, String> {
        self.client.as_ref().map_err(Clone::clone)
    }

    pub(crate) async fn call(
        &self,
        call: OwnCall<'_>,
        request: &HttpRequest,
        cancel: &CancelToken,
    ) -> ToolOutcome {
        let name = &call.tool.name;
        let client = match &self.client {
            Ok(c) => c,
            Err(why) => return ToolOutcome::error(format!("not called: {why}")),
        };
        let url = match render_url(&request.url, call.arguments) {
            Ok(u) => u,
            Err(why) => return ToolOutcome::error(format!("not called: {why}")),
        };
        let url = match reqwest::Url::parse(&url) {
            Ok(u) => u,
            Err(e) => return ToolOutcome::error(format!("not called: `{url}` is not a URL: {e}")),
        };
        if let Err(why) = self.settings.egress.check_url(&url) {
            return ToolOutcome::error(format!("not called: {why}"));
        }
        let host = url.host_str().unwrap_or_default().to_owned();
        let Ok(method) = reqwest::Method::from_bytes(request.method.as_bytes()) else {
            return ToolOutcome::error(format!("not called: `{}` is not a method", request.method));
        };
        let mut builder = client.request(method, url.clone());
        for (header, value) in &request.headers {
            match self.with_secrets(value, &host, call.tenant) {
                Ok(value) => builder = builder.header(header.as_str(), value),
                Err(why) => {
                    return ToolOutcome::error(format!("not called: header `{header}`: {why}"));
                }
            }
        }
        if let Some(key) = call.key {
            builder = builder.header(KEY_HEADER, key);
        }
        if request.body {
            builder = builder
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(call.arguments.to_string());
        }
        let Some(left) = call.deadline.checked_duration_since(Instant::now()) else {
            return ToolOutcome::error(format!("not called: no time is left for `{name}`"));
        };
        let exchange = async {
            let response = builder.timeout(left).send().await.map_err(|e| describe(&e))?;
            let status = response.status();
            let (body, cut) = read_capped(response).await?;
            Ok::<_, String>((status, body, cut))
        };
        let answered = tokio::select! {
            a = exchange => a,
            () = cancel.cancelled() => Err("cancelled".to_owned()),
            () = tokio::time::sleep(left) => Err(format!("no answer within its {:.0} s", left.as_secs_f64())),
        };
        match answered {
            Err(why) => ToolOutcome::error(format!("`{name}` got no answer from {host}: {why}")),
            Ok((status, body, cut)) => {
                let mut text = String::from_utf8_lossy(&body).into_owned();
                if cut {
                    let _ = write!(text, "\n[the answer was cut at {RESULT_BYTES_MAX} bytes]");
                }
                if status.is_success() {
                    ToolOutcome::ok(if text.trim().is_empty() {
                        format!("(an empty answer, HTTP {})", status.as_u16())
                    } else {
                        text
                    })
                } else {
                    ToolOutcome::error(format!("HTTP {status}: {text}"))
                }
            }
        }
    }

    /// `value` with its secrets in, when each may go to `host` for `tenant`'s run.
    fn with_secrets(
        &self,
        value: &str,
        host: &str,
        tenant: Option<&str>,
    ) -> Result<String, String> {
        let references = secret_references(value)?;
        let mut out = String::with_capacity(value.len());
        let mut last = 0;
        for (range, name) in references {
            let Some(secret) = self.settings.secrets.get(name) else {
                return Err(format!(
                    "secret `{name}` is not configured (add [secrets.{name}] to baton.toml)"
                ));
            };
            if !secret.hosts.iter().any(|h| host_matches(h, host)) {
                return Err(format!(
                    "secret `{name}` may not be sent to {host} (its hosts: {})",
                    secret.hosts.join(", ")
                ));
            }
            if let Some(tenants) = &secret.tenants
                && !tenant.is_some_and(|t| tenants.iter().any(|x| x == t))
            {
                return Err(format!("secret `{name}` is not for this run's tenant"));
            }
            let Some(secret_value) = &secret.value else {
                return Err(format!("secret `{name}`: the variable {} is not set", secret.env));
            };
            out.push_str(&value[last..range.start]);
            out.push_str(secret_value);
            last = range.end;
        }
        out.push_str(&value[last..]);
        Ok(out)
    }
}

/// The URL with each `{NAME}` replaced by the argument NAME, percent-encoded.
fn render_url(template: &str, arguments: &Value) -> Result<String, String> {
    let mut out = String::with_capacity(template.len());
    let mut last = 0;
    for (range, name) in url_placeholders(template)? {
        let text = match arguments.get(name) {
            Some(Value::String(s)) => s.clone(),
            Some(v @ (Value::Number(_) | Value::Bool(_))) => v.to_string(),
            Some(_) => return Err(format!("argument `{name}` is not a string, number or boolean")),
            None => return Err(format!("argument `{name}` is missing")),
        };
        out.push_str(&template[last..range.start]);
        for byte in text.bytes() {
            if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
                out.push(char::from(byte));
            } else {
                let _ = write!(out, "%{byte:02X}");
            }
        }
        last = range.end;
    }
    out.push_str(&template[last..]);
    Ok(out)
}

/// Reads at most [`RESULT_BYTES_MAX`] bytes of the answer; whether it was cut.
async fn read_capped(mut response: reqwest::Response) -> Result<(Vec<u8>, bool), String> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| describe(&e))? {
        // Room for the note a cut answer gets, so the result is within the bound as read.
        let room = RESULT_BYTES_MAX - 64 - body.len();
        if chunk.len() > room {
            body.extend_from_slice(&chunk[..room]);
            return Ok((body, true));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body, false))
}

/// A request's error with its causes (reqwest's own message hides the egress guard's).
fn describe(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        let _ = write!(text, ": {cause}");
        source = cause.source();
    }
    text
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tools(tenants: Option<Vec<String>>, value: Option<&str>) -> HttpTools {
        let secret = Secret {
            value: value.map(str::to_owned),
            env: "TICKETS_TOKEN".to_owned(),
            hosts: vec!["tickets.example.com".to_owned(), "*.example.org".to_owned()],
            tenants,
        };
        let secrets = [("tickets".to_owned(), secret)].into_iter().collect();
        HttpTools::new(HttpSettings { egress: EgressPolicy::default(), secrets })
    }

    #[test]
    fn a_secret_goes_only_to_its_hosts_for_its_tenants_and_only_when_it_is_set() {
        let header = "Bearer ${secret:tickets}";
        let open = tools(None, Some("s3cret"));
        assert_eq!(
            open.with_secrets(header, "tickets.example.com", None).unwrap(),
            "Bearer s3cret"
        );
        assert_eq!(
            open.with_secrets(header, "api.example.org", Some("acme")).unwrap(),
            "Bearer s3cret"
        );
        let elsewhere = open.with_secrets(header, "evil.example.net", None).unwrap_err();
        assert!(elsewhere.contains("may not be sent to evil.example.net"), "{elsewhere}");
        assert!(
            open.with_secrets("${secret:other}", "tickets.example.com", None)
                .unwrap_err()
                .contains("not configured")
        );
        let acme = tools(Some(vec!["acme".to_owned()]), Some("s3cret"));
        assert!(acme.with_secrets(header, "tickets.example.com", Some("acme")).is_ok());
        for tenant in [Some("globex"), None] {
            let refused = acme.with_secrets(header, "tickets.example.com", tenant).unwrap_err();
            assert!(refused.contains("not for this run's tenant"), "{refused}");
        }
        let unset =
            tools(None, None).with_secrets(header, "tickets.example.com", None).unwrap_err();
        assert!(unset.contains("the variable TICKETS_TOKEN is not set"), "{unset}");
    }

    #[test]
    fn a_url_takes_its_arguments_percent_encoded_and_refuses_what_it_cannot_place() {
        let args = json!({"id": "7/../admin?x=1", "n": 3, "flag": true, "obj": {}});
        assert_eq!(
            render_url("https://h.example/t/{id}?n={n}&f={flag}", &args).unwrap(),
            "https://h.example/t/7%2F..%2Fadmin%3Fx%3D1?n=3&f=true"
        );
        assert!(render_url("https://h.example/{obj}", &args).unwrap_err().contains("not a string"));
        assert!(render_url("https://h.example/{gone}", &args).unwrap_err().contains("missing"));
    }
}
