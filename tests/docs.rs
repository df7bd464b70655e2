//! Docs that cannot drift: every source file is named in ARCHITECTURE.md's "Layout"; every
//! repository path, `rtrain` command and relative link the docs name exists; every subcommand and
//! long flag is in docs/reference/cli.md; every page under docs/ is in docs/SUMMARY.md; and every
//! configuration key is documented in `configs/default.toml` (set, or shown commented out when it
//! has no default value).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use clap::CommandFactory;

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

/// ARCHITECTURE.md's Layout block as (entry, its text): an entry starts with a path at four spaces'
/// indent (`    src/data/ ...`) and goes on over the deeper-indented lines after it.
fn layout_entries(readme: &str) -> Vec<(String, String)> {
    let section = readme.split("\n## Layout").nth(1).expect("ARCHITECTURE.md has a '## Layout' section");
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
fn every_source_file_is_named_in_the_architecture_layout() {
    let repo = common::repo();
    let architecture = std::fs::read_to_string(repo.join("ARCHITECTURE.md")).unwrap();
    let entries = layout_entries(&architecture);
    assert!(entries.len() > 10, "ARCHITECTURE.md's Layout block was not found: {entries:?}");
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
    assert!(missing.is_empty(), "ARCHITECTURE.md's Layout does not name these source files: {missing:?}");
    // And nothing it names is gone.
    let stale: Vec<&String> = entries
        .iter()
        .map(|(path, _)| path)
        .filter(|path| path.starts_with("src/") && !repo.join(path).exists())
        .collect();
    assert!(stale.is_empty(), "ARCHITECTURE.md's Layout names paths that do not exist: {stale:?}");
    // Nor does a directory's entry name a file that is elsewhere (`precision.rs` under train/).
    let misplaced: Vec<String> = entries
        .iter()
        .filter(|(path, _)| path.starts_with("src/") && path.ends_with('/'))
        .flat_map(|(path, text)| file_names(text).into_iter().map(move |name| format!("{path}{name}")))
        .filter(|file| !repo.join(file).exists())
        .collect();
    assert!(
        misplaced.is_empty(),
        "ARCHITECTURE.md's Layout places these files where they are not: {misplaced:?}"
    );
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

/// The documentation, as (path from the repository root, text): README.md, ARCHITECTURE.md,
/// CONTRIBUTING.md and every Markdown page under docs/.
fn doc_pages() -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let repo = common::repo();
    let mut paths: Vec<PathBuf> =
        ["README.md", "ARCHITECTURE.md", "CONTRIBUTING.md"].iter().map(|p| repo.join(p)).collect();
    walk(&repo.join("docs"), &mut paths);
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            (path.strip_prefix(&repo).unwrap().to_path_buf(), text)
        })
        .collect()
}

/// A page split into its prose (code blocks and inline code left out, each replaced by a space)
/// and its code (fenced and indented blocks, and the text of inline code spans, one per line).
fn prose_and_code(text: &str) -> (String, String) {
    let mut prose = String::new();
    let mut code = String::new();
    let mut fenced = false;
    let mut in_block = false;
    let mut previous_blank = true;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            prose.push('\n');
            continue;
        }
        let indented = line.starts_with("    ") || line.starts_with('\t');
        in_block = !line.trim().is_empty() && indented && (previous_blank || in_block);
        if fenced || in_block {
            code.push_str(line);
            code.push('\n');
            prose.push('\n');
        } else {
            prose.push_str(line);
            prose.push('\n');
        }
        previous_blank = line.trim().is_empty();
    }
    // Inline code spans (they may cross a line break).
    let mut outside = String::new();
    let mut parts = prose.split('`');
    outside.push_str(parts.next().unwrap_or(""));
    let mut inside = true;
    for part in parts {
        if inside {
            code.push_str(&part.replace('\n', " "));
            code.push('\n');
            outside.push(' ');
        } else {
            outside.push_str(part);
        }
        inside = !inside;
    }
    (outside, code)
}

/// The repository paths a text names: words that start with `src/`, `scripts/`, `configs/`,
/// `tests/`, `bench/` or `examples/` (not inside a longer path such as `/opt/rtrain/configs/`),
/// up to the first character that cannot be in a path, without a trailing `.`.
fn repository_paths(text: &str) -> BTreeSet<String> {
    const ROOTS: &[&str] = &["src/", "scripts/", "configs/", "tests/", "bench/", "examples/"];
    let in_path = |c: char| c.is_ascii_alphanumeric() || "_-./".contains(c);
    let mut found = BTreeSet::new();
    for (at, _) in text.char_indices() {
        let before = text[..at].chars().next_back();
        if before.is_some_and(|c| in_path(c) || c == '$')
            || !ROOTS.iter().any(|root| text[at..].starts_with(root))
        {
            continue;
        }
        let end = text[at..].find(|c: char| !in_path(c)).map_or(text.len(), |n| at + n);
        found.insert(text[at..end].trim_end_matches('.').to_string());
    }
    found
}

