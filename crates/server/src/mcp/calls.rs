//! What the tools and resources share to read a call and look around: a call's arguments
//! read against the tool's input schema (`args`, `NoArgs`), an object schema for results of
//! a documented shape, the caller's runs, and how often a waiting call looks at the store.

use std::sync::Arc;
use std::time::Duration;

use rmcp::ErrorData;
use rmcp::model::JsonObject;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use crate::app::App;
use crate::auth::Caller;
use crate::problem::Problem;

/// How long a waiting call looks at the store when nothing woke it.
pub(crate) const LOOK_EVERY: Duration = Duration::from_millis(500);

/// No arguments.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NoArgs {}

/// An object schema for results that are JSON objects of a documented shape.
pub(crate) fn object_schema(description: &str) -> Arc<JsonObject> {
    let mut schema = JsonObject::new();
    schema.insert("type".to_owned(), Value::String("object".to_owned()));
    schema.insert("description".to_owned(), Value::String(description.to_owned()));
    Arc::new(schema)
}

/// Reads a tool's arguments, or says which one is wrong.
pub(crate) fn args<T: serde::de::DeserializeOwned>(
    tool: &str,
    args: Value,
) -> Result<T, ErrorData> {
    serde_json::from_value(args).map_err(|e| {
        ErrorData::invalid_params(
            format!("{tool}: the arguments do not fit its input schema: {e}; tools/list shows it"),
            None,
        )
    })
}

/// The caller's runs, newest first, at most `limit`.
pub(crate) async fn caller_runs(
    app: &App,
    caller: &Caller,
    limit: usize,
) -> Result<Vec<baton_engine::store::RunRecord>, Problem> {
    let query = baton_engine::store::RunQuery {
        tenant: Some(caller.tenant.clone()),
        status: None,
        scenario_id: None,
        roots_only: false,
        after_run: None,
        limit,
    };
    Ok(app.store.runs_page(&query).await?)
}
