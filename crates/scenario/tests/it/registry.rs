//! The loader and registry: checksums, refresh, tenant overrides, routes, limits.

use baton_scenario::registry::Override;
use baton_scenario::{Registry, RegistryHandle};

use crate::TempDir;

const BASE: &str = "\
id: qa
version: 1
intent_routes: [QA]
budget: {max_cost_usd: 1.0}
levels:
  - id: answer
    kind: prompt
    prompt: prompts/answer.j2
    model: {allow: ['free:*']}
    terminal: true
edges:
  - {from: answer, to: __end__}
";

/// An override of scenario `id`, named `name` in its tenant's store.
fn tenant_override(id: &str, name: &str, yaml: &str) -> Override {
    Override { scenario_id: id.to_owned(), name: name.to_owned(), yaml: yaml.to_owned() }
}

fn dir_with_base(name: &str) -> TempDir {
    let dir = TempDir::new(name);
    dir.write("prompts/answer.j2", "Answer: {{ input }}");
    dir.write("qa.yaml", BASE);
    dir
}

#[test]
fn checksum_is_stable_across_key_order_and_formatting() {
    let a = dir_with_base("checksum-a");
    let b = TempDir::new("checksum-b");
    b.write("prompts/answer.j2", "Answer: {{ input }}");
    b.write(
        "qa.yaml",
        "# the same scenario, reordered and restyled\n\
         edges: [{to: __end__, from: answer}]\n\
         levels:\n- {kind: prompt, id: answer, terminal: true, model: {allow: [\"free:*\"]}, prompt: \"prompts/answer.j2\"}\n\
         budget:\n  max_cost_usd: 1.00\n\
         intent_routes:\n  - QA\n\
         version: 1\nid: 'qa'\n",
    );
    let sa = Registry::load(&[a.path()]).unwrap().registry.get("qa").unwrap().checksum.clone();
    let sb = Registry::load(&[b.path()]).unwrap().registry.get("qa").unwrap().checksum.clone();
    assert_eq!(sa, sb);
    assert_eq!(sa.len(), 64);

    // A change of meaning, or of a template the scenario reads, changes it.
    b.write("prompts/answer.j2", "Answer briefly: {{ input }}");
    let sc = Registry::load(&[b.path()]).unwrap().registry.get("qa").unwrap().checksum.clone();
    assert_ne!(sa, sc);
}

#[test]
fn routes_are_case_insensitive() {
    let dir = dir_with_base("routes");
    let loaded = Registry::load(&[dir.path()]).unwrap();
    assert_eq!(loaded.registry.by_route("qa").unwrap().id, "qa");
    assert_eq!(loaded.registry.by_route(" Qa ").unwrap().id, "qa");
    assert!(loaded.registry.by_route("research").is_none());
}

#[test]
fn refresh_swaps_atomically_and_keeps_the_old_registry_on_error() {
    let dir = dir_with_base("refresh");
    let (handle, _) = RegistryHandle::open(vec![dir.path().to_path_buf()]).unwrap();
    let before = handle.current();
    assert_eq!(before.get("qa").unwrap().version, 1);

    dir.write("qa.yaml", &BASE.replace("version: 1", "version: 2"));
    handle.refresh().unwrap();
    assert_eq!(handle.current().get("qa").unwrap().version, 2);
    // A reader holding the old registry keeps it intact.
    assert_eq!(before.get("qa").unwrap().version, 1);

    dir.write("qa.yaml", &BASE.replace("kind: prompt", "kind: promtp"));
    let err = handle.refresh().unwrap_err();
    assert!(err.to_string().contains("1 error"), "{err}");
    assert_eq!(handle.current().get("qa").unwrap().version, 2, "the old registry stays");

    dir.write("other.yaml", &BASE.replace("id: qa", "id: other"));
    dir.write("qa.yaml", &BASE.replace("version: 1", "version: 3"));
    let err = handle.refresh().unwrap_err();
    assert!(err.diagnostics.render().contains("duplicate-route"), "{}", err.diagnostics.render());
    assert_eq!(handle.current().get("qa").unwrap().version, 2);
}

