//! What an operator sees: /metrics parsed by the official Prometheus client,
//! the documented metric list held to the code, and the status page read in
//! a real headless browser against a running three-node cluster.

mod common;

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::cluster::TestCluster;
use common::*;

/// Metric names in docs/metrics.md's table.
fn documented() -> BTreeSet<String> {
    let doc = std::fs::read_to_string(repo().join("docs/metrics.md")).unwrap();
    doc.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_string)
        .collect()
}

#[test]
fn the_metrics_doc_and_the_code_name_the_same_metrics() {
    let code: BTreeSet<String> = firstseen::telemetry::METRICS
        .iter()
        .map(|(n, _, _)| n.to_string())
        .collect();
    assert_eq!(
        documented(),
        code,
        "docs/metrics.md and src/telemetry.rs disagree"
    );
}

#[test]
fn metrics_parse_and_every_documented_metric_exists() {
    let Some(pulsar) = shared_pulsar("metrics_parse_and_every_documented_metric_exists") else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("metrics");
    let node = Node::start(NodeSpec::new(&mqtt, &pulsar, &topic));
    node.wait_ready();
    replay(mqtt.port, &["--limit", "200", "--pace", "max"]);
    node.wait_published(hfp_pairs(Some(200)).len() as u64, Duration::from_secs(60));
    // Gauges are refreshed once a second; wait for the coverage gauges.
    wait_until(Duration::from_secs(10), "coverage gauges", || {
        node.get("/metrics")
            .1
            .contains("firstseen_coverage_seen_ratio")
    });
    let (code, text) = node.get("/metrics");
    assert_eq!(code, 200);
    let mut parser = Command::new("python3")
        .arg(repo().join("tests/tools/parse_metrics.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    parser
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = parser.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the Prometheus parser rejected /metrics"
    );
    let families: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for (name, kind, _) in firstseen::telemetry::METRICS {
        // The parser names counter families without their `_total`.
        let family = if *kind == "counter" {
            name.trim_end_matches("_total")
        } else {
            name
        };
        let f = &families[family];
        assert_eq!(
            f["type"], *kind,
            "metric {name} missing or of the wrong type in /metrics"
        );
    }
    assert!(
        text.contains("node=\"1\"") && text.contains("zone=\"zone-a\""),
        "series carry node and zone"
    );
}

#[test]
fn the_status_page_shows_the_cluster_and_a_degraded_zone() {
    let Some(pulsar) = shared_pulsar("the_status_page_shows_the_cluster_and_a_degraded_zone")
    else {
        return;
    };
    if !std::path::Path::new("/usr/bin/chromium").exists() {
        assert_ne!(
            std::env::var("FIRSTSEEN_REQUIRE_BROKERS").as_deref(),
            Ok("1"),
            "chromium is missing; scripts/setup.sh installs it"
        );
        eprintln!(
            "SKIPPED the_status_page_shows_the_cluster_and_a_degraded_zone: no /usr/bin/chromium"
        );
        return;
    }
    let mqtt = Mosquitto::start();
    let topic = unique_topic("status-page");
    let mut c = TestCluster::start(&mqtt, &pulsar, &topic, 3, |_| {});
    c.wait_ready();
    let leader = c.wait_leader(None, Duration::from_secs(30));
    let degraded = if leader == 3 { 2 } else { 3 };
    c.cut_upstream(degraded);
    wait_until(
        Duration::from_secs(30),
        "the cut zone to be not ready",
        || c.node(degraded).get("/readyz").0 == 503,
    );
    let r = replay(
        mqtt.port,
        &["--limit", "1500", "--pace", "max", "--dup-every", "4"],
    );
    let distinct = hfp_pairs(Some(1500)).len() as u64;
    c.node(leader)
        .wait_published(distinct, Duration::from_secs(60));
    // Let the two healthy zones' last copies commit, so the page and /status
    // are read from the same, settled state.
    wait_until(
        Duration::from_secs(30),
        "every healthy zone's copies committed",
        || {
            c.node(1)
                .status()
                .is_some_and(|s| s.totals.observed == 2 * r.published)
        },
    );

    let shot = match std::env::var("FIRSTSEEN_UPDATE_SCREENSHOT") {
        Ok(_) => repo().join("docs/status-page.png"),
        Err(_) => c.node(1).dir.path().join("status-page.png"),
    };
    let out = Command::new("python3")
        .arg(repo().join("tests/tools/status_page.py"))
        .args([
            "--url",
            &format!("http://127.0.0.1:{}/", c.node(1).http_port),
            "--members",
            "3",
        ])
        .arg("--screenshot")
        .arg(&shot)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "browser run failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let status = c.node(1).status_json().unwrap();

    assert_eq!(page["title"], "firstseen status");
    assert_eq!(page["leader"], leader.to_string());
    for (on_page, in_status) in [
        ("observed", "observed"),
        ("duplicates", "duplicates"),
        ("window_keys", "window_keys"),
        ("outbox", "outbox_messages"),
    ] {
        assert_eq!(
            page[on_page], status["totals"][in_status],
            "{on_page} on the page differs from /status"
        );
    }
    assert_eq!(page["window_keys"].as_u64(), Some(distinct));
    let rows = page["members"].as_array().unwrap();
    assert_eq!(rows.len(), 3);
    for row in rows {
        let id = row["node"].as_u64().unwrap();
        assert_eq!(row["degraded"].as_bool(), Some(id == degraded), "row {row}");
        if id == degraded {
            assert!(
                row["health"].as_str().unwrap().contains("degraded"),
                "{row}"
            );
        }
        // A zone that never delivered a key has no coverage entry: 0%.
        let cov = status["coverage"]
            .as_array()
            .unwrap()
            .iter()
            .find(|cv| cv["node"] == id)
            .and_then(|cv| cv["seen_ratio"].as_f64())
            .unwrap_or(0.0);
        let diff = (row["seen"].as_f64().unwrap() - cov).abs();
        assert!(
            diff < 1e-9,
            "coverage of node {id} on the page differs from /status"
        );
    }
    assert!(
        page["cluster_health"]
            .as_str()
            .unwrap()
            .contains("1 zone(s) degraded"),
        "{page}"
    );
    assert_eq!(page["chart_paths"], 3);
    assert!(
        std::fs::metadata(&shot)
            .map(|m| m.len() > 10_000)
            .unwrap_or(false),
        "screenshot written"
    );
}

/// Field paths documented in docs/status.md: a table under a heading that
/// names an object (`` ## `totals` ``) or array (`` ## `members[]` ``)
/// lists that object's fields; other tables list paths from the top.
fn documented_status_fields() -> BTreeSet<String> {
    let doc = std::fs::read_to_string(repo().join("docs/status.md")).unwrap();
    let mut prefix = String::new();
    let mut out = BTreeSet::new();
    for line in doc.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            prefix = match h.trim().strip_prefix('`').and_then(|h| h.strip_suffix('`')) {
                Some(name) => format!("{name}."),
                None => String::new(),
            };
        } else if let Some(rest) = line.strip_prefix("| `") {
            if let Some(name) = rest.split('`').next() {
                out.insert(format!("{prefix}{name}"));
            }
        }
    }
    out
}

