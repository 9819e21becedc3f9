//! JSON Schemas a scenario declares, compiled when the scenario loads.
//!
//! A schema that does not compile is a load error; a compiled one validates answers at
//! run time and names each violation by JSON pointer.

use std::fmt;
use std::sync::Arc;

use serde_json::Value;

/// A compiled JSON Schema with the document it came from.
#[derive(Clone)]
pub struct JsonSchema {
    value: Value,
    validator: Arc<jsonschema::Validator>,
}

impl JsonSchema {
    /// Compiles a schema (draft detected from `$schema`, 2020-12 otherwise).
    pub fn compile(value: Value) -> Result<Self, String> {
        let validator = jsonschema::validator_for(&value).map_err(|e| e.to_string())?;
        Ok(JsonSchema { value, validator: Arc::new(validator) })
    }

    /// The schema document.
    pub fn value(&self) -> &Value {
        &self.value
    }

    /// Every violation of `instance`, as `pointer: message` (empty when it is valid).
    pub fn violations(&self, instance: &Value) -> Vec<String> {
        self.validator
            .iter_errors(instance)
            .map(|e| {
                let at = e.instance_path().to_string();
                format!("{}: {}", if at.is_empty() { "/" } else { at.as_str() }, e)
            })
            .collect()
    }
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
