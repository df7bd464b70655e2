//! The source files' `use` graph has no cycles: each file's `crate::` and `super::` paths are
//! resolved to the file that defines the module they name, and a cycle among files fails the
//! test naming it. (`mod` declarations are not dependencies; a parent declaring its children is
//! how modules nest.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// `src/a/b.rs` or `src/a/b/mod.rs` -> ["a", "b"]; `src/lib.rs` -> [].
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        parts.pop();
    }
    parts
}

/// The `crate::`/`super::` paths a file names outside comments, as module paths from the crate
/// root (`use crate::a::{b, c::D}` names `a::b` and `a::c::D`).
fn referenced_paths(text: &str, module: &[String]) -> Vec<Vec<String>> {
    let code: String =
        text.lines().filter(|line| !line.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
    let mut found = Vec::new();
    for (start, prefix) in code
        .match_indices("crate::")
        .map(|(i, _)| (i, "crate"))
        .chain(code.match_indices("super::").map(|(i, _)| (i, "super")))
    {
        if start > 0 && code[..start].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let rest = &code[start + prefix.len() + 2..];
        let mut base: Vec<String> = match prefix {
            "crate" => Vec::new(),
            // The parent module (for `a/b.rs` and for `a/b/mod.rs` alike, module a::b's is a).
            _ => module[..module.len().saturating_sub(1)].to_vec(),
        };
        expand(rest, &mut base, &mut found);
    }
    found
}

/// Expands one path, with `{...}` groups, into full paths.
fn expand(rest: &str, base: &mut Vec<String>, found: &mut Vec<Vec<String>>) {
    let mut segment = String::new();
    let mut chars = rest.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c.is_alphanumeric() || c == '_' {
            segment.push(c);
        } else if c == ':' && chars.peek().map(|&(_, c)| c) == Some(':') {
            chars.next();
            base.push(std::mem::take(&mut segment));
        } else if c == '{' {
            let _ = i;
            // Split the group at top-level commas and expand each member.
            let mut depth = 1;
            let mut member = String::new();
            for (_, c) in chars.by_ref() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                if depth == 0 || (depth == 1 && c == ',') {
                    let mut inner = base.clone();
                    expand(member.trim(), &mut inner, found);
                    member.clear();
                    if depth == 0 {
                        break;
                    }
                } else {
                    member.push(c);
                }
            }
            return;
        } else {
            break;
        }
    }
    if !segment.is_empty() && segment != "self" {
        base.push(segment);
    }
    found.push(base.clone());
}

/// Edges between source files (as module paths), from their `use` lines and paths.
fn file_edges() -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    let modules: BTreeMap<Vec<String>, PathBuf> =
        files.iter().map(|f| (module_of(&src, f), f.clone())).collect();
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for file in &files {
        let module = module_of(&src, file);
        if module.is_empty() || module == ["main"] {
            continue; // the crate root and the binary only declare and dispatch
        }
        let text = std::fs::read_to_string(file).unwrap();
        // Test modules may reach anywhere.
        let text = text.split("#[cfg(test)]").next().unwrap_or_default();
        for path in referenced_paths(text, &module) {
            // The longest prefix that is a module file.
            let target = (1..=path.len()).rev().map(|n| path[..n].to_vec()).find(|p| modules.contains_key(p));
            // A module using its own submodules is how it is built from them, not a cycle.
            if let Some(target) = target.filter(|t| !t.starts_with(&module)) {
                edges.entry(module.clone()).or_default().insert(target);
            }
        }
    }
    edges
}

fn assert_acyclic(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>, what: &str) {
    let cycles = find_cycles(edges);
    let named: Vec<String> =
        cycles.iter().map(|c| c.iter().map(|m| m.join("::")).collect::<Vec<_>>().join(", ")).collect();
    assert!(
        named.is_empty(),
        "cycles among {what} (each line: modules that depend on each other):\n{}",
        named.join("\n")
    );
}

#[test]
fn source_files_form_no_cycle() {
    let edges = file_edges();
    // The test can fail: the graph it checks is not empty.
    assert!(edges.values().map(BTreeSet::len).sum::<usize>() > 50, "{edges:?}");
    assert_acyclic(&edges, "source files");
}

/// The top-level modules (cluster, data, model, train, run_dir, ...) are layers: none depends
/// on one that depends on it.
#[test]
fn top_level_modules_form_no_cycle() {
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (from, targets) in file_edges() {
        for target in targets {
            if from[0] != target[0] {
                edges.entry(vec![from[0].clone()]).or_default().insert(vec![target[0].clone()]);
            }
        }
    }
    assert!(edges.len() > 8, "{edges:?}");
    assert_acyclic(&edges, "top-level modules");
}

