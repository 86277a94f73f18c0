//! Keeps the benchmark tools from rotting: a tiny load through one node,
//! measured by the probe. Speed is not asserted; the tools' output is.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

/// The `firstseen-bench` binary, or `None` (the test skips) when it was not
/// built, which `FIRSTSEEN_REQUIRE_BROKERS=1` turns into a failure.
fn bench_tool(test: &str) -> Option<std::path::PathBuf> {
    // Built by `cargo build --workspace` (scripts/test.sh does that first).
    let tool = bin().parent().unwrap().join("firstseen-bench");
    if tool.exists() {
        return Some(tool);
    }
    assert_ne!(
        std::env::var("FIRSTSEEN_REQUIRE_BROKERS").as_deref(),
        Ok("1"),
        "{} is missing; scripts/test.sh builds the workspace first",
        tool.display()
    );
    eprintln!("SKIPPED {test}: firstseen-bench not built");
    None
}

#[test]
fn the_benchmark_tools_measure_a_small_load() {
    let Some(pulsar) = shared_pulsar("the_benchmark_tools_measure_a_small_load") else {
        return;
    };
    let Some(tool) = bench_tool("the_benchmark_tools_measure_a_small_load") else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("bench-smoke");
    let node = Node::start(NodeSpec::new(&mqtt, &pulsar, &topic));
    node.wait_ready();
    let run = format!("smoke{}", std::process::id());
    let probe = Command::new(&tool)
        .args([
            "probe",
            "--pulsar",
            &pulsar.url,
            "--topic",
            &topic,
            "--expect",
            "400",
            "--idle-secs",
            "20",
        ])
        .args(["--run", &run])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The probe reads from the latest message on: let it subscribe first.
    wait_until(Duration::from_secs(20), "the probe's subscription", || {
        let (_, body) = Command::new("curl")
            .args([
                "-s",
                &format!(
                    "{}/admin/v2/persistent/{}/stats",
                    pulsar.admin_url,
                    topic.trim_start_matches("persistent://")
                ),
            ])
            .output()
            .map(|o| ((), String::from_utf8_lossy(&o.stdout).into_owned()))
            .unwrap();
        body.contains("bench-probe")
    });
    let template = hfp_path();
    let load = Command::new(&tool)
        .args(["load", "--port", &mqtt.port.to_string(), "--template"])
        .arg(&template)
        .args([
            "--rate",
            "200",
            "--secs",
            "2",
            "--dup-every",
            "5",
            "--run",
            &run,
        ])
        .output()
        .unwrap();
    assert!(
        load.status.success(),
        "load failed: {}",
        String::from_utf8_lossy(&load.stderr)
    );
    let load: serde_json::Value = serde_json::from_slice(&load.stdout).unwrap();
    assert_eq!(load["unique"], 400);
    assert_eq!(load["sent"], 480, "every 5th message twice");

    let out = probe.wait_with_output().unwrap();
    assert!(out.status.success());
    let probe: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(probe["unique"], 400, "{probe}");
    assert_eq!(
        probe["copies_per_message"], 1.0,
        "one copy per message through firstseen: {probe}"
    );
    assert_eq!(probe["verify_clean"], true, "{probe}");
    assert!(
        probe["latency_ms"]["p50"].as_f64().is_some_and(|l| l > 0.0),
        "{probe}"
    );
}

/// The window profile needs no broker: it drives the real state machine.
#[test]
fn the_window_profile_reports_disk_per_key() {
    let Some(tool) = bench_tool("the_window_profile_reports_disk_per_key") else {
        return;
    };
    let out = Command::new(&tool)
        .args(["window", "--keys", "2000", "--batch", "50"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "window failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // Every key stays in a one-hour window; every outbox entry was trimmed
    // by its receipt, as the publisher would.
    assert_eq!(report["window_keys"], 2000, "{report}");
    assert_eq!(report["outbox_messages"], 0, "{report}");
    assert!(
        report["bytes_per_key"].as_f64().is_some_and(|b| b > 0.0),
        "{report}"
    );
}
