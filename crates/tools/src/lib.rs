//! The user's own tools of a tool loop, as this process calls them: the engine's
//! [`ToolHost`]. A `command` tool is a program run the way every program a run starts is
//! — in the jail, no shell, a scrubbed environment, its own process group killed whole at
//! the timeout or on cancel, its output read with byte caps — with no network, in the
//! level's workspace, its call's arguments as JSON on stdin and a write call's idempotency
//! key in [`KEY_VARIABLE`]. An `http` tool is a request through the egress guard
//! ([`http`]).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use baton_engine::cancel::CancelToken;
use baton_engine::future::BoxFuture;
use baton_engine::tools::{Listed, OwnCall, ToolHost, ToolSession};
use baton_engine::workspace::ToolOutcome;
use baton_jail::Jail;
use baton_scenario::model::{OwnTool, ToolSource};
use baton_verifiers::program::{Program, run_program_with_input};

pub mod http;
pub mod mcp;
mod mcp_http;

pub use http::{HttpSettings, Secret};

/// The variable a `command` tool's program finds a write call's idempotency key in.
pub const KEY_VARIABLE: &str = "BATON_IDEMPOTENCY_KEY";

/// Bytes of a failing program's stderr given back with its result.
const STDERR_TAIL_BYTES: usize = 4 * 1024;

/// Calls the user's tools; programs run in `jail`, requests go where `http` allows.
#[derive(Debug, Clone)]
pub struct Tools {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    jail: Arc<Jail>,
    http: http::HttpTools,
}

impl Tools {
    pub fn new(jail: Arc<Jail>, http: HttpSettings) -> Self {
        Tools { inner: Arc::new(Inner { jail, http: http::HttpTools::new(http) }) }
    }
}

/// One level attempt's calls: its MCP toolsets' servers, running until it is dropped.
#[derive(Debug)]
struct Session {
    inner: Arc<Inner>,
    servers: BTreeMap<String, mcp::Running>,
    listed: BTreeMap<String, Listed>,
    problems: Vec<String>,
}

impl ToolHost for Tools {
    fn open<'a>(
        &'a self,
        tools: &'a [Arc<OwnTool>],
        workspace: &'a Path,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, Box<dyn ToolSession>> {
        Box::pin(async move {
            let mut session = Session {
                inner: Arc::clone(&self.inner),
                servers: BTreeMap::new(),
                listed: BTreeMap::new(),
                problems: Vec::new(),
            };
            for tool in tools {
                let ToolSource::Mcp(spec) = &tool.source else { continue };
                if session.servers.contains_key(&spec.toolset)
                    || session
                        .problems
                        .iter()
                        .any(|p| p.starts_with(&format!("toolset `{}`", spec.toolset)))
                {
                    continue;
                }
                match mcp::start(spec, workspace, &self.inner.jail, &self.inner.http, cancel).await
                {
                    Ok((running, listed)) => {
                        for wanted in tools.iter().filter(|t| matches!(&t.source, ToolSource::Mcp(s) if s.toolset == spec.toolset)) {
                            match listed.get(&wanted.name) {
                                Some(l) => {
                                    session.listed.insert(wanted.name.clone(), l.clone());
                                }
                                None => session.problems.push(format!(
                                    "`{}` is not offered: the server of toolset `{}` has no such tool",
                                    wanted.name, spec.toolset
                                )),
                            }
                        }
                        session.servers.insert(spec.toolset.clone(), running);
                    }
                    Err(why) => session.problems.push(format!(
                        "toolset `{}` is not offered: its MCP server `{}`: {why}",
                        spec.toolset,
                        spec.shown()
                    )),
                }
            }
            Box::new(session) as Box<dyn ToolSession>
        })
    }
}

impl Drop for Session {
    /// Stdio servers stop as they are dropped; HTTP sessions are ended in the background.
    fn drop(&mut self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        for (_, server) in std::mem::take(&mut self.servers) {
            if matches!(server, mcp::Running::Http(_)) {
                runtime.spawn(async move { server.end().await });
            }
        }
    }
}

impl ToolSession for Session {
    fn listed(&self) -> &BTreeMap<String, Listed> {
        &self.listed
    }

    fn problems(&self) -> &[String] {
        &self.problems
    }

    fn call<'a>(
        &'a self,
        call: OwnCall<'a>,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, ToolOutcome> {
        Box::pin(async move {
            match &call.tool.source {
                ToolSource::Command { argv, env } => {
                    self.inner.command(call, argv, env, cancel).await
                }
                ToolSource::Http(request) => self.inner.http.call(call, request, cancel).await,
                ToolSource::Mcp(spec) => match self.servers.get(&spec.toolset) {
                    Some(server) => server.call(call, cancel).await,
                    None => ToolOutcome::error(format!(
                        "not called: the server of toolset `{}` is not running",
                        spec.toolset
                    )),
                },
            }
        })
    }
}

impl Inner {
    async fn command(
        &self,
        call: OwnCall<'_>,
        argv: &[String],
        env: &[(String, String)],
        cancel: &CancelToken,
    ) -> ToolOutcome {
        let name = &call.tool.name;
        let Some(timeout) = call.deadline.checked_duration_since(Instant::now()) else {
            return ToolOutcome::error(format!(
                "not run: no time is left for `{name}` in this attempt"
            ));
        };
        let mut env = env.to_vec();
        if let Some(key) = call.key {
            env.push((KEY_VARIABLE.to_owned(), key.to_owned()));
        }
        let program = Program {
            argv: argv.to_vec(),
            cwd: call.workspace.to_path_buf(),
            workspace: call.workspace.to_path_buf(),
            also_writable: Vec::new(),
            env,
            timeout,
            network: false,
        };
        let input = call.arguments.to_string().into_bytes();
        match run_program_with_input(&program, Some(input), &self.jail, cancel).await {
            Err(why) => ToolOutcome::error(format!("`{name}` did not finish: {why}")),
            Ok(ran) => {
                let stdout = String::from_utf8_lossy(&ran.stdout).into_owned();
                match ran.code {
                    Some(0) => ToolOutcome::ok(if stdout.trim().is_empty() {
                        "(the tool printed nothing)".to_owned()
                    } else {
                        stdout
                    }),
                    code => {
                        let status = code.map_or_else(
                            || "was stopped by a signal".to_owned(),
                            |c| format!("exited with status {c}"),
                        );
                        let stderr = String::from_utf8_lossy(&ran.stderr);
                        let mut tail = stderr.len().saturating_sub(STDERR_TAIL_BYTES);
                        while !stderr.is_char_boundary(tail) {
                            tail += 1;
                        }
                        let mut message = format!("`{name}` {status}");
                        if !stderr[tail..].trim().is_empty() {
                            message.push_str(&format!("; its stderr ends:\n{}", &stderr[tail..]));
                        }
                        if !stdout.trim().is_empty() {
                            message.push_str(&format!("\nits stdout:\n{stdout}"));
                        }
                        ToolOutcome::error(message)
                    }
                }
            }
        }
    }
}
