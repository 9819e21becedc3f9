//! What the tools and resources share to read a call and look around: a call's arguments
//! read against the tool's input schema (`args`, `NoArgs`), the schemas of tools' inputs and
//! results (`schema_of`, with no boolean subschemas; `object_schema` for a documented shape), the caller's runs, and how often a waiting call looks at the store.

use std::sync::Arc;
use std::time::Duration;

use rmcp::ErrorData;
use rmcp::handler::server::common::schema_for_type;
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

/// The JSON Schema of `T` for a tool's input or output, with every boolean subschema
/// spelled as an object (`true` as `{}`, `false` as `{"not": {}}`): JSON Schema allows
/// both, but hosts built on some SDKs validate `tools/list` strictly and refuse the whole
/// list over one `true`.
pub(crate) fn schema_of<T: JsonSchema + 'static>() -> Arc<JsonObject> {
    let mut schema = Value::Object((*schema_for_type::<T>()).clone());
    spell_out_booleans(&mut schema);
    match schema {
        Value::Object(object) => Arc::new(object),
        _ => Arc::new(JsonObject::new()),
    }
}

/// Replaces the boolean subschemas under `schema` (a schema object) by objects.
fn spell_out_booleans(schema: &mut Value) {
    fn as_object(sub: &mut Value) {
        match sub {
            Value::Bool(true) => *sub = Value::Object(JsonObject::new()),
            Value::Bool(false) => {
                let mut not = JsonObject::new();
                not.insert("not".to_owned(), Value::Object(JsonObject::new()));
                *sub = Value::Object(not);
            }
            other => spell_out_booleans(other),
        }
    }
    let Value::Object(object) = schema else { return };
    for (key, value) in object.iter_mut() {
        match (key.as_str(), value) {
            (
                "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas",
                Value::Object(named),
            ) => named.values_mut().for_each(as_object),
            ("anyOf" | "oneOf" | "allOf" | "prefixItems", Value::Array(list)) => {
                list.iter_mut().for_each(as_object);
            }
            (
                "items"
                | "additionalProperties"
                | "not"
                | "if"
                | "then"
                | "else"
                | "contains"
                | "propertyNames"
                | "unevaluatedProperties"
                | "unevaluatedItems"
                | "additionalItems",
                sub,
            ) => as_object(sub),
            _ => {}
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boolean_subschemas_are_spelled_as_objects_and_other_booleans_kept() {
        let mut schema = serde_json::json!({
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "any": true,
                "list": {"type": "array", "items": true, "default": true},
                "either": {"anyOf": [true, {"type": "string"}]},
            },
            "$defs": {"Open": {"type": "object", "additionalProperties": true}},
        });
        spell_out_booleans(&mut schema);
        assert_eq!(
            schema,
            serde_json::json!({
                "type": "object",
                "additionalProperties": {"not": {}},
                "properties": {
                    "any": {},
                    "list": {"type": "array", "items": {}, "default": true},
                    "either": {"anyOf": [{}, {"type": "string"}]},
                },
                "$defs": {"Open": {"type": "object", "additionalProperties": {}}},
            })
        );
    }
}
