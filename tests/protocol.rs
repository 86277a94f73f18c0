//! The feeds' whole protocol: QoS 2 upstream through a node kill and a
//! broker restart, MQTT 5 properties carried into Pulsar, and dedup keys
//! made of JSON fields. Published with paho-mqtt, read back with the
//! official Pulsar client.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::cluster::TestCluster;
use common::*;
use firstseen::config::{Protocol, RouteConfig};
use firstseen::key::{FieldKey, KeySpec, Missing};
use serde_json::Value;

fn coverage_of(n: &Node, node: u64) -> f64 {
    n.status()
        .and_then(|s| s.coverage.into_iter().find(|c| c.node == node))
        .map_or(0.0, |c| c.seen_ratio)
}

/// QoS 2 from the publisher to the bridges. A node is SIGKILLed mid-flow
/// (with PUBREC/PUBREL exchanges in flight) and restarted, then Mosquitto is
/// restarted: exactly once in Pulsar, and the killed node's upstream works
/// again. rumqttc 0.25 treats the broker's resent PUBREL for an exchange the
/// killed process began as unsolicited and drops the connection, forever;
/// the session marks every packet id for a PUBREL after each reset
/// (src/ingest/adapter/), and this test fails without that.
#[test]
fn qos2_through_a_node_kill_and_a_broker_restart_is_exactly_once() {
    let Some(pulsar) =
        shared_pulsar("qos2_through_a_node_kill_and_a_broker_restart_is_exactly_once")
    else {
        return;
    };
    let mut mqtt = Mosquitto::start();
    let topic = unique_topic("qos2");
    let mut c = TestCluster::start(&mqtt, &pulsar, &topic, 3, |s| s.set_qos(2));
    c.wait_ready();
    let leader = c.wait_leader(None, Duration::from_secs(30));
    let victim = if leader == 3 { 2 } else { 3 };
    let load = replay_cmd(mqtt.port, &["--qos", "2", "--pace", "1500"])
        .spawn()
        .unwrap();
    wait_until(
        Duration::from_secs(30),
        "the victim to ack part of the feed",
        || c.node(victim).metric("firstseen_acks_total") > 1_000.0,
    );
    c.node(victim).kill9();
    c.node(victim).restart();
    let out = load.wait_with_output().unwrap();
    assert!(out.status.success());
    wait_until(
        Duration::from_secs(60),
        "the victim's zone to cover the feed",
        || coverage_of(c.node(leader), victim) > 0.99,
    );
    let disconnects = c
        .node(victim)
        .metric("firstseen_upstream_disconnects_total");
    assert!(
        disconnects <= 3.0,
        "the restarted node's upstream kept failing ({disconnects} disconnects): a PUBREL loop"
    );

    mqtt.restart();
    replay(
        mqtt.port,
        &["--qos", "2", "--pace", "max", "--limit", "500"],
    );
    c.wait_ready();
    c.node(leader)
        .wait_published(HFP_DISTINCT, Duration::from_secs(120));
    assert_exactly_once(&read_back(&pulsar, &topic), &hfp_pairs(None));
    for id in 1..=3 {
        assert_eq!(
            c.node(id).get("/readyz").0,
            200,
            "node {id} after the broker restart"
        );
    }
}

/// Reads a topic with every message's properties (official client).
fn read_properties(pulsar: &Pulsar, topic: &str) -> Vec<serde_json::Map<String, Value>> {
    let out = Command::new("python3")
        .arg(repo().join("tests/tools/pulsar_read.py"))
        .args(["--url", &pulsar.url, "--topic", topic, "--with-properties"])
        .stderr(Stdio::null())
        .output()
        .expect("run pulsar_read.py");
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["properties"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_object().unwrap().clone())
        .collect()
}

