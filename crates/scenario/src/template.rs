//! The template environment shared by the loader and the engine, and what a template uses.
//!
//! [`environment`] builds the one minijinja `Environment` every prompt is rendered with;
//! the loader asks that same environment whether a filter, test or function exists, so
//! the set of names `baton validate` accepts is exactly the set the renderer provides —
//! no hand-copied list to drift. [`uses`] scans a template's tokens for the filters,
//! tests and function calls it names and for the tags that would load another template
//! (`include`, `import`, `from`, `extends`), which prompts do not support: a prompt is one
//! file, so what `validate` checked is all that renders.

use minijinja::machinery::{Token, tokenize};

use crate::limits;

/// The environment prompts are rendered in: undefined values are errors, and each render
/// is bounded by [`limits::TEMPLATE_FUEL_MAX`].
pub fn environment() -> minijinja::Environment<'static> {
    let mut env = minijinja::Environment::new();
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    env.set_fuel(Some(limits::TEMPLATE_FUEL_MAX));
    env
}

/// What a name in a template is used as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UseKind {
    /// `value | name`, or `{% filter name %}`.
    Filter,
    /// `value is name`, `value is not name`.
    Test,
    /// `name(…)` called as a plain name (not a method).
    Function,
    /// A tag that loads another template: `include`, `import`, `from`, `extends`.
    Load,
}

/// One use of a name, with its byte range in the template's text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Use {
    pub kind: UseKind,
    pub name: String,
    pub start: usize,
    pub end: usize,
}

/// Tags that load another template.
const LOAD_TAGS: &[&str] = &["include", "import", "from", "extends"];

/// Names a template may call that it binds itself (macros are added by [`uses`]).
const LOCAL_CALLABLES: &[&str] = &["caller", "super", "loop", "varargs", "kwargs"];

