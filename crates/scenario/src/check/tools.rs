//! The user's own tools: the scenario's `toolsets:`, each tool's name, schema, source and
//! limits, and a `tool_loop` level's `tools:` list resolved against them.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use super::checker::Checker;
use crate::de::Located;
use crate::expr::Scope;
use crate::limits;
use crate::model::{
    Effect, HttpRequest, McpServer, McpTransport, OwnTool, ToolApproval, ToolSource,
};
use crate::raw::{RawLevel, RawScenario, RawTool, RawToolSource, RawToolset};
use crate::schema::JsonSchema;

/// The tools a tool loop offers whatever its toolsets: the file tools, `finish` and the
/// scratchpad's (the runners test that this is their list). A tool of the user's may not
/// take one of these names.
pub const BUILT_IN_TOOLS: [&str; 9] = [
    "read_file",
    "write_file",
    "edit_file",
    "list_dir",
    "delete_file",
    "finish",
    "scratchpad_get",
    "scratchpad_put",
    "scratchpad_list",
];

/// The scenario's toolsets, checked, by name; a toolset with an error is left out (its
/// error is reported once, not again at each level naming it).
pub(super) struct Toolsets {
    sets: BTreeMap<String, Vec<Arc<OwnTool>>>,
    /// Names declared, whether or not they checked: a level naming a broken set gets no
    /// second error.
    declared: HashSet<String>,
}

/// The methods an `http` tool may use.
const HTTP_METHODS: [&str; 5] = ["GET", "POST", "PUT", "PATCH", "DELETE"];

fn source_name(source: RawToolSource) -> &'static str {
    match source {
        RawToolSource::Command => "command",
        RawToolSource::Http => "http",
        RawToolSource::Mcp => "mcp",
    }
}

/// Why an `http` tool's URL cannot be one, if it cannot: its scheme, its host (which no
/// placeholder may stand in), a secret in it, an unclosed placeholder.
fn http_url_problem(url: &str) -> Option<String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Some(format!("`{url}` is not a URL"));
    };
    if !matches!(scheme, "http" | "https") {
        return Some(format!("`{url}`: only http and https URLs are called"));
    }
    if url.contains(crate::model::SECRET_REFERENCE) {
        return Some(
            "a secret may not stand in a URL (URLs reach logs); send it in a header".to_owned(),
        );
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.is_empty() {
        return Some(format!("`{url}` names no host"));
    }
    if authority.contains(['{', '}', '@']) {
        return Some(format!(
            "`{url}`: the host is written in the URL itself, without placeholders or credentials"
        ));
    }
    crate::model::url_placeholders(url).err()
}

/// `value` with every object's keys in sorted order.
fn sorted(value: serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map) => {
            let mut entries: Vec<(String, serde_json::Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            serde_json::Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        serde_json::Value::Array(items) => {
            serde_json::Value::Array(items.into_iter().map(sorted).collect())
        }
        other => other,
    }
}

/// Whether `name` is a tool name model APIs accept: a letter, then letters, digits, `_`, `-`.
fn is_tool_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && name.len() <= limits::TOOL_NAME_CHARS_MAX
}