/// MQTT 5 upstreams: user properties, content type, payload format, expiry,
/// response topic and correlation data reach Pulsar as documented, once per
/// message from a three-zone cluster.
#[test]
fn mqtt5_properties_reach_pulsar_once_as_documented() {
    let Some(pulsar) = shared_pulsar("mqtt5_properties_reach_pulsar_once_as_documented") else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("mqtt5");
    let c = TestCluster::start(&mqtt, &pulsar, &topic, 3, |s| {
        s.upstream().protocol = Protocol::V5;
        s.set_filter("/v5/#");
    });
    c.wait_ready();
    let leader = c.wait_leader(None, Duration::from_secs(30));
    let n = 200u64;
    let status = Command::new("python3")
        .arg(repo().join("tests/tools/publish5.py"))
        .args(["--port", &mqtt.port.to_string(), "--prefix", "/v5/t"])
        .args(["--count", &n.to_string(), "--expiry", "3600"])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    c.nodes[(leader - 1) as usize].wait_published(n, Duration::from_secs(60));
    let props = read_properties(&pulsar, &topic);
    assert_eq!(props.len() as u64, n, "one message per publish");
    let mut seen = std::collections::BTreeSet::new();
    for p in &props {
        let get = |k: &str| {
            p.get(k)
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string()
        };
        let i: u64 = get("mqtt-user-seq").parse().expect("mqtt-user-seq");
        assert!(seen.insert(i), "message {i} twice");
        assert_eq!(get("mqtt-topic"), format!("/v5/t/{i}"));
        assert_eq!(get("mqtt-user-source"), "publish5");
        assert_eq!(get("mqtt-user-hop"), "a");
        assert_eq!(get("mqtt-user-hop.2"), "b");
        assert_eq!(get("mqtt-content-type"), "application/json");
        assert_eq!(get("mqtt-payload-format"), "1");
        assert_eq!(get("mqtt-response-topic"), format!("replies/{i}"));
        assert_eq!(get("mqtt-correlation-data"), format!("{:08x}", i as u32));
        let expiry: u64 = get("mqtt-message-expiry-secs").parse().unwrap();
        assert!(expiry > 3_500 && expiry <= 3_600, "expiry {expiry}");
        assert!(p.contains_key("firstseen-seq") && p.contains_key("firstseen-key"));
    }
}

