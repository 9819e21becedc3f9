//! Which module each module uses: every `crate::`, `super::` and `self::` path (and paths
//! through a child module), in `use` items, inline in code and inside macro calls, resolved
//! through re-exports and glob imports to the module that defines the item.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::{self, Visit};

use crate::source::{ModPath, Module, is_test, item_attrs};

/// One use of another module's item.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Edge {
    pub from: ModPath,
    /// The module that defines what was named (after following re-exports).
    pub to: ModPath,
    /// The path as written, and the line it is on.
    pub written: String,
    pub line: usize,
}

/// What one module names: the items it defines and what its `use` items bring in.
#[derive(Debug, Default)]
struct Scope {
    defines: BTreeSet<String>,
    /// A name brought in by `use` → the absolute path it stands for (`None`: from outside
    /// the crate).
    imports: HashMap<String, Option<Vec<String>>>,
    /// The modules of `use x::*`.
    globs: Vec<Vec<String>>,
}

/// A path written in a module, with where it starts.
struct Written {
    segments: Vec<String>,
    glob: bool,
    /// `use a::b as c`: the name it is known by.
    alias: Option<String>,
    in_use: bool,
    line: usize,
    /// The inline `mod x { … }` blocks it is written in, outermost first.
    inline: Vec<String>,
}

/// Every edge between the modules of one crate.
pub fn edges(modules: &[Module]) -> Vec<Edge> {
    let known: BTreeSet<ModPath> = modules.iter().map(|m| m.path.clone()).collect();
    let written: Vec<Vec<Written>> = modules.iter().map(|m| collect(&m.syntax)).collect();
    let mut scopes: BTreeMap<ModPath, Scope> = BTreeMap::new();
    for (module, paths) in modules.iter().zip(&written) {
        let mut scope = Scope::default();
        for item in &module.syntax.items {
            if !is_test(item_attrs(item))
                && let Some(name) = defined_name(item)
            {
                scope.defines.insert(name);
            }
        }
        for path in paths.iter().filter(|p| p.in_use && p.inline.is_empty()) {
            let absolute = anchor(&module.path, &path.segments, &known);
            if path.glob {
                if let Some(base) = absolute {
                    scope.globs.push(base);
                }
            } else if let Some(name) = path.alias.clone().or_else(|| path.segments.last().cloned())
            {
                scope.imports.insert(name, absolute);
            }
        }
        scopes.insert(module.path.clone(), scope);
    }
    let resolver = Resolver { known: &known, scopes: &scopes };
    let mut out = BTreeSet::new();
    for (module, paths) in modules.iter().zip(&written) {
        for path in paths {
            let inside: ModPath = module.path.iter().chain(&path.inline).cloned().collect();
            let Some(absolute) = anchor(&inside, &path.segments, &known) else { continue };
            let Some(to) = resolver.resolve(&absolute, 0) else { continue };
            if to != module.path {
                out.insert(Edge {
                    from: module.path.clone(),
                    to,
                    written: path.segments.join("::") + if path.glob { "::*" } else { "" },
                    line: path.line,
                });
            }
        }
    }
    out.into_iter().collect()
}

fn defined_name(item: &syn::Item) -> Option<String> {
    use syn::Item;
    let ident = match item {
        Item::Const(i) => &i.ident,
        Item::Enum(i) => &i.ident,
        Item::Fn(i) => &i.sig.ident,
        Item::Mod(i) => &i.ident,
        Item::Static(i) => &i.ident,
        Item::Struct(i) => &i.ident,
        Item::Trait(i) => &i.ident,
        Item::TraitAlias(i) => &i.ident,
        Item::Type(i) => &i.ident,
        Item::Union(i) => &i.ident,
        Item::Macro(i) => i.ident.as_ref()?,
        _ => return None,
    };
    Some(ident.to_string())
}

/// Turns a written path into one from the crate root, or `None` when it leaves the crate.
fn anchor(
    module: &[String],
    segments: &[String],
    known: &BTreeSet<ModPath>,
) -> Option<Vec<String>> {
    let first = segments.first()?;
    match first.as_str() {
        "crate" => Some(segments[1..].to_vec()),
        "self" => Some(module.iter().chain(&segments[1..]).cloned().collect()),
        "super" => {
            let mut base = module.to_vec();
            let mut rest = segments;
            while rest.first().is_some_and(|s| s == "super") {
                base.pop()?;
                rest = &rest[1..];
            }
            base.extend(rest.iter().cloned());
            Some(base)
        }
        _ => {
            let mut child = module.to_vec();
            child.push(first.clone());
            known.contains(&child).then(|| module.iter().chain(segments).cloned().collect())
        }
    }
}

struct Resolver<'a> {
    known: &'a BTreeSet<ModPath>,
    scopes: &'a BTreeMap<ModPath, Scope>,
}