impl Checker<'_> {
    /// Checks every toolset of the scenario.
    pub(super) fn toolsets(&mut self, raw: &RawScenario) -> Toolsets {
        let mut out = Toolsets { sets: BTreeMap::new(), declared: HashSet::new() };
        let Some(sets) = &raw.toolsets else { return out };
        if sets.value.len() > limits::TOOLSETS_MAX {
            self.error(
                "too-many",
                sets.pos,
                format!("a scenario may have at most {} toolsets", limits::TOOLSETS_MAX),
            );
            return out;
        }
        for (name, set) in &sets.value {
            out.declared.insert(name.clone());
            if !super::is_id(name) {
                self.error("bad-id", set.pos, format!("`{name}` is not a valid toolset name"))
                    .help = Some("toolset names are ids: lower-case letters, digits and `_`, starting with a letter".to_owned());
                continue;
            }
            if let Some(tools) = self.toolset(name, set) {
                out.sets.insert(name.clone(), tools);
            }
        }
        out
    }

    fn toolset(&mut self, name: &str, set: &Located<RawToolset>) -> Option<Vec<Arc<OwnTool>>> {
        let errors = self.diags.error_count();
        let raw = &set.value;
        let source = raw.source.value;
        for (field, present) in [
            ("server", raw.server.as_ref().map(|s| s.pos)),
            ("url", raw.url.as_ref().map(|u| u.pos)),
            ("env", raw.env.as_ref().map(|e| e.pos)),
            ("allow", raw.allow.first().map(|a| a.pos)),
            ("read", raw.read.first().map(|r| r.pos)),
        ] {
            if let Some(pos) = present
                && source != RawToolSource::Mcp
            {
                self.error(
                    "field-not-for-source",
                    pos,
                    format!("`{field}` does not apply to a `{}` toolset", source_name(source)),
                )
                .help = Some(format!("`{field}` applies to `mcp` toolsets"));
            }
        }
        let declared: &[Located<RawTool>] = raw.tools.as_ref().map_or(&[], |t| &t.value);
        let mut seen = HashSet::new();
        for tool in declared {
            if !seen.insert(tool.value.name.value.clone()) {
                self.error(
                    "duplicate-id",
                    tool.value.name.pos,
                    format!("toolset `{name}` declares tool `{}` twice", tool.value.name.value),
                );
            }
        }
        let mut tools = Vec::new();
        if source == RawToolSource::Mcp {
            tools = self.mcp_toolset(name, set, declared)?;
        } else {
            if declared.is_empty() {
                let pos = raw.tools.as_ref().map_or(set.pos, |t| t.pos);
                self.error("no-tools", pos, format!("toolset `{name}` has no tools"));
            }
            let mut named = HashSet::new();
            for tool in declared {
                if named.insert(tool.value.name.value.clone())
                    && let Some(checked) = self.tool(name, source, tool, None)
                {
                    tools.push(Arc::new(checked));
                }
            }
        }
        (self.diags.error_count() == errors).then_some(tools)
    }

    /// An `mcp` toolset: its server, and one tool per name `allow` lets through (with the
    /// settings `tools:` gives it); its schema and description come from the server.
    fn mcp_toolset(
        &mut self,
        name: &str,
        set: &Located<RawToolset>,
        declared: &[Located<RawTool>],
    ) -> Option<Vec<Arc<OwnTool>>> {
        let raw = &set.value;
        let transport = match (&raw.server, &raw.url) {
            (Some(argv), None) => {
                if argv.value.is_empty()
                    || argv.value[0].trim().is_empty()
                    || argv.value.len() > limits::TOOL_ARGV_MAX
                {
                    self.error(
                        "bad-value",
                        argv.pos,
                        format!(
                            "`server` is a command and at most {} arguments",
                            limits::TOOL_ARGV_MAX - 1
                        ),
                    );
                    return None;
                }
                let env = self.program_env(raw.env.as_ref())?;
                McpTransport::Stdio { argv: argv.value.clone(), env }
            }
            (None, Some(url)) => {
                let problem = http_url_problem(&url.value).or_else(|| {
                    url.value
                        .contains('{')
                        .then(|| format!("`{}`: a server's URL has no placeholders", url.value))
                });
                if let Some(problem) = problem {
                    self.error("bad-url", url.pos, problem);
                    return None;
                }
                if let Some(e) = &raw.env {
                    self.error(
                        "field-not-for-source",
                        e.pos,
                        "`env` applies to a server run as a command (`server:`)",
                    );
                }
                McpTransport::Http { url: url.value.clone() }
            }
            (Some(argv), Some(_)) => {
                self.error(
                    "both-fields",
                    argv.pos,
                    format!("toolset `{name}` names both a `server` and a `url`"),
                )
                .help = Some(
                    "a server is a command over stdio, or a URL over Streamable HTTP".to_owned(),
                );
                return None;
            }
            (None, None) => {
                self.error("missing-field", set.pos, format!("toolset `{name}` is `mcp` and names no `server` or `url`"))
                    .help = Some("give the server's command, e.g. `server: [mcp-server-filesystem, kb]`, or its URL, `url: \"http://127.0.0.1:3001/mcp\"`".to_owned());
                return None;
            }
        };
        let server = Arc::new(McpServer { toolset: name.to_owned(), transport });
        if raw.allow.is_empty() {
            self.warning(
                "mcp-allows-nothing",
                set.pos,
                format!("toolset `{name}` allows none of its server's tools"),
            )
            .help = Some("list the tools the model may call under `allow:`".to_owned());
        }
        for r in &raw.read {
            if !raw.allow.iter().any(|a| a.value == r.value) {
                self.error(
                    "unknown-tool",
                    r.pos,
                    format!("`read` names `{}`, which `allow` does not let through", r.value),
                );
            }
        }
        for tool in declared {
            if !raw.allow.iter().any(|a| a.value == tool.value.name.value) {
                self.error(
                    "unknown-tool",
                    tool.value.name.pos,
                    format!("toolset `{name}` gives settings to `{}`, which `allow` does not let through", tool.value.name.value),
                );
            }
            for (field, present) in [
                ("description", tool.value.description.as_ref().map(|d| d.pos)),
                ("parameters", tool.value.parameters.as_ref().map(|p| p.pos)),
                ("effect", tool.value.effect.as_ref().map(|e| e.pos)),
            ] {
                if let Some(pos) = present {
                    self.error("field-not-for-source", pos, format!("`{field}` of an `mcp` tool comes from its server and the toolset's `read`"));
                }
            }
        }
        let mut tools = Vec::new();
        let mut seen = HashSet::new();
        for allowed in &raw.allow {
            if !seen.insert(allowed.value.clone()) {
                self.error(
                    "duplicate-id",
                    allowed.pos,
                    format!("`allow` lists `{}` twice", allowed.value),
                );
                continue;
            }
            let effect = if raw.read.iter().any(|r| r.value == allowed.value) {
                Effect::Read
            } else {
                Effect::Write
            };
            let settings = declared.iter().find(|t| t.value.name.value == allowed.value);
            let checked = match settings {
                Some(t) => self.tool(name, RawToolSource::Mcp, t, Some((effect, &server))),
                None => {
                    let bare = RawTool::named(allowed.clone());
                    let bare = Located { value: bare, pos: allowed.pos };
                    self.tool(name, RawToolSource::Mcp, &bare, Some((effect, &server)))
                }
            };
            if let Some(checked) = checked {
                tools.push(Arc::new(checked));
            }
        }
        Some(tools)
    }

    fn tool(
        &mut self,
        toolset: &str,
        source: RawToolSource,
        raw: &Located<RawTool>,
        mcp: Option<(Effect, &Arc<McpServer>)>,
    ) -> Option<OwnTool> {
        let tool = &raw.value;
        let name = &tool.name;
        if !is_tool_name(&name.value) {
            self.error(
                "bad-tool-name",
                name.pos,
                format!("`{}` is not a valid tool name", name.value),
            )
            .help = Some(format!(
                "a tool name starts with a letter and holds letters, digits, `_` and `-` (at most {} characters)",
                limits::TOOL_NAME_CHARS_MAX
            ));
        } else if BUILT_IN_TOOLS.contains(&name.value.as_str()) {
            self.error(
                "reserved-tool-name",
                name.pos,
                format!("`{}` is a built-in tool of every tool loop", name.value),
            )
            .help = Some("give the tool another name".to_owned());
        }
        let description =
            tool.description.as_ref().map_or_else(String::new, |d| d.value.trim().to_owned());
        if let Some(d) = &tool.description
            && d.value.len() > limits::TOOL_DESCRIPTION_BYTES_MAX
        {
            self.error(
                "too-long",
                d.pos,
                format!(
                    "a tool's description may hold at most {} bytes",
                    limits::TOOL_DESCRIPTION_BYTES_MAX
                ),
            );
        }
        let parameters = self.tool_parameters(tool);
        let timeout_s = self
            .positive(tool.timeout_s.as_ref(), "timeout_s", limits::TOOL_TIMEOUT_S_MAX)
            .unwrap_or(limits::TOOL_TIMEOUT_S_DEFAULT);
        let max_calls = self.bounded(tool.max_calls.as_ref(), "max_calls", limits::TOOL_CALLS_MAX);
        let cost_usd = match &tool.cost_usd {
            Some(c) if !(0.0..=limits::TOOL_COST_USD_MAX).contains(&c.value) => {
                self.error(
                    "out-of-range",
                    c.pos,
                    format!(
                        "`cost_usd` must be between 0 and {}, found {}",
                        limits::TOOL_COST_USD_MAX,
                        c.value
                    ),
                );
                0.0
            }
            Some(c) => c.value,
            None => 0.0,
        };
        // A tool that acts is a write until its author says it only reads.
        let effect = match mcp {
            Some((effect, _)) => effect,
            None => tool.effect.as_ref().map_or(Effect::Write, |e| e.value),
        };
        let once_per_run = tool.once_per_run.as_ref().is_some_and(|o| o.value);
        if once_per_run && effect == Effect::Read {
            let pos = tool.once_per_run.as_ref().map_or(raw.pos, |o| o.pos);
            self.error(
                "once-per-run-read",
                pos,
                format!(
                    "tool `{}` is `effect: read`; `once_per_run` applies to write tools",
                    name.value
                ),
            );
        }
        for (field, present, wanted) in [
            ("command", tool.command.as_ref().map(|c| c.pos), RawToolSource::Command),
            ("env", tool.env.as_ref().map(|e| e.pos), RawToolSource::Command),
            ("request", tool.request.as_ref().map(|r| r.pos), RawToolSource::Http),
        ] {
            if let Some(pos) = present
                && wanted != source
            {
                self.error(
                    "field-not-for-source",
                    pos,
                    format!("`{field}` does not apply to `{}` tools", source_name(source)),
                )
                .help = Some(format!("`{field}` applies to `{}` tools", source_name(wanted)));
            }
        }
        let source = match source {
            RawToolSource::Command => self.command_tool(raw)?,
            RawToolSource::Http => self.http_tool(raw, effect, parameters.as_ref())?,
            RawToolSource::Mcp => ToolSource::Mcp(Arc::clone(mcp?.1)),
        };
        // An MCP tool's arguments are its server's to say: its gate is checked when called.
        let declared_parameters = if mcp.is_some() { None } else { parameters.as_ref() };
        let approval = self.tool_approval(tool, declared_parameters, mcp.is_none());
        let approver_role = tool.approver_role.as_ref().map_or_else(
            || crate::model::APPROVER_ROLE_DEFAULT.to_owned(),
            |r| r.value.trim().to_owned(),
        );
        if let Some(r) = &tool.approver_role
            && approver_role.is_empty()
        {
            self.error("empty-value", r.pos, "`approver_role` must not be empty");
        }
        let approval_timeout_s = self.positive(
            tool.approval_timeout_s.as_ref(),
            "approval_timeout_s",
            limits::TOOL_APPROVAL_TIMEOUT_S_MAX,
        );
        if let (Some(t), Some(ToolApproval::Never)) = (&tool.approval_timeout_s, &approval) {
            self.warning(
                "approval-timeout-unused",
                t.pos,
                format!(
                    "`{}` never waits for an approval, so `approval_timeout_s` is not used",
                    name.value
                ),
            );
        }
        Some(OwnTool {
            name: name.value.clone(),
            toolset: toolset.to_owned(),
            description,
            parameters: parameters?,
            effect,
            timeout_s,
            max_calls,
            cost_usd,
            once_per_run,
            approval: approval?,
            approver_role,
            approval_timeout_s,
            source,
        })
    }

    /// A tool's `approval`: `never`, `always`, or a gate over `args.<…>` whose every
    /// argument is one the schema declares.
    fn tool_approval(
        &mut self,
        tool: &RawTool,
        parameters: Option<&JsonSchema>,
        check_arguments: bool,
    ) -> Option<ToolApproval> {
        let Some(approval) = &tool.approval else { return Some(ToolApproval::Never) };
        match approval.value.trim() {
            "never" => return Some(ToolApproval::Never),
            "always" => return Some(ToolApproval::Always),
            _ => {}
        }
        let scope = Scope { args: true, ..Scope::default() };
        let gate = self.gate(approval, &scope)?;
        let properties = parameters
            .and_then(|p| p.value().get("properties"))
            .and_then(serde_json::Value::as_object);
        let mut ok = true;
        for path in gate.paths() {
            let root = path.segments.first().map_or("", String::as_str);
            if root != "args" {
                self.error(
                    "gate-check",
                    approval.pos,
                    format!(
                        "`approval` reads only the call's arguments (`args.<…>`), not `{root}`"
                    ),
                )
                .help = Some(
                    "`approval` is `always`, `never`, or a gate such as `args.amount > 100`"
                        .to_owned(),
                );
                ok = false;
                continue;
            }
            let Some(argument) = path.segments.get(1) else {
                self.error(
                    "gate-check",
                    approval.pos,
                    "`args` alone is not a value; name an argument, e.g. `args.amount`",
                );
                ok = false;
                continue;
            };
            if check_arguments && !properties.is_some_and(|p| p.contains_key(argument)) {
                self.error(
                    "unknown-argument",
                    approval.pos,
                    format!("`approval` reads `args.{argument}`, which the tool's `parameters` do not declare"),
                )
                .help = Some(format!("declare `{argument}` under `parameters.properties`, or read an argument it declares"));
                ok = false;
            }
        }
        if gate.paths().is_empty() {
            self.error(
                "gate-check",
                approval.pos,
                "`approval` is `always`, `never`, or a gate over the call's arguments (`args.<…>`)",
            );
            ok = false;
        }
        ok.then_some(ToolApproval::When(gate))
    }

    /// A tool's argument schema: an object schema, bounded in size; the default takes any
    /// object.
    fn tool_parameters(&mut self, tool: &RawTool) -> Option<JsonSchema> {
        let Some(raw) = &tool.parameters else {
            let any = serde_json::json!({"type": "object"});
            return Some(JsonSchema::compile(any).expect("an object schema compiles"));
        };
        // Keys in one order whichever way the scenario was loaded (its file, or the
        // canonical texts a run keeps): the schema goes to the model, and what the model is
        // sent is hashed into the log.
        let value = sorted(self.schema_value(raw)?);
        if value.get("type").and_then(serde_json::Value::as_str) != Some("object") {
            self.error("bad-schema", raw.pos, "a tool's `parameters` must be an object schema")
                .help = Some(
                "start it with `type: object` and list the arguments under `properties`".to_owned(),
            );
            return None;
        }
        let bytes = value.to_string().len();
        if bytes > limits::TOOL_SCHEMA_BYTES_MAX {
            self.error(
                "too-long",
                raw.pos,
                format!(
                    "this schema is {bytes} bytes of JSON; a tool's `parameters` may hold at most {}",
                    limits::TOOL_SCHEMA_BYTES_MAX
                ),
            );
            return None;
        }
        self.compile_schema(value, raw.pos)
    }

    /// The program of a `command` tool.
    fn command_tool(&mut self, raw: &Located<RawTool>) -> Option<ToolSource> {
        let tool = &raw.value;
        let Some(argv) = &tool.command else {
            self.error(
                "missing-field",
                tool.name.pos,
                format!("tool `{}` of a `command` toolset needs `command`", tool.name.value),
            )
            .help = Some(
                "give the program and its arguments, e.g. `command: [python3, tools/notes.py]`"
                    .to_owned(),
            );
            return None;
        };
        if argv.value.is_empty() || argv.value[0].trim().is_empty() {
            self.error("empty-value", argv.pos, "`command` names no program");
            return None;
        }
        if argv.value.len() > limits::TOOL_ARGV_MAX {
            self.error(
                "too-many",
                argv.pos,
                format!("`command` may have at most {} arguments", limits::TOOL_ARGV_MAX),
            );
            return None;
        }
        let env = self.program_env(tool.env.as_ref())?;
        Some(ToolSource::Command { argv: argv.value.clone(), env })
    }

    /// The variables a program is given (a `command` tool's, an MCP server's): bounded in
    /// number, names of letters, digits and `_`, none of Baton's own `BATON_` ones.
    fn program_env(
        &mut self,
        env: Option<&Located<BTreeMap<String, String>>>,
    ) -> Option<Vec<(String, String)>> {
        let Some(e) = env else { return Some(Vec::new()) };
        if e.value.len() > limits::TOOL_ARGV_MAX {
            self.error(
                "too-many",
                e.pos,
                format!("`env` may have at most {} variables", limits::TOOL_ARGV_MAX),
            );
            return None;
        }
        if let Some(bad) = e.value.keys().find(|k| {
            k.is_empty()
                || k.starts_with("BATON_")
                || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        }) {
            self.error(
                "bad-env",
                e.pos,
                format!("`{bad}` cannot be a variable of a tool's program"),
            )
            .help = Some(
                "names hold letters, digits and `_`; `BATON_` names are Baton's own".to_owned(),
            );
            return None;
        }
        Some(e.value.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
    }

    /// The request of an `http` tool: its method, a URL whose placeholders name arguments
    /// of the schema and never stand in its scheme or host, headers whose secrets are
    /// references.
    fn http_tool(
        &mut self,
        raw: &Located<RawTool>,
        effect: Effect,
        parameters: Option<&JsonSchema>,
    ) -> Option<ToolSource> {
        let tool = &raw.value;
        let Some(request) = &tool.request else {
            self.error(
                "missing-field",
                tool.name.pos,
                format!("tool `{}` of an `http` toolset needs `request`", tool.name.value),
            )
            .help = Some(
                "give at least its URL: `request: {url: \"https://api.example.com/items/{id}\"}`"
                    .to_owned(),
            );
            return None;
        };
        let request = &request.value;
        let errors = self.diags.error_count();
        let method = match &request.method {
            Some(m) => {
                let upper = m.value.trim().to_ascii_uppercase();
                if !HTTP_METHODS.contains(&upper.as_str()) {
                    self.error(
                        "bad-method",
                        m.pos,
                        format!("`{}` is not a method an http tool may use", m.value),
                    )
                    .help = Some(format!("use one of {}", HTTP_METHODS.join(", ")));
                }
                upper
            }
            None if effect == Effect::Read => "GET".to_owned(),
            None => "POST".to_owned(),
        };
        let url = &request.url;
        match http_url_problem(&url.value) {
            Some(problem) => {
                self.error("bad-url", url.pos, problem).help = Some(
                    "write an http or https URL; `{NAME}` may stand for an argument in its path or query".to_owned(),
                );
            }
            None => {
                let properties = parameters
                    .and_then(|p| p.value().get("properties"))
                    .and_then(serde_json::Value::as_object);
                let placeholders = crate::model::url_placeholders(&url.value).unwrap_or_default();
                for (_, name) in placeholders {
                    if !properties.is_some_and(|p| p.contains_key(name)) {
                        self.error(
                            "unknown-argument",
                            url.pos,
                            format!("the URL's `{{{name}}}` names no argument of the tool's `parameters`"),
                        )
                        .help = Some(format!("declare `{name}` under `parameters.properties` (and list it under `required`)"));
                    }
                }
            }
        }
        let mut headers = Vec::new();
        if let Some(h) = &request.headers {
            for (name, value) in &h.value {
                let token = !name.is_empty()
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
                if !token || value.contains(['\r', '\n']) {
                    self.error("bad-header", h.pos, format!("header `{name}` is not a header name and value an HTTP request can carry"));
                } else if name.eq_ignore_ascii_case("idempotency-key")
                    || name.eq_ignore_ascii_case("host")
                {
                    self.error("bad-header", h.pos, format!("header `{name}` is Baton's to set"));
                } else if let Err(problem) = crate::model::secret_references(value) {
                    self.error("bad-secret", h.pos, format!("header `{name}`: {problem}"));
                } else {
                    headers.push((name.clone(), value.clone()));
                }
            }
        }
        let body = request
            .body
            .as_ref()
            .map_or_else(|| matches!(method.as_str(), "POST" | "PUT" | "PATCH"), |b| b.value);
        (self.diags.error_count() == errors).then(|| {
            ToolSource::Http(HttpRequest { method, url: url.value.clone(), headers, body })
        })
    }

    /// The tools a `tool_loop` level lists, from the scenario's toolsets, checked for
    /// names that clash across sets.
    pub(super) fn level_tools(&mut self, raw: &RawLevel, toolsets: &Toolsets) -> Vec<Arc<OwnTool>> {
        let mut tools: Vec<Arc<OwnTool>> = Vec::new();
        let mut named = HashSet::new();
        for name in &raw.tools {
            if !named.insert(name.value.clone()) {
                self.error(
                    "duplicate-id",
                    name.pos,
                    format!("toolset `{}` is listed twice", name.value),
                );
                continue;
            }
            let Some(set) = toolsets.sets.get(&name.value) else {
                if !toolsets.declared.contains(&name.value) {
                    let known: Vec<&str> = toolsets.declared.iter().map(String::as_str).collect();
                    self.error(
                        "unknown-toolset",
                        name.pos,
                        format!("there is no toolset `{}`", name.value),
                    )
                    .help = Some(if known.is_empty() {
                        "declare it under `toolsets:` at the top of the scenario".to_owned()
                    } else {
                        let mut known = known;
                        known.sort_unstable();
                        format!("the scenario's toolsets are: {}", known.join(", "))
                    });
                }
                continue;
            };
            for tool in set {
                if let Some(other) = tools.iter().find(|t| t.name == tool.name) {
                    self.error(
                        "duplicate-tool",
                        name.pos,
                        format!(
                            "tool `{}` of toolset `{}` has the name of a tool of toolset `{}`",
                            tool.name, tool.toolset, other.toolset
                        ),
                    )
                    .help =
                        Some("a level's tools need distinct names; rename one of them".to_owned());
                    continue;
                }
                tools.push(Arc::clone(tool));
            }
        }
        if tools.len() > limits::OWN_TOOLS_PER_LEVEL_MAX {
            let pos = raw.tools.first().map_or(raw.id.pos, |t| t.pos);
            self.error(
                "too-many",
                pos,
                format!(
                    "level `{}` would give its model {} tools of the user's; at most {}",
                    raw.id.value,
                    tools.len(),
                    limits::OWN_TOOLS_PER_LEVEL_MAX
                ),
            );
        }
        tools
    }
}