/// The filters, tests, calls and loading tags of a template, in order. A template the
/// lexer cannot read yields the uses before the problem (the parser reports the problem).
pub fn uses(text: &str) -> Vec<Use> {
    let env = environment();
    let mut tokens: Vec<(Token<'_>, usize, usize)> = Vec::new();
    for token in tokenize(text, false, env.syntax().clone()) {
        let Ok((token, span)) = token else { break };
        tokens.push((token, span.start_offset as usize, span.end_offset as usize));
    }
    let ident = |i: usize| match tokens.get(i) {
        Some((Token::Ident(name), start, end)) => Some((*name, *start, *end)),
        _ => None,
    };
    // Macros and other names the template binds (see below).
    let mut macros: Vec<&str> = Vec::new();
    let mut out = Vec::new();
    for i in 0..tokens.len() {
        let after_block_start = i > 0 && matches!(tokens[i - 1].0, Token::BlockStart);
        let after_dot = i > 0 && matches!(tokens[i - 1].0, Token::Dot);
        match &tokens[i].0 {
            Token::Pipe => {
                if let Some((name, start, end)) = ident(i + 1) {
                    out.push(Use { kind: UseKind::Filter, name: name.to_owned(), start, end });
                }
            }
            Token::Ident(word) if after_block_start && LOAD_TAGS.contains(word) => {
                let (_, start, end) = tokens[i];
                out.push(Use { kind: UseKind::Load, name: (*word).to_owned(), start, end });
            }
            Token::Ident("filter") if after_block_start => {
                if let Some((name, start, end)) = ident(i + 1) {
                    out.push(Use { kind: UseKind::Filter, name: name.to_owned(), start, end });
                }
            }
            // Names the template binds itself may hold a macro: `{% set f = m %}`, loop
            // targets, `{% with f = … %}`; calling them is not calling an unknown function.
            Token::Ident("macro" | "set" | "with") if after_block_start => {
                if let Some((name, _, _)) = ident(i + 1) {
                    macros.push(name);
                }
            }
            Token::Ident("for") if after_block_start => {
                let mut k = i + 1;
                while let Some((name, _, _)) = ident(k).filter(|(n, _, _)| *n != "in") {
                    macros.push(name);
                    k +=
                        if matches!(tokens.get(k + 1), Some((Token::Comma, _, _))) { 2 } else { 1 };
                }
            }
            Token::Ident("is") if !after_dot => {
                let next = if matches!(ident(i + 1), Some(("not", _, _))) { i + 2 } else { i + 1 };
                if let Some((name, start, end)) = ident(next) {
                    out.push(Use { kind: UseKind::Test, name: name.to_owned(), start, end });
                }
            }
            Token::Ident(name)
                if !after_dot
                    && matches!(tokens.get(i + 1), Some((Token::ParenOpen, _, _)))
                    && !names_filter_test_or_macro(&tokens, i) =>
            {
                let (_, start, end) = tokens[i];
                out.push(Use { kind: UseKind::Function, name: (*name).to_owned(), start, end });
            }
            _ => {}
        }
    }
    // A macro may be called before the line that defines it (minijinja hoists nothing, but
    // a call inside another macro's body runs later), so calls are filtered at the end.
    out.retain(|u| {
        u.kind != UseKind::Function
            || !(macros.contains(&u.name.as_str()) || LOCAL_CALLABLES.contains(&u.name.as_str()))
    });
    out
}

/// Whether the name at `tokens[i]` is a filter (`| name(…)`, `{% filter name(…) %}`), a
/// test (`is name(…)`, `is not name(…)`) or a macro being defined, rather than a call.
fn names_filter_test_or_macro(tokens: &[(Token<'_>, usize, usize)], i: usize) -> bool {
    let before = |k: usize| i.checked_sub(k).and_then(|j| tokens.get(j)).map(|t| &t.0);
    match before(1) {
        Some(Token::Pipe | Token::Ident("is" | "macro" | "filter")) => true,
        Some(Token::Ident("not")) => matches!(before(2), Some(Token::Ident("is"))),
        _ => false,
    }
}

/// Whether the renderer's environment provides this filter.
pub fn has_filter(env: &minijinja::Environment<'_>, name: &str) -> bool {
    let mut state = env.empty_state();
    !matches!(state.apply_filter(name, &[]), Err(e) if e.kind() == minijinja::ErrorKind::UnknownFilter)
}

/// Whether the renderer's environment provides this test.
pub fn has_test(env: &minijinja::Environment<'_>, name: &str) -> bool {
    let mut state = env.empty_state();
    !matches!(state.perform_test(name, &[]), Err(e) if e.kind() == minijinja::ErrorKind::UnknownTest)
}

/// The global names (functions such as `range`, `dict`, `namespace`) the environment
/// provides to every template.
pub fn globals(env: &minijinja::Environment<'_>) -> Vec<String> {
    env.globals().map(|(name, _)| name.to_owned()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shared_environment_knows_the_builtins_and_nothing_else() {
        let env = environment();
        assert!(has_filter(&env, "upper") && has_filter(&env, "tojson"));
        assert!(!has_filter(&env, "nosuchfilter"));
        assert!(has_test(&env, "defined") && has_test(&env, "none"));
        assert!(!has_test(&env, "nosuchtest"));
        let globals = globals(&env);
        assert!(globals.iter().any(|g| g == "range"), "{globals:?}");
        assert!(!globals.iter().any(|g| g == "nosuch"));
    }

    #[test]
    fn templates_that_render_are_accepted() {
        let ok = [
            "{{ input | default('none') | upper }}",
            "{% if input is defined and input is not none %}{{ input | trim }}{% endif %}",
            "{% macro item(x) %}- {{ x }}{% endmacro %}{% for l in range(3) %}{{ item(l) }}{% endfor %}",
            "{% set ns = namespace(n=0) %}{% for k, v in dict(a=1) | items %}{{ loop.cycle('a', 'b') }}{% endfor %}",
            "{% filter upper %}{{ input }}{% endfilter %}{{ 'a|b is c' }}",
            "{% macro wrap() %}[{{ caller() }}]{% endmacro %}{% call wrap() %}{{ input }}{% endcall %}",
            "{% macro wrap(x) %}{{ x }}{% endmacro %}{% set shout = wrap %}{{ shout(input) }}",
            "{% for row in level | list %}{{ row }}{% endfor %}{{ input | tojson }}",
            "{% raw %}{{ input | nosuchfilter }}{% include 'x' %}{% endraw %}",
        ];
        let mut sources = crate::Sources::new();
        for text in ok {
            let source = sources.add("t.j2", text);
            let errors = crate::files::check_template("t.j2", text, source, &sources, None);
            assert!(errors.is_empty(), "{text}: {errors:?}");
        }
    }

    #[test]
    fn uses_finds_filters_tests_calls_and_loading_tags_with_their_bytes() {
        let text = "{% macro m(x) %}{{ x }}{% endmacro %}{{ input | upper }}{% if a is not odd %}\
                    {{ m(1) }}{{ range(3) }}{{ a.items() }}{% endif %}{% include 'x.j2' %}";
        let found: Vec<(UseKind, String, String)> = uses(text)
            .into_iter()
            .map(|u| (u.kind, u.name, text[u.start..u.end].to_owned()))
            .collect();
        let expected = [
            (UseKind::Filter, "upper"),
            (UseKind::Test, "odd"),
            (UseKind::Function, "range"),
            (UseKind::Load, "include"),
        ];
        let expected: Vec<(UseKind, String, String)> =
            expected.iter().map(|(k, n)| (*k, (*n).to_owned(), (*n).to_owned())).collect();
        assert_eq!(found, expected);
    }
}
