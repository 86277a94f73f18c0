//! Rules of the source tree that the compiler does not check.
//!
//! - Every task a node runs has an owner that waits for it at the stop: the
//!   supervisor (`src/node/supervise.rs`), a tracker it hands out, or a task's own
//!   `JoinSet`/`TaskTracker`. A bare `tokio::spawn` outside tests starts a
//!   task nobody waits for, which is how a dead batcher once left a node
//!   that looked alive.
//! - The peer network does not know how proposing works: it carries a
//!   forwarded batch to `crate::propose` through the `Forwarded` trait.
//! - Errors are typed between stages: no product function returns
//!   `Result<_, String>`, and no decision is taken by matching an error's
//!   text (a policy that matched "refused" in a message broke the day a
//!   library reworded it). Detail from another crate may travel as text
//!   inside a variant; the variant is what callers match.
//! - One mutex-poisoning policy in every crate: locks go through
//!   `firstseen_store::lock::lock` (which says why), never `.lock()` with
//!   `unwrap`, `expect`, `ok()` or `if let Ok`.
//! - A stage's `config.rs` holds its section's types, defaults and the
//!   checks on the values alone: it reads no file and imports nothing from
//!   `crate::config` but the `problem` leaf, so the aggregate can depend on
//!   the stages without the stages depending back on it.

use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The file's code before its unit tests, without comments.
fn product_code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let code = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => &text,
    };
    code.lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

fn crate_sources() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src", "store/src", "raft/src"] {
        sources(&root.join(dir), &mut files);
    }
    assert!(files.len() > 20, "found only {} source files", files.len());
    files
}

#[test]
fn no_task_is_spawned_outside_an_owner() {
    let mut bare = Vec::new();
    for file in crate_sources() {
        if file.ends_with("src/node/supervise.rs") {
            continue;
        }
        for (n, line) in product_code(&file).lines().enumerate() {
            if line.contains("tokio::spawn(") || line.contains("tokio::task::spawn(") {
                bare.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        bare.is_empty(),
        "tasks spawned without an owner (use the supervisor or its tracker):\n{}",
        bare.join("\n")
    );
}

/// The node runs every long-running task as part of a layer of the stop order
/// (`src/node/order.rs`), which owns the one supervisor: a task spawned
/// on a supervisor of its own would be stopped in no order.
#[test]
fn only_the_stage_list_makes_a_supervisor() {
    let mut found = Vec::new();
    for file in crate_sources() {
        if file.ends_with("src/node/order.rs") || file.ends_with("src/node/supervise.rs") {
            continue;
        }
        if product_code(&file).contains("Supervisor::new") {
            found.push(file.display().to_string());
        }
    }
    assert!(
        found.is_empty(),
        "a supervisor outside the stage list: {found:?}"
    );
}

#[test]
fn the_peer_network_does_not_import_the_proposer() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    sources(&root.join("src/cluster"), &mut files);
    let offenders: Vec<String> = files
        .iter()
        .filter(|f| {
            let code = product_code(f);
            code.contains("crate::propose") || code.contains("Proposer")
        })
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        offenders.is_empty(),
        "network code that knows the proposer: {offenders:?}"
    );
}

/// Files that only tests compile (`#[cfg(test)] mod x;`), by file name.
fn test_only(file: &Path) -> bool {
    let Some(stem) = file.file_stem().and_then(|s| s.to_str()) else {
        return false;
    };
    let Some(dir) = file.parent() else {
        return false;
    };
    ["mod.rs", "lib.rs"].iter().any(|m| {
        std::fs::read_to_string(dir.join(m))
            .is_ok_and(|t| t.contains(&format!("#[cfg(test)]\nmod {stem};")))
    })
}