/// Two copies of each message that differ only in JSON field order,
/// whitespace and number format: with a key of JSON fields, one copy per
/// message in Pulsar; with the byte key, both copies.
#[test]
fn a_json_field_key_sees_through_reserialised_copies_and_a_byte_key_does_not() {
    let Some(pulsar) =
        shared_pulsar("a_json_field_key_sees_through_reserialised_copies_and_a_byte_key_does_not")
    else {
        return;
    };
    let mqtt = Mosquitto::start();
    let by_fields = unique_topic("json-key");
    let by_bytes = unique_topic("byte-key");
    let mut spec = NodeSpec::new(&mqtt, &pulsar, &unique_topic("unrouted"));
    spec.set_filter("#");
    // Tried before the node's own catch-all route.
    let mut fields = RouteConfig::new("/fields/#", by_fields.clone());
    fields.key = KeySpec::Fields(FieldKey {
        json: vec!["/VP/veh".into(), "/VP/oper".into(), "/VP/tst".into()],
        topic: false,
        missing: Missing::default(),
    });
    spec.config.routes.splice(
        0..0,
        [fields, RouteConfig::new("/bytes/#", by_bytes.clone())],
    );
    let node = Node::start(spec);
    node.wait_ready();
    let run = |prefix: &str| -> Value {
        let out = Command::new("python3")
            .arg(repo().join("tests/tools/publish_variants.py"))
            .args(["--port", &mqtt.port.to_string(), "--prefix", prefix])
            .arg("--file")
            .arg(hfp_path())
            .args(["--limit", "1000"])
            .output()
            .unwrap();
        assert!(out.status.success());
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let fields = run("/fields");
    let bytes = run("/bytes");
    let distinct = fields["distinct_fields"].as_u64().unwrap();
    let payloads = bytes["distinct_payloads"].as_u64().unwrap();
    wait_until(Duration::from_secs(60), "both topics published", || {
        node.status().is_some_and(|s| {
            let done = |name: &str, n: u64| {
                s.topics
                    .iter()
                    .any(|x| x.topic == name && x.published_seq >= n && x.backlog == 0)
            };
            done(&by_fields, distinct) && done(&by_bytes, 2 * payloads)
        })
    });
    let a = read_back(&pulsar, &by_fields);
    let b = read_back(&pulsar, &by_bytes);
    eprintln!(
        "field key: {} messages for {distinct} distinct (veh, oper, tst); byte key: {} for {payloads} distinct payloads",
        a.count, b.count
    );
    assert_eq!(
        a.count, distinct,
        "the field key keeps one copy per message"
    );
    assert_eq!(a.keys_with_copies, 0);
    assert_eq!(
        b.count,
        2 * payloads,
        "the byte key keeps both serialisations"
    );
}

/// An upstream over TLS to a Mosquitto listener that requires client
/// certificates (made by the test with openssl). The right CA and
/// certificate deliver exactly once; a wrong CA fails with an error naming
/// the upstream and acks nothing, so what is published meanwhile waits in
/// the broker's session and arrives once the node is fixed; check-config
/// names a missing key file.
#[test]
fn an_mqtts_upstream_with_client_certificates_is_exactly_once_and_a_wrong_ca_loses_nothing() {
    let Some(pulsar) = shared_pulsar(
        "an_mqtts_upstream_with_client_certificates_is_exactly_once_and_a_wrong_ca_loses_nothing",
    ) else {
        return;
    };
    let certs = tempfile::TempDir::new().unwrap();
    let (cert, key, ca) = make_certs(certs.path(), "mqtt");
    let (_, _, other_ca) = make_certs(certs.path(), "other");
    let tls_port = free_port();
    let mqtt = Mosquitto::start_with(|_| {
        format!(
            "listener {tls_port} 127.0.0.1\ncafile {}\ncertfile {}\nkeyfile {}\nrequire_certificate true\n",
            ca.display(),
            cert.display(),
            key.display()
        )
    });
    let topic = unique_topic("mqtts");
    // The upstream's TLS files: a CA, and a client certificate and key if
    // given.
    let tls = |s: &mut NodeSpec, ca_file: Option<&std::path::Path>, client: bool| {
        let u = s.upstream();
        u.ca_file = ca_file.map(|f| f.to_path_buf());
        u.cert_file = client.then(|| cert.clone());
        u.key_file = client.then(|| key.clone());
    };
    let mut spec = NodeSpec::new(&mqtt, &pulsar, &topic);
    spec.upstream().url = format!("mqtts://127.0.0.1:{tls_port}");
    tls(&mut spec, Some(&ca), true);
    spec.config.node.shutdown_timeout_secs = 5;
    let mut node = Node::start(spec.clone());
    node.wait_ready();
    replay(mqtt.port, &["--limit", "1000", "--pace", "max"]);
    node.wait_published(hfp_pairs(Some(1000)).len() as u64, Duration::from_secs(60));
    node.terminate(Duration::from_secs(20)).expect("stops");

    // The broker's certificate does not chain to this CA.
    tls(&mut node.spec, Some(&other_ca), true);
    node.restart();
    wait_until(Duration::from_secs(30), "the TLS error in /status", || {
        node.upstream_error()
            .is_some_and(|e| e.contains("certificate") || e.contains("Tls") || e.contains("TLS"))
    });
    let error = node.upstream_error().unwrap_or_default();
    eprintln!("wrong CA: {error}");
    assert_eq!(node.get("/readyz").0, 503, "not ready without its upstream");
    replay(mqtt.port, &["--skip", "1000", "--pace", "max"]);
    assert_eq!(node.metric("firstseen_acks_total"), 0.0, "acked nothing");
    node.terminate(Duration::from_secs(20)).expect("stops");

    // The right CA but no client certificate: the broker refuses it.
    tls(&mut node.spec, Some(&ca), false);
    node.restart();
    let mut seen = String::new();
    wait_until(Duration::from_secs(30), "the refusal in /status", || {
        seen = node.upstream_error().unwrap_or_default();
        seen.starts_with("mqtts://127.0.0.1")
    });
    eprintln!("no client certificate: {seen}");
    assert_eq!(node.get("/readyz").0, 503);
    assert_eq!(node.metric("firstseen_acks_total"), 0.0, "acked nothing");
    node.terminate(Duration::from_secs(20)).expect("stops");

    // Fixed: what the broker kept for the session arrives, once.
    tls(&mut node.spec, Some(&ca), true);
    node.restart();
    node.wait_published(HFP_DISTINCT, Duration::from_secs(120));
    assert_exactly_once(&read_back(&pulsar, &topic), &hfp_pairs(None));

    // A certificate without its key is named before any node runs.
    let mut half = spec.clone();
    tls(&mut half, None, true);
    half.upstream().key_file = None;
    let bad = certs.path().join("half.toml");
    std::fs::write(&bad, half.toml(&node.data_dir(), free_port())).unwrap();
    let out = Command::new(bin())
        .args(["check-config", bad.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("upstreams[0].key_file"), "{stderr}");
}