/// Every field path in a JSON value; array elements as `name[]`.
fn status_fields(v: &serde_json::Value, prefix: &str, out: &mut BTreeSet<String>) {
    if let serde_json::Value::Object(m) = v {
        for (k, v) in m {
            match v {
                serde_json::Value::Object(_) => status_fields(v, &format!("{prefix}{k}."), out),
                serde_json::Value::Array(items) => {
                    out.insert(format!("{prefix}{k}[]"));
                    for item in items {
                        status_fields(item, &format!("{prefix}{k}[]."), out);
                    }
                }
                _ => {
                    out.insert(format!("{prefix}{k}"));
                }
            }
        }
    }
}

/// docs/status.md lists exactly the fields a running cluster's /status
/// returns, on the leader and on a follower.
#[test]
fn the_status_doc_lists_every_status_field() {
    let Some(pulsar) = shared_pulsar("the_status_doc_lists_every_status_field") else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("status-doc");
    let c = TestCluster::start(&mqtt, &pulsar, &topic, 3, |_| {});
    c.wait_ready();
    let leader = c.wait_leader(None, Duration::from_secs(30));
    replay(mqtt.port, &["--limit", "300", "--pace", "max"]);
    c.nodes[(leader - 1) as usize]
        .wait_published(hfp_pairs(Some(300)).len() as u64, Duration::from_secs(60));
    let mut seen = BTreeSet::new();
    for n in &c.nodes {
        status_fields(&n.status_json().unwrap(), "", &mut seen);
    }
    // Array headings are documented as `name[]`, their fields below them.
    let documented = documented_status_fields();
    let arrays: BTreeSet<String> = documented
        .iter()
        .filter_map(|f| f.split_once("[].").map(|(a, _)| format!("{a}[]")))
        .collect();
    let seen_fields: BTreeSet<String> = seen.difference(&arrays).cloned().collect();
    let undocumented: Vec<_> = seen_fields.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "not in docs/status.md: {undocumented:?}"
    );
    // A documented field inside an array that was empty here cannot show.
    let missing: Vec<_> = documented
        .difference(&seen_fields)
        .filter(|f| {
            f.split_once("[].")
                .is_none_or(|(a, _)| seen.iter().any(|s| s.starts_with(&format!("{a}[]."))))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "documented but not returned: {missing:?}"
    );
}
