//! A drop-in for HSL's transitdata pipeline: routes that write the
//! `mqtt-raw` envelope, read back with an independent decoder (Python's
//! protobuf, from a module protoc generates), and `firstseen compare` on
//! topics with known differences. Real Mosquitto and Pulsar.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::cluster::TestCluster;
use common::*;
use firstseen::publish::format::Format;

/// Three zones writing the envelope, the leader killed mid-publish: every
/// message once, each a well-formed envelope of its MQTT topic and payload
/// with the properties and event time transitdata's consumers read, and
/// `firstseen verify` keys every one again from inside its envelope.
#[test]
fn the_envelope_survives_a_leader_kill_and_decodes_independently() {
    let Some(pulsar) =
        shared_pulsar("the_envelope_survives_a_leader_kill_and_decodes_independently")
    else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("transitdata");
    let mut c = TestCluster::start(&mqtt, &pulsar, &topic, 3, |spec| {
        spec.test_route().format = Format::Transitdata;
    });
    c.wait_ready();
    let (replay, _, _, new) =
        c.kill_leader_mid_replay(&["--pace", "1500", "--dup-every", "7"], 1_000);
    assert!(replay.wait_with_output().unwrap().status.success());
    c.node(new)
        .wait_published(HFP_DISTINCT, Duration::from_secs(120));

    let read = read_back_with(&pulsar, &topic, &["--envelope"]);
    assert_eq!(
        read.envelopes, read.count,
        "not every message is an envelope"
    );
    assert!(
        read.envelope_problems.is_empty(),
        "{:?}",
        read.envelope_problems
    );
    assert_exactly_once(&read, &hfp_pairs(None));
    let out = Command::new(bin())
        .args(["verify", "--pulsar-url", &pulsar.url, "--topic", &topic])
        .arg("--secret-file")
        .arg(c.secret_file())
        .args(["--key", "topic+payload", "--json"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report[0]["contents_checked"], HFP_DISTINCT, "{text}");
    assert_eq!(report[0]["key_mismatches"], 0, "{text}");
}

/// Writes "TOPIC PAYLOAD" lines with the stand-in tool, in `format`, with
/// line `drop` left out and line `double` written twice.
/// Line i is stamped `start_ms + i`, the same in every topic.
fn write_lines(
    pulsar: &Pulsar,
    topic: &str,
    format: &str,
    start_ms: u128,
    lines: &str,
    plant: &[&str],
) {
    let mut child = Command::new("python3")
        .arg(repo().join("tests/tools/transitdata_standin.py"))
        .args(["write", "--url", &pulsar.url, "--topic", topic])
        .args(["--start-ms", &start_ms.to_string()])
        .args(["--format", format])
        .args(plant)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(lines.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "transitdata_standin.py write failed");
}

fn compare(pulsar: &Pulsar, a: &str, b: &str) -> (i32, serde_json::Value, String) {
    let out = Command::new(bin())
        .args(["compare", "--pulsar-url", &pulsar.url, "--a", a, "--b", b])
        .args(["--a-name", "old", "--b-name", "new", "--margin-secs", "0"])
        .args(["--json"])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let report = serde_json::from_slice(&out.stdout).unwrap_or_default();
    (out.status.code().unwrap_or(-1), report, text)
}

/// The same 300 messages as envelopes in one topic and raw in another
/// compare identical; a key dropped from one and a key doubled in the other
/// are found, on the right side, and nothing else is.
#[test]
fn compare_finds_planted_differences_and_none_between_equal_topics() {
    let Some(pulsar) =
        shared_pulsar("compare_finds_planted_differences_and_none_between_equal_topics")
    else {
        return;
    };
    let lines: String = std::fs::read_to_string(hfp_path())
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once(' ').map(|(_, rest)| rest))
        .filter_map(|rest| rest.find(" {").map(|cut| (rest, cut)))
        .map(|(rest, cut)| format!("{} {}\n", &rest[..cut], &rest[cut + 1..]))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .take(300)
        .collect();
    let old = unique_topic("compare-old");
    let new = unique_topic("compare-new");
    let same = unique_topic("compare-same");
    let start = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let plant = ["--drop", "100", "--double", "200"];
    write_lines(&pulsar, &old, "transitdata", start, &lines, &plant);
    write_lines(&pulsar, &new, "raw", start, &lines, &[]);
    write_lines(&pulsar, &same, "transitdata", start, &lines, &[]);

    let (code, r, text) = compare(&pulsar, &old, &new);
    assert_eq!(code, 1, "{text}");
    let (o, n) = (&r["sides"][0], &r["sides"][1]);
    assert_eq!(o["lacks"], 1, "{text}");
    assert_eq!(o["extra_copies"], 1, "{text}");
    assert_eq!(o["distinct_keys"], 299, "{text}");
    assert_eq!(n["lacks"], 0, "{text}");
    assert_eq!(n["extra_copies"], 0, "{text}");
    assert_eq!(n["distinct_keys"], 300, "{text}");
    let dropped = lines.lines().nth(100).unwrap();
    assert_eq!(
        o["lacks_first"][0]["mqtt_topic"].as_str(),
        dropped.split_once(' ').map(|(t, _)| t),
        "{text}"
    );

    let (code, r, text) = compare(&pulsar, &same, &new);
    assert_eq!(code, 0, "{text}");
    assert_eq!(r["union_keys"], 300, "{text}");
    assert_eq!(r["sides"][0]["coverage_percent"], 100.0, "{text}");
}