impl Resolver<'_> {
    /// Whether a module defines or brings in a name (through its globs too).
    fn names(&self, module: &[String], name: &str, depth: usize) -> bool {
        let Some(scope) = self.scopes.get(module) else { return false };
        scope.defines.contains(name)
            || scope.imports.contains_key(name)
            || depth < 16
                && scope.globs.iter().any(|g| {
                    self.resolve(g, depth + 1).is_some_and(|b| self.names(&b, name, depth + 1))
                })
    }

    /// The module that defines what an absolute path names; `None` when it comes from
    /// outside the crate.
    fn resolve(&self, absolute: &[String], depth: usize) -> Option<ModPath> {
        let mut module: ModPath = Vec::new();
        let mut at = 0;
        while at < absolute.len() {
            let mut child = module.clone();
            child.push(absolute[at].clone());
            if !self.known.contains(&child) {
                break;
            }
            module = child;
            at += 1;
        }
        let Some(name) = absolute.get(at) else { return Some(module) };
        let scope = self.scopes.get(&module)?;
        if scope.defines.contains(name) || depth > 16 {
            return Some(module);
        }
        if let Some(target) = scope.imports.get(name) {
            let target = target.as_ref()?;
            let rest: Vec<String> = target.iter().chain(&absolute[at + 1..]).cloned().collect();
            return self.resolve(&rest, depth + 1);
        }
        for glob in &scope.globs {
            let Some(base) = self.resolve(glob, depth + 1) else { continue };
            if self.names(&base, name, depth + 1) {
                let through: Vec<String> = base.iter().chain(&absolute[at..]).cloned().collect();
                return self.resolve(&through, depth + 1);
            }
        }
        Some(module)
    }
}

fn collect(file: &syn::File) -> Vec<Written> {
    let mut collector = Collector { out: Vec::new(), inline: Vec::new() };
    collector.visit_file(file);
    collector.out
}

struct Collector {
    out: Vec<Written>,
    inline: Vec<String>,
}

impl Collector {
    /// A path written outside a `use` item, in an expression, a type or a macro call.
    fn inline_path(&mut self, segments: Vec<String>, line: usize) {
        let inline = self.inline.clone();
        self.out.push(Written { segments, glob: false, alias: None, in_use: false, line, inline });
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => self.push_use(prefix, &n.ident, None, false),
            syn::UseTree::Rename(r) => {
                self.push_use(prefix, &r.ident, Some(r.rename.to_string()), false);
            }
            syn::UseTree::Glob(g) => {
                let line = g.star_token.spans[0].start().line;
                let inline = self.inline.clone();
                self.out.push(Written {
                    segments: prefix.clone(),
                    glob: true,
                    alias: None,
                    in_use: true,
                    line,
                    inline,
                });
            }
            syn::UseTree::Group(g) => {
                for tree in &g.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }

    fn push_use(
        &mut self,
        prefix: &[String],
        ident: &syn::Ident,
        alias: Option<String>,
        glob: bool,
    ) {
        let mut segments = prefix.to_vec();
        // `use a::b::{self}` names `a::b`.
        if ident != "self" {
            segments.push(ident.to_string());
        }
        let line = ident.span().start().line;
        let inline = self.inline.clone();
        self.out.push(Written { segments, glob, alias, in_use: true, line, inline });
    }

    /// Paths inside a macro call are tokens, not syntax: `crate :: a :: b` sequences are
    /// read from them directly.
    fn tokens(&mut self, tokens: TokenStream) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut at = 0;
        while at < trees.len() {
            if let TokenTree::Group(group) = &trees[at] {
                self.tokens(group.stream());
                at += 1;
                continue;
            }
            let starts = matches!(&trees[at], TokenTree::Ident(i) if i == "crate" || i == "super" || i == "self")
                && is_path_sep(&trees, at + 1);
            if !starts {
                at += 1;
                continue;
            }
            let line = trees[at].span().start().line;
            let mut segments = Vec::new();
            while let Some(TokenTree::Ident(ident)) = trees.get(at) {
                segments.push(ident.to_string());
                at += 1;
                if is_path_sep(&trees, at) {
                    at += 2;
                } else {
                    break;
                }
            }
            self.inline_path(segments, line);
        }
    }
}

fn is_path_sep(trees: &[TokenTree], at: usize) -> bool {
    matches!((trees.get(at), trees.get(at + 1)),
        (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b))) if a.as_char() == ':' && b.as_char() == ':')
}

impl<'ast> Visit<'ast> for Collector {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if !is_test(item_attrs(item)) {
            visit::visit_item(self, item);
        }
    }

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        self.inline.push(item.ident.to_string());
        visit::visit_item_mod(self, item);
        self.inline.pop();
    }

    fn visit_impl_item_fn(&mut self, item: &'ast syn::ImplItemFn) {
        if !is_test(&item.attrs) {
            visit::visit_impl_item_fn(self, item);
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        if item.leading_colon.is_none() {
            self.use_tree(&mut Vec::new(), &item.tree);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() && path.segments.len() > 1 {
            let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
            let line = path.segments[0].ident.span().start().line;
            self.inline_path(segments, line);
        }
        visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.tokens(mac.tokens.clone());
        visit::visit_macro(self, mac);
    }
}
