//! A crate's source files as modules: each file read, parsed with `syn`, named by its module
//! path, with the files only tests compile left out.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use syn::spanned::Spanned;

/// A module path from the crate root: `[]` is `lib.rs`/`main.rs`, `["mcp", "tools"]` is
/// `mcp/tools.rs`.
pub type ModPath = Vec<String>;

/// One source file of a crate, parsed.
pub struct Module {
    pub path: ModPath,
    /// Where it was read from, for messages (relative to the workspace when read from disk).
    pub file: PathBuf,
    pub syntax: syn::File,
    /// Lines outside `#[cfg(test)]` items.
    pub code_lines: usize,
}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Module")
            .field("path", &self.path)
            .field("file", &self.file)
            .finish_non_exhaustive()
    }
}

/// Shows a module path the way the layer lists write it (`crate` for the root).
pub fn show(path: &[String]) -> String {
    if path.is_empty() { "crate".to_owned() } else { path.join("::") }
}

/// Parses a crate given as `(file name relative to src, text)` pairs — the disk reader and
/// the unit tests both come through here.
pub fn parse_crate(files: &[(PathBuf, String)]) -> Result<Vec<Module>, String> {
    let mut modules = Vec::new();
    for (relative, text) in files {
        let syntax = syn::parse_file(text)
            .map_err(|e| format!("{}: cannot parse: {e}", relative.display()))?;
        let code_lines = text.lines().count() - test_lines(&syntax);
        modules.push(Module {
            path: module_path(relative),
            file: relative.clone(),
            syntax,
            code_lines,
        });
    }
    let test_only = test_only_modules(&modules);
    modules.retain(|m| !test_only.iter().any(|t| m.path.starts_with(t)));
    modules.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(modules)
}

/// Reads and parses every `.rs` file under `src`, naming each file relative to `base`.
pub fn read_crate(src: &Path, base: &Path) -> Result<Vec<Module>, String> {
    let mut files = Vec::new();
    collect(src, src, &mut files)?;
    let mut parsed = parse_crate(&files)?;
    for module in &mut parsed {
        let full = src.join(&module.file);
        module.file = full.strip_prefix(base).map(Path::to_path_buf).unwrap_or(full);
    }
    Ok(parsed)
}

fn collect(root: &Path, dir: &Path, out: &mut Vec<(PathBuf, String)>) -> Result<(), String> {
    let entries = fs::read_dir(dir).map_err(|e| format!("{}: cannot list: {e}", dir.display()))?;
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for path in paths {
        if path.is_dir() {
            collect(root, &path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = fs::read_to_string(&path)
                .map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
            let relative = path.strip_prefix(root).map(Path::to_path_buf).unwrap_or(path);
            out.push((relative, text));
        }
    }
    Ok(())
}

fn module_path(relative: &Path) -> ModPath {
    let mut parts: ModPath = relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if let Some(last) = parts.pop() {
        let stem = last.trim_end_matches(".rs");
        if parts.is_empty() && (stem == "lib" || stem == "main") || stem == "mod" {
            return parts;
        }
        parts.push(stem.to_owned());
    }
    parts
}

/// Whether attributes put an item under `#[cfg(test)]` (alone or inside `all(…)`).
pub fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        if !attr.path().is_ident("cfg") {
            return false;
        }
        let syn::Meta::List(list) = &attr.meta else { return false };
        let words: Vec<String> = idents(list.tokens.clone());
        words.iter().any(|w| w == "test") && !words.iter().any(|w| w == "not")
    })
}

fn idents(tokens: proc_macro2::TokenStream) -> Vec<String> {
    let mut out = Vec::new();
    for tree in tokens {
        match tree {
            proc_macro2::TokenTree::Ident(i) => out.push(i.to_string()),
            proc_macro2::TokenTree::Group(g) => out.extend(idents(g.stream())),
            _ => {}
        }
    }
    out
}

/// The attributes of an item, for the kinds that can carry `#[cfg(test)]` here.
pub fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    use syn::Item;
    match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::ExternCrate(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::ForeignMod(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::TraitAlias(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Union(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

fn test_lines(file: &syn::File) -> usize {
    file.items
        .iter()
        .filter(|item| is_test(item_attrs(item)))
        .map(|item| {
            let span = item.span();
            span.end().line.saturating_sub(span.start().line) + 1
        })
        .sum()
}

/// Modules declared `#[cfg(test)] mod x;` in their parent's file.
fn test_only_modules(modules: &[Module]) -> BTreeSet<ModPath> {
    let mut out = BTreeSet::new();
    for module in modules {
        for item in &module.syntax.items {
            if let syn::Item::Mod(m) = item
                && m.content.is_none()
                && is_test(&m.attrs)
            {
                let mut path = module.path.clone();
                path.push(m.ident.to_string());
                out.insert(path);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_named_by_their_module_path() {
        assert_eq!(module_path(Path::new("lib.rs")), Vec::<String>::new());
        assert_eq!(module_path(Path::new("main.rs")), Vec::<String>::new());
        assert_eq!(module_path(Path::new("event.rs")), vec!["event"]);
        assert_eq!(module_path(Path::new("mcp/mod.rs")), vec!["mcp"]);
        assert_eq!(module_path(Path::new("mcp/tools.rs")), vec!["mcp", "tools"]);
    }

    #[test]
    fn test_items_are_not_counted_as_code() {
        let text = "pub fn a() {}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn t() {}\n}\n";
        let parsed = parse_crate(&[(PathBuf::from("lib.rs"), text.to_owned())]).expect("parses");
        assert_eq!(parsed[0].code_lines, 2);
    }
}
