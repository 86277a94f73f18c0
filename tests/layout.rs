//! Rules of the source tree that the compiler does not check.
//!
//! - Every task a node runs has an owner that waits for it at the stop: the
//!   supervisor (`src/supervise.rs`), a tracker it hands out, or a task's own
//!   `JoinSet`/`TaskTracker`. A bare `tokio::spawn` outside tests starts a
//!   task nobody waits for, which is how a dead batcher once left a node
//!   that looked alive.
//! - The peer network does not know how proposing works: it carries a
//!   forwarded batch to `crate::propose` through the `Forwarded` trait.

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
        if file.ends_with("src/supervise.rs") {
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
