//! JSON Schemas a scenario declares, compiled when the scenario loads.
//!
//! A schema that does not compile is a load error; a compiled one validates answers at
//! run time and names each violation by JSON pointer.
//!
//! One schema is checked without compiling: the default of an approval level that declares
//! none (`approved`, a boolean, and an optional `comment`). Every approval without a schema
//! of its own uses it and every decision is checked against it, and compiling it — the
//! validator first checks a schema against its draft's meta-schemas, which it builds and
//! keeps — cost more than a whole approval level, and a process that never needed a
//! schema half a megabyte of memory. Its check gives exactly the messages the compiled
//! validator gives (a test holds the two together).

use std::fmt;
use std::sync::{Arc, LazyLock};

use serde_json::Value;

/// A compiled JSON Schema with the document it came from.
#[derive(Clone)]
pub struct JsonSchema {
    value: Value,
    check: Check,
}

#[derive(Clone)]
enum Check {
    /// The approval default, checked by [`approval_violations`].
    ApprovalDefault,
    Compiled(Arc<jsonschema::Validator>),
}

/// The schema of an approval level that declares none.
pub fn approval_default() -> Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "approved": {"type": "boolean"},
            "comment": {"type": "string"}
        },
        "required": ["approved"]
    })
}

static APPROVAL_DEFAULT: LazyLock<Value> = LazyLock::new(approval_default);

impl JsonSchema {
    /// Compiles a schema (draft detected from `$schema`, 2020-12 otherwise).
    pub fn compile(value: Value) -> Result<Self, String> {
        if value == *APPROVAL_DEFAULT {
            return Ok(JsonSchema { value, check: Check::ApprovalDefault });
        }
        let validator = compile_validator(&value)?;
        Ok(JsonSchema { value, check: Check::Compiled(Arc::new(validator)) })
    }

    /// The schema document.
    pub fn value(&self) -> &Value {
        &self.value
    }

    /// Every violation of `instance`, as `pointer: message` (empty when it is valid).
    pub fn violations(&self, instance: &Value) -> Vec<String> {
        match &self.check {
            Check::ApprovalDefault => approval_violations(instance),
            Check::Compiled(validator) => validator
                .iter_errors(instance)
                .map(|e| {
                    let at = e.instance_path().to_string();
                    format!("{}: {}", if at.is_empty() { "/" } else { at.as_str() }, e)
                })
                .collect(),
        }
    }
}

fn compile_validator(value: &Value) -> Result<jsonschema::Validator, String> {
    jsonschema::validator_for(value).map_err(|e| e.to_string())
}

/// The approval default's violations, worded and ordered as the compiled validator words
/// and orders them.
fn approval_violations(instance: &Value) -> Vec<String> {
    let Value::Object(fields) = instance else {
        return vec![format!("/: {instance} is not of type \"object\"")];
    };
    let mut found = Vec::new();
    if !fields.contains_key("approved") {
        found.push("/: \"approved\" is a required property".to_owned());
    }
    for (field, kind, is_kind) in [
        ("approved", "boolean", Value::is_boolean as fn(&Value) -> bool),
        ("comment", "string", Value::is_string),
    ] {
        if let Some(value) = fields.get(field).filter(|v| !is_kind(v)) {
            found.push(format!("/{field}: {value} is not of type \"{kind}\""));
        }
    }
    found
}

impl PartialEq for JsonSchema {
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}

impl fmt::Debug for JsonSchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("JsonSchema").field(&self.value).finish()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// What the compiled validator says of `instance` under the approval default.
    fn compiled_violations(instance: &Value) -> Vec<String> {
        let validator =
            compile_validator(&approval_default()).expect("the approval default compiles");
        let compiled =
            JsonSchema { value: approval_default(), check: Check::Compiled(Arc::new(validator)) };
        compiled.violations(instance)
    }

    #[test]
    fn the_approval_default_is_checked_by_hand_as_the_validator_checks_it() {
        let schema =
            JsonSchema::compile(approval_default()).expect("the approval default is a schema");
        assert!(matches!(schema.check, Check::ApprovalDefault));
        let instances = [
            json!(null),
            json!(true),
            json!(3),
            json!("approved"),
            json!([{"approved": true}]),
            json!({}),
            json!({"approved": true}),
            json!({"approved": false, "comment": "fine"}),
            json!({"approved": "yes"}),
            json!({"approved": null}),
            json!({"approved": 1, "comment": 2}),
            json!({"comment": ["a", {"b": "c\"d"}]}),
            json!({"approved": true, "comment": null, "by": "ana", "risk": 3}),
            json!({"comment": "no decision"}),
        ];
        for instance in &instances {
            assert_eq!(schema.violations(instance), compiled_violations(instance), "{instance}");
        }
        assert!(schema.violations(&json!({"approved": true})).is_empty());
        assert_eq!(schema.violations(&json!({})).len(), 1);
    }

    #[test]
    fn another_schema_is_compiled() {
        let mut value = approval_default();
        value["required"] = json!(["approved", "comment"]);
        let schema = JsonSchema::compile(value).expect("a valid schema compiles");
        assert!(matches!(schema.check, Check::Compiled(_)));
        assert_eq!(
            schema.violations(&json!({"approved": true})),
            ["/: \"comment\" is a required property"]
        );
        assert!(JsonSchema::compile(json!({"type": 3})).is_err());
    }
}