#[test]
fn every_repository_path_the_docs_name_exists() {
    let repo = common::repo();
    let mut named = 0;
    let mut missing = Vec::new();
    for (page, text) in doc_pages() {
        for path in repository_paths(&text) {
            named += 1;
            if !repo.join(&path).exists() {
                missing.push(format!("{}: {path}", page.display()));
            }
        }
    }
    assert!(named > 50, "only {named} repository paths found in the docs");
    assert!(missing.is_empty(), "the docs name paths that do not exist:\n{}", missing.join("\n"));
}

/// Each command's path (`data import-idx`) with its subcommands' names and its long flags.
type CommandTree = BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)>;

/// rtrain's command tree, walked from clap's own description of it; the empty path is the top
/// level (the global flags).
fn command_tree() -> CommandTree {
    fn walk(path: &str, command: &clap::Command, out: &mut CommandTree) {
        let subcommands: BTreeSet<String> = command
            .get_subcommands()
            .filter(|c| !c.is_hide_set())
            .map(|c| c.get_name().to_string())
            .collect();
        let flags: BTreeSet<String> = command
            .get_arguments()
            .filter(|a| !a.is_hide_set() && (path.is_empty() || !a.is_global_set()))
            .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
            .collect();
        out.insert(path.to_string(), (subcommands, flags));
        for sub in command.get_subcommands().filter(|c| !c.is_hide_set()) {
            let sub_path = if path.is_empty() {
                sub.get_name().to_string()
            } else {
                format!("{path} {}", sub.get_name())
            };
            walk(&sub_path, sub, out);
        }
    }
    let mut tree = BTreeMap::new();
    walk("", &rtrain::cli::Cli::command(), &mut tree);
    tree
}

/// The words after each `rtrain ` in a text (up to 2, those that look like subcommand names).
fn rtrain_invocations(code: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    for (at, _) in code.match_indices("rtrain ") {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || "_-./$".contains(c)) {
            continue;
        }
        let words: Vec<String> = code[at + "rtrain ".len()..]
            .lines()
            .next()
            .unwrap_or("")
            .split(' ')
            .take(2)
            .take_while(|w| {
                !w.is_empty() && w.chars().all(|c| c.is_ascii_lowercase() || c == '-') && !w.starts_with('-')
            })
            .map(str::to_string)
            .collect();
        found.push(words);
    }
    found
}

#[test]
fn every_rtrain_command_the_docs_name_exists() {
    let tree = command_tree();
    let mut checked = 0;
    let mut unknown = Vec::new();
    for (page, text) in doc_pages() {
        let (_, code) = prose_and_code(&text);
        for words in rtrain_invocations(&code) {
            let Some(first) = words.first() else { continue };
            checked += 1;
            let (top, _) = &tree[""];
            if !top.contains(first) {
                unknown.push(format!("{}: rtrain {first}", page.display()));
                continue;
            }
            let (subcommands, _) = &tree[first.as_str()];
            if let Some(second) =
                words.get(1).filter(|w| !subcommands.is_empty() && !subcommands.contains(*w))
            {
                unknown.push(format!("{}: rtrain {first} {second}", page.display()));
            }
        }
    }
    assert!(checked > 50, "only {checked} rtrain commands found in the docs' code");
    assert!(unknown.is_empty(), "the docs name rtrain commands that do not exist:\n{}", unknown.join("\n"));
}

/// The headings of a Markdown text outside fenced code (an indented line is never one), as
/// (level, text without its inline code marks, line index).
fn headings(text: &str) -> Vec<(usize, String, usize)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        let level = line.chars().take_while(|&c| c == '#').count();
        if !fenced && level > 0 && line[level..].starts_with(' ') {
            out.push((level, line[level..].replace('`', "").trim().to_string(), index));
        }
    }
    out
}

/// Each section of a Markdown text by its heading, up to the next heading.
fn sections(text: &str) -> BTreeMap<String, String> {
    let lines: Vec<&str> = text.lines().collect();
    let found = headings(text);
    let mut out = BTreeMap::new();
    for (i, (_, heading, start)) in found.iter().enumerate() {
        let end = found.get(i + 1).map_or(lines.len(), |(_, _, next)| *next);
        out.insert(heading.clone(), lines[start + 1..end].join("\n"));
    }
    out
}