#[test]
fn no_product_function_returns_a_string_error() {
    let mut found = Vec::new();
    for file in crate_sources() {
        if test_only(&file) {
            continue;
        }
        // Declarations may span lines: look at the code as one line.
        let code = product_code(&file)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        for (at, _) in code.match_indices("Result<") {
            // The type up to its closing `>`, nested generics included.
            let mut depth = 0;
            let mut end = at;
            for (i, c) in code[at..].char_indices() {
                match c {
                    '<' => depth += 1,
                    '>' => {
                        depth -= 1;
                        if depth == 0 {
                            end = at + i;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let ty = &code[at..=end];
            if ty.ends_with(", String>") || ty.ends_with(",String>") {
                found.push(format!("{}: {ty}", file.display()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "functions with a String for an error (give them an error enum):\n{}",
        found.join("\n")
    );
}

#[test]
fn no_decision_matches_error_text() {
    // What a policy that reads an error's text looks like: the message,
    // possibly lower-cased, searched for a word.
    let patterns = [
        "to_string().contains(",
        "to_lowercase().contains(",
        "to_string().starts_with(",
        "e.contains(\"",
        "err.contains(\"",
        "error.contains(\"",
        "why.contains(\"",
        "reason.contains(\"",
        "message.contains(\"",
    ];
    let mut found = Vec::new();
    for file in crate_sources() {
        if test_only(&file) {
            continue;
        }
        for (n, line) in product_code(&file).lines().enumerate() {
            if patterns.iter().any(|p| line.contains(p)) {
                found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "decisions taken on an error's text (match a variant instead):\n{}",
        found.join("\n")
    );
}

#[test]
fn each_crate_tour_names_every_module() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut missing = Vec::new();
    for lib in ["src/lib.rs", "store/src/lib.rs", "raft/src/lib.rs"] {
        let text = std::fs::read_to_string(root.join(lib)).unwrap();
        let tour: String = text
            .lines()
            .filter(|l| l.starts_with("//!"))
            .collect::<Vec<_>>()
            .join("\n");
        for line in text.lines() {
            let Some(name) = line
                .strip_prefix("pub mod ")
                .and_then(|r| r.strip_suffix(';'))
            else {
                continue;
            };
            if !tour.contains(&format!("[`{name}`]")) {
                missing.push(format!("{lib}: {name}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "modules the crate's //! tour does not name:\n{}",
        missing.join("\n")
    );
}

#[test]
fn stage_configs_read_no_file_and_do_not_import_the_aggregate() {
    let mut found = 0;
    for file in crate_sources() {
        if file.file_name().is_none_or(|n| n != "config.rs") || file.ends_with("src/config.rs") {
            continue;
        }
        found += 1;
        let code = product_code(&file);
        for line in code.lines() {
            let imports_aggregate =
                line.contains("crate::config::") && !line.contains("crate::problem::");
            assert!(
                !imports_aggregate,
                "{}: imports the config aggregate: {line}",
                file.display()
            );
            assert!(
                !line.contains("std::fs::") && !line.contains("tokio::fs::"),
                "{}: reads a file: {line}",
                file.display()
            );
        }
    }
    assert!(found >= 5, "only {found} stage config files found");
}

#[test]
fn every_lock_follows_the_one_poisoning_policy() {
    let mut offenders = Vec::new();
    for file in crate_sources() {
        if file.ends_with("store/src/lock.rs") {
            continue;
        }
        let code = product_code(&file).replace(char::is_whitespace, "");
        for bad in [
            ".lock().unwrap(",
            ".lock().expect(",
            ".lock().ok()",
            ".lock().map(",
        ] {
            if code.contains(bad) {
                offenders.push(format!("{}: {bad}", file.display()));
            }
        }
        if code.contains("Ok(mut") && code.contains(".lock(){") {
            offenders.push(format!("{}: if let Ok(..) = ….lock()", file.display()));
        }
    }
    assert!(offenders.is_empty(), "{offenders:#?}");
}

/// The modules of one crate (`dir` its `src`), by path (`cluster::wire`),
/// each with the product code of its file.
fn modules(dir: &Path) -> Vec<(String, String)> {
    let mut files = Vec::new();
    sources(dir, &mut files);
    files
        .iter()
        .filter(|f| !f.ends_with("main.rs"))
        .map(|f| {
            let rel = f.strip_prefix(dir).unwrap().with_extension("");
            let mut parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
                parts.pop();
            }
            (parts.join("::"), product_code(f))
        })
        .collect()
}

/// The module a path names: the longest prefix of it that is a module.
fn module_of<'a>(path: &[&str], known: &'a [(String, String)]) -> Option<&'a str> {
    (1..=path.len()).rev().find_map(|n| {
        let name = path[..n].join("::");
        known
            .iter()
            .find(|(m, _)| *m == name)
            .map(|(m, _)| m.as_str())
    })
}

/// What module `at` uses, by the paths in its code that start at the crate
/// (`crate::a::b`, `crate::a::{b, c}`) or at its parent (`super::b`).
fn uses(at: &str, code: &str, known: &[(String, String)]) -> Vec<String> {
    let code: String = code.split_whitespace().collect::<Vec<_>>().join(" ");
    let parent: Vec<&str> = at.split("::").filter(|s| !s.is_empty()).collect();
    let parent = &parent[..parent.len().saturating_sub(1)];
    let mut out = Vec::new();
    for (prefix, base) in [("crate::", Vec::new()), ("super::", parent.to_vec())] {
        for (i, _) in code.match_indices(prefix) {
            // Not the tail of a longer name (`my_crate::`), nor the second
            // `super` of a chain (the chain is read from its first).
            if code[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let mut rest = &code[i + prefix.len()..];
            let mut base = base.clone();
            // `super::super::x` is x in the grandparent: each further
            // `super` goes one module up (missed before: the ingest adapter
            // reached the aggregate config as `super::super::config`).
            if prefix == "super::" {
                while let Some(r) = rest.strip_prefix("super::") {
                    base.pop();
                    rest = r;
                }
            }
            let head: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            let mut path: Vec<&str> = base.clone();
            path.extend(head.split("::").filter(|s| !s.is_empty()));
            let group = rest[head.len()..]
                .strip_prefix('{')
                .and_then(|g| g.split('}').next());
            let mut named = vec![path.clone()];
            if let Some(group) = group {
                for item in group.split(',') {
                    let item = item.split(" as ").next().unwrap_or_default().trim();
                    let mut p = path.clone();
                    p.extend(item.split("::").filter(|s| !s.is_empty() && *s != "self"));
                    named.push(p);
                }
            }
            for p in named {
                if let Some(m) = module_of(&p, known) {
                    // The crate root re-exports; an arrow to it is not one
                    // to a module of the pipeline.
                    if m != at && !m.is_empty() {
                        out.push(m.to_string());
                    }
                }
            }
        }
    }
    out
}

/// No circle between the modules of a crate: a module that uses another
/// (through a `crate::` or `super::` path) is not used back by it, however
/// far round. A parent naming its own children is the tree, not an arrow,
/// and the crate root only re-exports, so neither is counted.
#[test]
fn no_circle_between_modules() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut circles = Vec::new();
    for dir in ["src", "store/src", "raft/src"] {
        let known = modules(&root.join(dir));
        let edges: std::collections::BTreeMap<&str, std::collections::BTreeSet<String>> = known
            .iter()
            .map(|(m, code)| (m.as_str(), uses(m, code, &known).into_iter().collect()))
            .collect();
        // Depth-first from every module; a module met again on the current
        // path closes a circle.
        fn walk<'a>(
            at: &'a str,
            edges: &'a std::collections::BTreeMap<&str, std::collections::BTreeSet<String>>,
            path: &mut Vec<&'a str>,
            done: &mut std::collections::BTreeSet<&'a str>,
            found: &mut Vec<String>,
        ) {
            if let Some(i) = path.iter().position(|m| *m == at) {
                found.push(format!("{} -> {at}", path[i..].join(" -> ")));
                return;
            }
            if !done.insert(at) {
                return;
            }
            path.push(at);
            for next in edges.get(at).into_iter().flatten() {
                walk(next.as_str(), edges, path, done, found);
            }
            path.pop();
        }
        let mut done = std::collections::BTreeSet::new();
        for m in edges.keys() {
            walk(m, &edges, &mut Vec::new(), &mut done, &mut circles);
        }
        assert!(
            edges.values().map(|e| e.len()).sum::<usize>() > 10,
            "{dir}: found almost no arrows between modules; the parsing is broken"
        );
    }
    assert!(
        circles.is_empty(),
        "modules that use each other:\n{}",
        circles.join("\n")
    );
}

/// The folders of the pipeline's stages, each a stage of the data flow.
const STAGES: [&str; 6] = ["ingest", "batch", "propose", "cluster", "publish", "verify"];

/// Arrows between the top folders of the `firstseen` crate (a file at the
/// top is a folder of its own; the crate root is ""), from the module
/// arrows of [`uses`].
fn folder_arrows() -> std::collections::BTreeSet<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let known = modules(&root.join("src"));
    let top = |m: &str| m.split("::").next().unwrap_or_default().to_string();
    let mut arrows = std::collections::BTreeSet::new();
    for (m, code) in &known {
        for used in uses(m, code, &known) {
            let (from, to) = (top(m), top(&used));
            if from != to {
                arrows.insert((from, to));
            }
        }
    }
    // The crate root names its modules without `crate::` (`node::x`).
    let (_, root_code) = known.iter().find(|(m, _)| m.is_empty()).expect("lib.rs");
    let code: String = root_code.split_whitespace().collect::<Vec<_>>().join(" ");
    for (m, _) in known
        .iter()
        .filter(|(m, _)| !m.contains("::") && !m.is_empty())
    {
        let named = format!("{m}::");
        let used = code.match_indices(&named).any(|(i, _)| {
            !code[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':')
        });
        if used {
            arrows.insert((String::new(), m.clone()));
        }
    }
    assert!(arrows.len() > 10, "found almost no arrows between folders");
    arrows
}

/// The folders say the pipeline: each stage builds itself from its own
/// section of the config and reaches back to nothing that depends on it.
/// - No stage folder imports the aggregate config (`config/`): a stage
///   reads its own section, which its own `config.rs` declares.
/// - No two stage folders import each other, however far round.
/// - `tls/` imports no stage (the stages read their TLS settings from it).
/// - The crate root imports no stage and not `node/`.
/// - Neither `config/` nor `http/` imports `node/`, which builds from both.
#[test]
fn no_stage_folder_reaches_back() {
    let arrows = folder_arrows();
    let mut found = Vec::new();
    for (from, to) in &arrows {
        let stage = |f: &str| STAGES.contains(&f);
        if stage(from) && to == "config" {
            found.push(format!("stage {from} imports the aggregate config"));
        }
        if from == "tls" && stage(to) {
            found.push(format!("tls imports stage {to}"));
        }
        if from.is_empty() && (stage(to) || to == "node") {
            found.push(format!("the crate root imports {to}"));
        }
        // The node assembles the config and the HTTP API; neither names
        // the node back (each pair imported the other before).
        if (from == "config" || from == "http") && to == "node" {
            found.push(format!("{from} imports node, which imports {from}"));
        }
    }
    // Circles among the stage folders.
    let stage_arrows: Vec<&(String, String)> = arrows
        .iter()
        .filter(|(a, b)| STAGES.contains(&a.as_str()) && STAGES.contains(&b.as_str()))
        .collect();
    fn reach(from: &str, to: &str, arrows: &[&(String, String)], seen: &mut Vec<String>) -> bool {
        if from == to {
            return true;
        }
        if seen.iter().any(|s| s == from) {
            return false;
        }
        seen.push(from.to_string());
        arrows
            .iter()
            .filter(|(a, _)| a == from)
            .any(|(_, b)| reach(b, to, arrows, seen))
    }
    for (a, b) in &stage_arrows {
        if reach(b, a, &stage_arrows, &mut Vec::new()) {
            found.push(format!(
                "stages {a} and {b} import each other (through {b} -> … -> {a})"
            ));
        }
    }
    assert!(
        found.is_empty(),
        "folders that reach back:\n{}",
        found.join("\n")
    );
}
