//! What a level reads: its prompt template, inline or from a file, and its JSON schemas.

use std::sync::Arc;

use super::checker::Checker;
use crate::de::Located;
use crate::files::check_template;
use crate::model::Template;
use crate::raw::{RawLevel, RawPrompt, RawSchema};
use crate::schema::JsonSchema;
use crate::source::Pos;

impl Checker<'_> {
    pub(super) fn required_prompt(&mut self, raw: &Located<RawLevel>) -> Option<Template> {
        match &raw.prompt {
            Some(p) => self.prompt(p, &raw.id.value),
            None => {
                self.error(
                    "missing-field",
                    raw.pos,
                    format!("a `{}` level needs a `prompt`", raw.kind.value.as_str()),
                )
                .help =
                    Some("add `prompt: prompts/<name>.j2` or `prompt: {inline: \"…\"}`".to_owned());
                None
            }
        }
    }

    pub(super) fn prompt(&mut self, p: &Located<RawPrompt>, level: &str) -> Option<Template> {
        match &p.value {
            RawPrompt::Template(path) => {
                let text = self.files.template(path, p.pos, self.sources, self.diags)?;
                Some(Template { name: path.clone(), text })
            }
            RawPrompt::Inline { inline } => {
                let name = format!("inline:{level}");
                let errors = check_template(
                    &name,
                    inline,
                    inline.pos.source,
                    self.sources,
                    Some(inline.pos),
                );
                if !errors.is_empty() {
                    for e in errors {
                        self.diags.push(e);
                    }
                    return None;
                }
                Some(Template { name, text: Arc::from(inline.value.as_str()) })
            }
        }
    }

    pub(super) fn schema(&mut self, s: &Located<RawSchema>) -> Option<JsonSchema> {
        let value = self.schema_value(s)?;
        self.compile_schema(value, s.pos)
    }

    /// Compiles a schema document, reporting at `pos` when it is not a valid JSON Schema.
    pub(super) fn compile_schema(
        &mut self,
        value: serde_json::Value,
        pos: Pos,
    ) -> Option<JsonSchema> {
        match JsonSchema::compile(value) {
            Ok(schema) => Some(schema),
            Err(e) => {
                self.error("bad-schema", pos, format!("invalid JSON Schema: {e}"));
                None
            }
        }
    }

    pub(super) fn schema_value(&mut self, s: &Located<RawSchema>) -> Option<serde_json::Value> {
        match &s.value {
            RawSchema::Inline(map) => {
                if map.is_empty() {
                    self.error("bad-schema", s.pos, "the schema is empty").help =
                        Some("give at least a `type`, for example `{type: object}`".to_owned());
                    return None;
                }
                Some(serde_json::Value::Object(map.clone()))
            }
            RawSchema::File(path) => self.files.schema(path, s.pos, self.sources, self.diags),
        }
    }
}
