//! Baton as an MCP server (the official Rust SDK, `rmcp`): the tools, resources and prompts a
//! coding agent uses to start scenarios, follow runs, decide approvals and drive waves.
//!
//! One handler, [`BatonMcp`], serves both transports: `baton mcp` on stdio (the caller is the
//! local user, with the tenant `--tenant` names) and `/mcp` of `baton serve` over Streamable
//! HTTP, where each request's caller is its bearer token's, found by the server's auth layer
//! before rmcp sees the request — so tenant scoping, roles and the Host/Origin checks are the
//! HTTP API's own. Every tool goes through the same operations as the HTTP API's handlers
//! (`crate::runs`, `crate::scenarios`, `crate::waves`), so a decision, an answer, a cancel or
//! a wave record is made exactly once whichever door it came through.
//!
//! Modules: `reply` (a call's answer, failure and progress; how long hosts keep what never
//! changes), `calls` (reading a call's arguments, schemas, the caller's runs), `tools` (the
//! tool list, arguments and the scenario and run tools), `waves` (the wave tools),
//! `resources` (run timelines, the guide, subscriptions, prompts).

mod calls;
mod reply;
mod resources;
pub(crate) mod sessions;
mod tools;
mod waves;

use std::sync::Arc;

use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, GetPromptRequestParams, GetPromptResponse,
    Implementation, InitializeResult, ListPromptsResult, ListResourceTemplatesResult,
    ListResourcesResult, ListToolsResult, PaginatedRequestParams, ReadResourceRequestParams,
    ReadResourceResponse, ServerCapabilities, SubscribeRequestParams, SubscriptionFilter,
    UnsubscribeRequestParams,
};
use rmcp::service::{RequestContext, RoleServer, SubscriptionContext};
use rmcp::{ErrorData, ServerHandler};

use crate::app::App;
use crate::auth::Caller;
use reply::STATIC_TTL_MS;

/// What the server tells a host when it connects.
const INSTRUCTIONS: &str = "Baton runs multi-step LLM workflows (scenarios) durably. Use scenarios_list and scenario_describe to find one, run_start to start a job (wait_s to wait for it), run_get / run_events to follow it, run_approve / run_reject / run_answer when it waits for a person, run_cancel to stop it. Waves (wave_plan, wave_dispatch, wave_record, wave_decide, wave_complete, wave_run, wave_get, wave_list, wave_summary, wave_cancel) orchestrate many worker assignments; wave_id \"current\" names the newest wave under way. Read baton://guide for when to use which.";

/// Where a request's caller comes from.
#[derive(Clone, Debug)]
pub(crate) enum Who {
    /// `baton mcp`: the local user, always the same caller.
    Local(Caller),
    /// `/mcp`: the caller the HTTP auth layer found for the request.
    Http,
}

/// The MCP server: one per stdio connection or HTTP session.
#[derive(Clone)]
pub(crate) struct BatonMcp {
    app: Arc<App>,
    who: Who,
    /// The timelines this session subscribed to (legacy `resources/subscribe`), each watched
    /// by a task that ends on unsubscribe, when the run has ended, or with the session.
    subscriptions: Arc<resources::Subscriptions>,
}

impl std::fmt::Debug for BatonMcp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatonMcp").field("who", &self.who).finish_non_exhaustive()
    }
}

impl BatonMcp {
    pub(crate) fn new(app: Arc<App>, who: Who) -> Self {
        BatonMcp { app, who, subscriptions: Arc::default() }
    }

    /// The caller of a request.
    fn caller(&self, context: &RequestContext<RoleServer>) -> Result<Caller, ErrorData> {
        match &self.who {
            Who::Local(caller) => Ok(caller.clone()),
            Who::Http => context
                .extensions
                .get::<axum::http::request::Parts>()
                .and_then(|parts| parts.extensions.get::<Caller>())
                .cloned()
                .ok_or_else(|| {
                    ErrorData::invalid_request(
                        "the request carries no authenticated caller; send the token as `Authorization: Bearer baton_…`",
                        None,
                    )
                }),
        }
    }
}