#[test]
fn a_handle_reloads_only_when_a_file_changed_and_keeps_the_old_registry_on_error() {
    let dir = dir_with_base("watch");
    let (handle, _) = RegistryHandle::open(vec![dir.path().to_path_buf()]).unwrap();
    assert!(handle.refresh_if_changed().is_none(), "nothing changed");
    dir.write("qa.yaml", &BASE.replace("version: 1", "version: 22"));
    handle.refresh_if_changed().unwrap().unwrap();
    assert_eq!(handle.current().get("qa").unwrap().version, 22);
    assert!(handle.refresh_if_changed().is_none());
    // A broken file is reported once; the registry in use stays the last good one.
    dir.write("qa.yaml", &BASE.replace("kind: prompt", "kind: promtp"));
    assert!(handle.refresh_if_changed().unwrap().is_err());
    assert!(handle.refresh_if_changed().is_none());
    assert_eq!(handle.current().get("qa").unwrap().version, 22);
    // A new file is a change too.
    dir.write("qa.yaml", &BASE.replace("version: 1", "version: 333"));
    dir.write("other.yaml", &BASE.replace("id: qa", "id: other").replace("[QA]", "[OTHER]"));
    handle.refresh_if_changed().unwrap().unwrap();
    assert_eq!(handle.current().get("qa").unwrap().version, 333);
    assert!(handle.current().get("other").is_some());
}

#[test]
fn tenant_overrides_merge_maps_and_replace_lists() {
    let dir = dir_with_base("overrides");
    let base = Registry::load(&[dir.path()]).unwrap().registry;
    let o = tenant_override(
        "qa",
        "acme/qa.yaml",
        "budget: {max_tokens: 5000}\nintent_routes: [quick]\n",
    );
    let merged = base.with_overrides("acme", &[o]).unwrap().registry;
    let qa = merged.get("qa").unwrap();
    assert_eq!(qa.budget.max_cost_usd, Some(1.0), "maps merge key by key");
    assert_eq!(qa.budget.max_tokens, Some(5000));
    assert_eq!(qa.intent_routes, vec!["quick".to_owned()], "lists replace");
    assert!(merged.by_route("quick").is_some() && merged.by_route("qa").is_none());
    assert_ne!(qa.checksum, base.get("qa").unwrap().checksum);
    // The base registry is untouched.
    assert_eq!(base.get("qa").unwrap().budget.max_tokens, None);
}

#[test]
fn override_errors_name_the_tenant_the_override_and_its_line() {
    let dir = dir_with_base("override-errors");
    let base = Registry::load(&[dir.path()]).unwrap().registry;
    let o = tenant_override("qa", "acme/qa.yaml", "budget:\n  max_cost_usd: 2\n  max_cents: 5\n");
    let err = base.with_overrides("acme", &[o]).unwrap_err();
    let d = err.diagnostics.iter().next().unwrap();
    assert!(d.message.contains("tenant `acme`") && d.message.contains("acme/qa.yaml"), "{d}");
    assert!(d.message.contains("unknown field `max_cents`"), "{d}");
    assert_eq!((d.file.as_str(), d.line), ("acme/qa.yaml", 3), "{d}");

    let unknown = tenant_override("nope", "acme/nope.yaml", "version: 2\n");
    let err = base.with_overrides("acme", &[unknown]).unwrap_err();
    assert!(err.diagnostics.render().contains("no scenario `nope`"));

    let bad_gate = tenant_override(
        "qa",
        "acme/qa.yaml",
        "edges:\n  - {from: answer, to: __end__, when: \"verdict == 'pass'\"}\n",
    );
    let err = base.with_overrides("acme", &[bad_gate]).unwrap_err();
    let d = err.diagnostics.iter().next().unwrap();
    assert_eq!((d.file.as_str(), d.line), ("acme/qa.yaml", 2), "{d}");
    assert!(d.message.contains("never matches"), "{d}");
}

