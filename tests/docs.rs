//! Docs that cannot drift: every source file is named in README's "Layout", and every
//! configuration key is documented in `configs/default.toml` (set, or shown commented out when
//! it has no default value).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::common;

/// Every `.rs` file under `dir`, as paths relative to the repository root.
fn rust_files(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(root, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path.strip_prefix(root).unwrap().to_path_buf());
        }
    }
}

/// README's Layout block as (entry, its text): an entry starts with a path at four spaces'
/// indent (`    src/data/ ...`) and goes on over the deeper-indented lines after it.
fn layout_entries(readme: &str) -> Vec<(String, String)> {
    let section = readme.split("\n## Layout").nth(1).expect("README has a '## Layout' section");
    let section = section.split("\n## ").next().unwrap();
    let mut entries: Vec<(String, String)> = Vec::new();
    for line in section.lines() {
        let Some(rest) = line.strip_prefix("    ") else { continue };
        if rest.starts_with(' ') {
            if let Some((_, text)) = entries.last_mut() {
                text.push(' ');
                text.push_str(rest.trim());
            }
        } else if let Some((path, text)) = rest.split_once(char::is_whitespace) {
            entries.push((path.to_string(), text.trim().to_string()));
        } else {
            entries.push((rest.to_string(), String::new()));
        }
    }
    entries
}

#[test]
fn every_source_file_is_named_in_the_readme_layout() {
    let repo = common::repo();
    let readme = std::fs::read_to_string(repo.join("README.md")).unwrap();
    let entries = layout_entries(&readme);
    assert!(entries.len() > 10, "README's Layout block was not found: {entries:?}");
    let mut files = Vec::new();
    rust_files(&repo, &repo.join("src"), &mut files);
    let mut missing = Vec::new();
    for file in &files {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let dir = format!("{}/", file.parent().unwrap().display());
        let named = entries.iter().any(|(path, text)| {
            // `src/plan.rs  ...` names a top-level file; `src/data/  ... loader.rs ...` one in a
            // directory, whose mod.rs the directory's entry stands for.
            *path == file.display().to_string()
                || (*path == dir && (name == "mod.rs" || text.contains(&name)))
        });
        if !named {
            missing.push(file.display().to_string());
        }
    }
    assert!(missing.is_empty(), "README's Layout does not name these source files: {missing:?}");
    // And nothing it names is gone.
    let stale: Vec<&String> = entries
        .iter()
        .map(|(path, _)| path)
        .filter(|path| path.starts_with("src/") && !repo.join(path).exists())
        .collect();
    assert!(stale.is_empty(), "README's Layout names paths that do not exist: {stale:?}");
    // Nor does a directory's entry name a file that is elsewhere (`precision.rs` under train/).
    let misplaced: Vec<String> = entries
        .iter()
        .filter(|(path, _)| path.starts_with("src/") && path.ends_with('/'))
        .flat_map(|(path, text)| file_names(text).into_iter().map(move |name| format!("{path}{name}")))
        .filter(|file| !repo.join(file).exists())
        .collect();
    assert!(misplaced.is_empty(), "README's Layout places these files where they are not: {misplaced:?}");
}

/// The bare `name.rs` words of a text (not those in a longer path such as `src/shim/x.rs`).
fn file_names(text: &str) -> Vec<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '/'))
        .map(|word| word.trim_end_matches('.'))
        .filter(|word| word.ends_with(".rs") && !word.contains('/'))
        .map(str::to_string)
        .collect()
}

/// Dotted paths of every leaf of a JSON object (`train.epochs`); arrays are leaves.
fn leaves(value: &serde_json::Value, prefix: &str, out: &mut BTreeSet<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, inner) in map {
                let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
                leaves(inner, &path, out);
            }
        }
        _ => {
            out.insert(prefix.to_string());
        }
    }
}

/// The keys `configs/default.toml` documents: `section.key` for each `key = ...` line, and for
/// each commented-out `# key = ...` line, under its `[section]`.
fn documented_keys(text: &str) -> BTreeSet<String> {
    let mut section = String::new();
    let mut keys = BTreeSet::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_string();
            continue;
        }
        let assignment = line.strip_prefix('#').map_or(line, str::trim_start);
        let Some((key, _)) = assignment.split_once('=') else { continue };
        let key = key.trim();
        if !section.is_empty()
            && !key.is_empty()
            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            keys.insert(format!("{section}.{key}"));
        }
    }
    keys
}

#[test]
fn every_configuration_key_is_documented_in_default_toml() {
    let config = serde_json::to_value(rtrain::config::Config::default()).unwrap();
    let mut keys = BTreeSet::new();
    leaves(&config, "", &mut keys);
    assert!(keys.len() > 40 && keys.contains("train.epochs"), "{keys:?}");
    let text = std::fs::read_to_string(common::repo().join("configs/default.toml")).unwrap();
    let documented = documented_keys(&text);
    let missing: Vec<&String> = keys.difference(&documented).collect();
    assert!(missing.is_empty(), "configs/default.toml does not document these keys: {missing:?}");
    // The file itself loads as a configuration equal to the built-in defaults.
    let loaded: rtrain::config::Config = toml::from_str(&text).unwrap();
    assert_eq!(loaded, rtrain::config::Config::default(), "configs/default.toml differs from the defaults");
}
