//! `firstseen status`: a node's view, as a table, one line, or JSON.

use std::path::PathBuf;
use std::process::ExitCode;

use super::api;
use crate::http::Status;

/// Prints the status of the node at `url`.
pub async fn run(url: String, json: bool, brief: bool, ca_file: Option<PathBuf>) -> ExitCode {
    let endpoint = format!("{}/status", url.trim_end_matches('/'));
    let client = match api::client(ca_file.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: --ca-file: {e}");
            return ExitCode::from(2);
        }
    };
    let body = match client.get(&endpoint).send().await {
        Ok(r) => match r.error_for_status() {
            Ok(r) => r.text().await,
            Err(e) => {
                eprintln!("error: {endpoint}: {e}");
                return ExitCode::from(2);
            }
        },
        Err(e) => {
            eprintln!("error: cannot reach {endpoint}: {e}");
            return ExitCode::from(2);
        }
    };
    let parsed = body
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_str::<Status>(&b).map_err(|e| e.to_string()));
    let s = match parsed {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {endpoint} did not return status JSON: {e}");
            return ExitCode::from(2);
        }
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&s).unwrap_or_default());
        return ExitCode::SUCCESS;
    }
    let t = &s.totals;
    if brief {
        let published: u64 = s.topics.iter().map(|tp| tp.published_seq).sum();
        println!(
            "received {:>7}  duplicates dropped {:>7}  first copies {:>6}  in Pulsar {:>6}  outbox {:>6}  leader {}",
            t.observed,
            t.duplicates,
            t.window_keys,
            published,
            t.outbox_messages,
            or_dash(s.leader)
        );
        return ExitCode::SUCCESS;
    }
    println!(
        "node {} (zone {})  leader {}  term {}  applied {}",
        s.node,
        s.zone,
        or_dash(s.leader),
        s.term,
        or_dash(s.last_applied)
    );
    println!(
        "observed {}  duplicates {}  window keys {}  outbox {} msgs / {} bytes",
        t.observed, t.duplicates, t.window_keys, t.outbox_messages, t.outbox_bytes
    );
    let l = &s.level;
    println!(
        "cluster level {}  this release {} (levels {} to {})  upgrade {:?}",
        l.cluster, l.release, l.oldest, l.supported, l.mode
    );
    for m in &l.members {
        match &m.levels {
            Some(v) => println!(
                "  node {} runs release {} (levels {} to {})",
                m.node, v.release, v.oldest, v.supported
            ),
            None => println!("  node {}: {}", m.node, or_dash(m.error.as_ref())),
        }
    }
    if let Some(why) = &l.waiting {
        println!("  level held: {why}");
    }
    println!(
        "\n{:<24} {:>10} {:>10}  last error",
        "upstream", "connected", "received"
    );
    for u in &s.upstreams {
        println!(
            "{:<24} {:>10} {:>10}  {}",
            u.name,
            u.connected,
            u.received,
            or_dash(u.last_error.as_ref())
        );
    }
    println!(
        "\n{:<48} {:>10} {:>10} {:>8}",
        "pulsar topic", "last seq", "published", "backlog"
    );
    for tp in &s.topics {
        println!(
            "{:<48} {:>10} {:>10} {:>8}",
            tp.topic, tp.last_seq, tp.published_seq, tp.backlog
        );
    }
    println!(
        "\n{:<6} {:<14} {:>10} {:>10} {:>9} {:>9}",
        "node", "zone", "seen", "first", "seen %", "first %"
    );
    for c in &s.coverage {
        println!(
            "{:<6} {:<14} {:>10} {:>10} {:>8.1}% {:>8.1}%",
            c.node,
            c.zone,
            c.seen,
            c.first,
            c.seen_ratio * 100.0,
            c.first_ratio * 100.0
        );
    }
    ExitCode::SUCCESS
}

/// An optional value as table text: "-" when there is none.
fn or_dash<T: std::fmt::Display>(value: Option<T>) -> String {
    value.map_or_else(|| "-".to_string(), |v| v.to_string())
}