/// Whether `flag` occurs in `text` as a whole flag (`--top` not in `--top-k`).
fn names_flag(text: &str, flag: &str) -> bool {
    text.match_indices(flag).any(|(at, _)| {
        !text[at + flag.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    })
}

#[test]
fn every_subcommand_and_long_flag_is_in_the_cli_reference() {
    let text = common::doc("docs/reference/cli.md");
    let sections = sections(&text);
    let mut missing = Vec::new();
    let tree = command_tree();
    assert!(tree.len() > 20 && tree.contains_key("data import-idx"), "{:?}", tree.keys());
    for (path, (subcommands, flags)) in &tree {
        let heading = if path.is_empty() { "Global flags".to_string() } else { format!("rtrain {path}") };
        if !subcommands.is_empty() && flags.is_empty() {
            // A group (`rtrain data`): its commands have sections of their own.
            continue;
        }
        let Some(body) = sections.get(&heading) else {
            missing.push(format!("a section headed `{heading}`"));
            continue;
        };
        for flag in flags {
            if !names_flag(body, flag) {
                missing.push(format!("{flag} in `{heading}`"));
            }
        }
    }
    assert!(missing.is_empty(), "docs/reference/cli.md lacks:\n{}", missing.join("\n"));
}

/// GitHub's anchor for a heading: lowercase, punctuation other than `-` and `_` dropped, spaces
/// to `-`.
fn slug(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter(|&c| c.is_alphanumeric() || c == ' ' || c == '-' || c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings, a repeated one numbered as GitHub numbers it
/// (`name`, `name-1`, ...).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (_, heading, _) in headings(text) {
        let base = slug(&heading);
        let mut anchor = base.clone();
        let mut n = 0;
        while out.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        out.insert(anchor);
    }
    out
}

/// The targets of the inline links `[text](target)` of some prose.
fn link_targets(prose: &str) -> Vec<String> {
    prose
        .match_indices("](")
        .filter_map(|(at, _)| {
            let rest = &prose[at + 2..];
            let end = rest.find(')')?;
            Some(rest[..end].split_whitespace().next().unwrap_or("").to_string())
        })
        .collect()
}

/// `path` with its `.` and `..` components resolved (the files need not exist).
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let repo = common::repo();
    let mut checked = 0;
    let mut broken = Vec::new();
    for (page, text) in doc_pages() {
        let (prose, _) = prose_and_code(&text);
        for target in link_targets(&prose) {
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (file, anchor) =
                target.split_once('#').map_or((target.as_str(), None), |(f, a)| (f, Some(a)));
            let resolved =
                if file.is_empty() { page.clone() } else { normalise(&page.parent().unwrap().join(file)) };
            let shown = format!("{}: ({target})", page.display());
            if !repo.join(&resolved).exists() {
                broken.push(format!("{shown}: no {}", resolved.display()));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            let Ok(target_text) = std::fs::read_to_string(repo.join(&resolved)) else {
                broken.push(format!("{shown}: an anchor into {}, which is no file", resolved.display()));
                continue;
            };
            if !anchors(&target_text).contains(anchor) {
                broken
                    .push(format!("{shown}: no heading of {} has the anchor #{anchor}", resolved.display()));
            }
        }
    }
    assert!(checked > 50, "only {checked} relative links found in the docs");
    assert!(broken.is_empty(), "broken links in the docs:\n{}", broken.join("\n"));
}

#[test]
fn every_page_under_docs_is_in_the_summary() {
    let summary = common::doc("docs/SUMMARY.md");
    let (prose, _) = prose_and_code(&summary);
    let listed: BTreeSet<PathBuf> = link_targets(&prose)
        .iter()
        .filter(|t| !t.is_empty())
        .map(|t| normalise(&Path::new("docs").join(t)))
        .collect();
    let pages: Vec<PathBuf> = doc_pages()
        .into_iter()
        .map(|(page, _)| page)
        .filter(|page| page.starts_with("docs") && *page != Path::new("docs/SUMMARY.md"))
        .collect();
    assert!(pages.len() > 10, "{pages:?}");
    let unlisted: Vec<String> =
        pages.iter().filter(|page| !listed.contains(*page)).map(|page| page.display().to_string()).collect();
    assert!(unlisted.is_empty(), "docs/SUMMARY.md does not list these pages: {unlisted:?}");
}