/// What an override gives a scenario's tools that its base did not have, one line each:
/// a tool, a source, a program, a host, a secret, a read where the base writes, an
/// approval the base asks for and the override drops. An override may remove tools (and
/// so narrow an MCP toolset's allow-list) and change their limits, nothing more.
pub fn widened(base: &crate::Scenario, merged: &crate::Scenario) -> Vec<String> {
    let base_tools: Vec<&Arc<OwnTool>> = base
        .levels
        .iter()
        .filter_map(|l| match &l.kind {
            crate::model::LevelKind::ToolLoop { tools, .. } => Some(tools),
            _ => None,
        })
        .flatten()
        .collect();
    let mut found = Vec::new();
    for level in &merged.levels {
        let crate::model::LevelKind::ToolLoop { tools, .. } = &level.kind else { continue };
        let base_level = base.level(&level.id).and_then(|l| match &l.kind {
            crate::model::LevelKind::ToolLoop { tools, .. } => Some(tools),
            _ => None,
        });
        for tool in tools {
            let what =
                format!("level `{}`: tool `{}` of toolset `{}`", level.id, tool.name, tool.toolset);
            let Some(was) =
                base_tools.iter().find(|t| t.toolset == tool.toolset && t.name == tool.name)
            else {
                found.push(format!("{what} is not one of the scenario's tools"));
                continue;
            };
            if !base_level
                .is_some_and(|b| b.iter().any(|t| t.toolset == tool.toolset && t.name == tool.name))
            {
                found.push(format!("{what} is not one the scenario gives this level"));
            }
            match (&was.source, &tool.source) {
                (
                    ToolSource::Command { argv: a, env: e },
                    ToolSource::Command { argv: b, env: f },
                ) if a == b && e == f => {}
                (ToolSource::Mcp(a), ToolSource::Mcp(b)) if a.transport == b.transport => {}
                (ToolSource::Http(a), ToolSource::Http(b)) => {
                    if a.url != b.url || a.method != b.method {
                        found.push(format!(
                            "{what} calls `{} {}` where the scenario calls `{} {}`",
                            b.method, b.url, a.method, a.url
                        ));
                    }
                    let secrets = |r: &HttpRequest| -> Vec<String> {
                        r.headers
                            .iter()
                            .flat_map(|(_, v)| {
                                crate::model::secret_references(v).unwrap_or_default()
                            })
                            .map(|(_, name)| name.to_owned())
                            .collect()
                    };
                    let allowed = secrets(a);
                    for secret in secrets(b) {
                        if !allowed.contains(&secret) {
                            found.push(format!(
                                "{what} sends secret `{secret}`, which the scenario's does not"
                            ));
                        }
                    }
                }
                _ => found.push(format!("{what} changes its source (its program, server or kind)")),
            }
            if was.effect == Effect::Write && tool.effect == Effect::Read {
                found.push(format!("{what} is a write in the scenario and may not become a read"));
            }
            let gate_text = |a: &ToolApproval| match a {
                ToolApproval::Never => "never".to_owned(),
                ToolApproval::Always => "always".to_owned(),
                ToolApproval::When(g) => g.to_string(),
            };
            if !matches!(was.approval, ToolApproval::Never)
                && gate_text(&was.approval) != gate_text(&tool.approval)
            {
                found.push(format!(
                    "{what} waits for approval `{}` in the scenario; an override cannot change that",
                    gate_text(&was.approval)
                ));
            }
        }
    }
    found
}