/// Top-level modules that may use `crate::ingest` besides `ingest` itself: the command line,
/// which dispatches `rtrain data` and generates the default data on first use.
const INGEST_USERS: [&str; 1] = ["cli"];

/// Each use of `crate::ingest` from outside it and the command line, as `file -> module`.
fn ingest_used_outside(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<String> {
    edges
        .iter()
        .filter(|(from, _)| from[0] != "ingest" && !INGEST_USERS.contains(&from[0].as_str()))
        .flat_map(|(from, targets)| {
            targets
                .iter()
                .filter(|t| t[0] == "ingest")
                .map(move |t| format!("{} -> {}", from.join("::"), t.join("::")))
        })
        .collect()
}

/// The offline dataset tools (`ingest`: synth, IDX import, the shard writer) stay apart from
/// the training input path: `data` holds what the loader needs and never calls them, and
/// nothing else does but the command line. (Test modules, as above, may reach anywhere.)
#[test]
fn only_the_command_line_uses_ingest() {
    let edges = file_edges();
    // The test can fail: the command line does use ingest.
    assert!(
        edges.iter().any(|(from, to)| from[0] == "cli" && to.iter().any(|t| t[0] == "ingest")),
        "{edges:?}"
    );
    let outside = ingest_used_outside(&edges);
    assert!(
        outside.is_empty(),
        "only ingest itself and {INGEST_USERS:?} may use crate::ingest (the training path must not \
         depend on the offline tools; move shared code to data or util):\n{}",
        outside.join("\n")
    );
}

/// Every strongly connected component with more than one file (Tarjan's algorithm).
fn find_cycles(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<Vec<String>>> {
    struct State<'a> {
        edges: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<Vec<String>, usize>,
        low: BTreeMap<Vec<String>, usize>,
        stack: Vec<Vec<String>>,
        on_stack: BTreeSet<Vec<String>>,
        found: Vec<Vec<Vec<String>>>,
    }
    fn visit(state: &mut State<'_>, node: &Vec<String>) {
        let n = state.index.len();
        state.index.insert(node.clone(), n);
        state.low.insert(node.clone(), n);
        state.stack.push(node.clone());
        state.on_stack.insert(node.clone());
        for next in state.edges.get(node).into_iter().flatten() {
            if !state.index.contains_key(next) {
                visit(state, next);
                let low = state.low[node].min(state.low[next]);
                state.low.insert(node.clone(), low);
            } else if state.on_stack.contains(next) {
                let low = state.low[node].min(state.index[next]);
                state.low.insert(node.clone(), low);
            }
        }
        if state.low[node] == state.index[node] {
            let mut component = Vec::new();
            while let Some(top) = state.stack.pop() {
                state.on_stack.remove(&top);
                let done = &top == node;
                component.push(top);
                if done {
                    break;
                }
            }
            if component.len() > 1 {
                state.found.push(component);
            }
        }
    }
    let mut state = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for node in edges.keys() {
        if !state.index.contains_key(node) {
            visit(&mut state, node);
        }
    }
    state.found
}

#[test]
fn a_cycle_is_found() {
    let module = |s: &str| s.split("::").map(str::to_string).collect::<Vec<_>>();
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    edges.entry(module("a")).or_default().insert(module("b::c"));
    edges.entry(module("b::c")).or_default().insert(module("a"));
    edges.entry(module("d")).or_default().insert(module("a"));
    assert_eq!(find_cycles(&edges).len(), 1);
    let paths = referenced_paths("use crate::x::{y, z::W};\nlet v = super::q::r();", &module("m::n"));
    assert!(paths.contains(&module("x::y")) && paths.contains(&module("x::z::W")), "{paths:?}");
    assert!(paths.contains(&module("m::q::r")), "{paths:?}");
    // Ingest's users: the command line and ingest itself pass, data and anyone else fail.
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    edges.entry(module("cli::data")).or_default().insert(module("ingest::synth"));
    edges.entry(module("ingest::idx")).or_default().insert(module("ingest::pool"));
    assert_eq!(ingest_used_outside(&edges), Vec::<String>::new());
    edges.entry(module("data::loader")).or_default().insert(module("ingest::synth"));
    edges.entry(module("cluster::job")).or_default().insert(module("ingest"));
    assert_eq!(ingest_used_outside(&edges), ["cluster::job -> ingest", "data::loader -> ingest::synth"]);
}