#[test]
fn override_null_does_not_delete() {
    let dir = dir_with_base("override-null");
    let base = Registry::load(&[dir.path()]).unwrap().registry;
    let o = tenant_override("qa", "t/qa.yaml", "budget: {max_cost_usd: null}\n");
    let merged = base.with_overrides("t", &[o]).unwrap().registry;
    assert_eq!(merged.get("qa").unwrap().budget.max_cost_usd, Some(1.0));
}

#[test]
fn symlinked_template_outside_the_directory_is_refused() {
    let outside = TempDir::new("outside");
    let secret = outside.write("secret.j2", "{{ input }}");
    let dir = TempDir::new("symlink");
    dir.write("qa.yaml", &BASE.replace("prompts/answer.j2", "prompts/link.j2"));
    std::fs::create_dir_all(dir.path().join("prompts")).unwrap();
    std::os::unix::fs::symlink(&secret, dir.path().join("prompts/link.j2")).unwrap();
    let err = Registry::load(&[dir.path()]).unwrap_err();
    assert!(
        err.diagnostics.render().contains("leads outside the scenarios directory"),
        "{}",
        err.diagnostics.render()
    );
}

#[test]
fn a_missing_path_is_a_clear_error() {
    let err = Registry::load(&["/nonexistent/baton/scenarios"]).unwrap_err();
    let text = err.diagnostics.render();
    assert!(text.contains("cannot read `/nonexistent/baton/scenarios`"), "{text}");
}

#[test]
fn an_oversized_file_is_refused_before_parsing() {
    let dir = TempDir::new("oversized");
    let mut big = BASE.to_owned();
    big.push_str(&format!(
        "metadata: {{filler: \"{}\"}}\n",
        "x".repeat(baton_scenario::limits::SOURCE_BYTES_MAX)
    ));
    dir.write("prompts/answer.j2", "Answer: {{ input }}");
    dir.write("qa.yaml", &big);
    let err = Registry::load(&[dir.path()]).unwrap_err();
    assert!(err.diagnostics.render().contains("file-too-large"));
}

#[test]
fn every_bundled_scenario_loads_again_from_its_stored_texts_with_the_same_checksum() {
    let loaded = Registry::load(&[crate::bundled_dir()]).unwrap();
    assert!(!loaded.registry.is_empty());
    // Nothing on disk is read: the stored texts are loaded over a directory that is empty.
    let empty = TempDir::new("texts-empty");
    for scenario in loaded.registry.scenarios() {
        let again = Registry::load_texts(&scenario.file, empty.path(), &scenario.texts)
            .unwrap_or_else(|e| panic!("{}: {e}", scenario.id));
        assert_eq!(again.checksum, scenario.checksum, "{}", scenario.id);
        assert_eq!(again.texts, scenario.texts, "{}", scenario.id);
    }
}

#[test]
fn stored_texts_are_checked_like_files_and_name_what_is_missing() {
    let dir = dir_with_base("texts-checked");
    let loaded = Registry::load(&[dir.path()]).unwrap();
    let qa = loaded.registry.get("qa").unwrap();
    assert_eq!(qa.texts.files.keys().collect::<Vec<_>>(), ["prompts/answer.j2"]);
    // The directory changes; the stored texts do not.
    dir.write("prompts/answer.j2", "Changed: {{ input }}");
    let again = Registry::load_texts("qa (stored)", dir.path(), &qa.texts).unwrap();
    assert_eq!(again.checksum, qa.checksum);

    let mut missing = (*qa.texts).clone();
    missing.files.clear();
    let err = Registry::load_texts("qa (stored)", dir.path(), &missing).unwrap_err();
    assert!(
        err.to_string().contains("`prompts/answer.j2` is not among the scenario's stored texts"),
        "{err}"
    );

    let mut broken = (*qa.texts).clone();
    broken.files.insert("prompts/answer.j2".to_owned(), "{{ nope }}".to_owned());
    let err = Registry::load_texts("qa (stored)", dir.path(), &broken).unwrap_err();
    assert!(err.to_string().contains("`nope`"), "{err}");
}