impl ServerHandler for BatonMcp {
    fn get_info(&self) -> InitializeResult {
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_resources()
            .enable_resources_subscribe()
            .enable_prompts()
            .build();
        InitializeResult::new(capabilities)
            .with_server_info(
                Implementation::new("baton", env!("CARGO_PKG_VERSION"))
                    .with_title("Baton — durable LLM workflows"),
            )
            .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools::list().to_vec())
            .with_ttl_ms(STATIC_TTL_MS)
            .with_cache_scope(CacheScope::Public))
    }

    fn get_tool(&self, name: &str) -> Option<rmcp::model::Tool> {
        tools::list().iter().find(|t| t.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let caller = self.caller(&context)?;
        let args = serde_json::Value::Object(request.arguments.unwrap_or_default());
        let result = tools::call(&self.app, &caller, &request.name, args, &context).await?;
        Ok(result.into())
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let caller = self.caller(&context)?;
        resources::list(&self.app, &caller).await
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Ok(resources::templates())
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let caller = self.caller(&context)?;
        Ok(resources::read(&self.app, &caller, &request.uri).await?.into())
    }

    #[allow(deprecated)]
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let caller = self.caller(&context)?;
        self.subscriptions.subscribe(&self.app, &caller, &request.uri, context.peer.clone()).await
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.subscriptions.unsubscribe(&request.uri);
        Ok(())
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        Some(resources::acceptable(requested))
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        let caller = self.caller(context.request_context())?;
        resources::listen(&self.app, &caller, context).await
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        Ok(ListPromptsResult::with_all_items(resources::prompts())
            .with_ttl_ms(STATIC_TTL_MS)
            .with_cache_scope(CacheScope::Public))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        let caller = self.caller(&context)?;
        Ok(resources::prompt(&self.app, &caller, &request.name).await?.into())
    }
}

/// The Streamable HTTP service of `/mcp`: a [`BatonMcp`] per session, over the server's
/// state; it ends its streams when the server stops.
pub(crate) fn http_service(
    app: &Arc<App>,
) -> (
    rmcp::transport::streamable_http_server::StreamableHttpService<
        BatonMcp,
        rmcp::transport::streamable_http_server::session::local::LocalSessionManager,
    >,
    Arc<sessions::Sessions>,
) {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService,
    };
    let stop = tokio_util::sync::CancellationToken::new();
    {
        let (app_stop, stop) = (app.stop.clone(), stop.clone());
        tokio::spawn(async move {
            app_stop.cancelled().await;
            stop.cancel();
        });
    }
    let mut config = StreamableHttpServerConfig::default()
        // Host and Origin are checked by the server's own layer, with its --host names.
        .disable_allowed_hosts()
        .with_cancellation_token(stop);
    config.max_request_body_bytes = app.settings.body_bytes_max;
    config.sse_keep_alive = Some(app.settings.keep_alive);
    let shared = Arc::clone(app);
    let mut manager = LocalSessionManager::default();
    // The gate closes a session idle past the limit; rmcp's own timer is a backstop.
    manager.session_config.keep_alive =
        Some(app.settings.mcp_session_idle + std::time::Duration::from_secs(60));
    let manager = Arc::new(manager);
    let gate = sessions::Sessions::new(Arc::clone(app), Arc::clone(&manager));
    let service = StreamableHttpService::new(
        move || Ok(BatonMcp::new(Arc::clone(&shared), Who::Http)),
        manager,
        config,
    );
    (service, gate)
}

/// Serves MCP on stdin and stdout for `caller` until the host closes stdin or `stop` is
/// cancelled; then stops every drive (their runs are recorded interrupted, to be taken up by
/// the next `baton mcp`, `baton serve` or `baton resume`).
pub(crate) async fn serve_stdio(
    app: Arc<App>,
    caller: Caller,
    stop: baton_engine::cancel::CancelToken,
) -> Result<(), String> {
    use rmcp::ServiceExt;
    let handler = BatonMcp::new(Arc::clone(&app), Who::Local(caller));
    let stdin = LineCapped { inner: tokio::io::stdin(), cap: app.settings.body_bytes_max, line: 0 };
    let running = handler
        .serve((stdin, tokio::io::stdout()))
        .await
        .map_err(|e| format!("the MCP host did not start a session: {e}"))?;
    let ct = running.cancellation_token();
    let ended = tokio::select! {
        ended = running.waiting() => ended.map(|_| ()).map_err(|e| format!("the MCP session failed: {e}")),
        () = stop.cancelled() => {
            ct.cancel();
            Ok(())
        }
    };
    app.stop.cancel();
    ended
}

/// Standard input with a bound on each message (a line of newline-delimited JSON): a line
/// longer than `cap` bytes is an error that ends the session, said on stderr, instead of a
/// buffer that grows without end.
struct LineCapped<R> {
    inner: R,
    cap: usize,
    /// Bytes of the current line read so far.
    line: usize,
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for LineCapped<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if let std::task::Poll::Ready(Ok(())) = &polled {
            let fresh = &buf.filled()[before..];
            let mut line = self.line;
            for b in fresh {
                line = if *b == b'\n' { 0 } else { line + 1 };
                if line > self.cap {
                    #[allow(clippy::print_stderr)]
                    {
                        eprintln!(
                            "baton mcp: the host sent a message longer than {} bytes; the session ends (raise the bound with `baton mcp --message-max-bytes`)",
                            self.cap
                        );
                    }
                    return std::task::Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "an MCP message is longer than the bound",
                    )));
                }
            }
            self.line = line;
        }
        polled
    }
}
