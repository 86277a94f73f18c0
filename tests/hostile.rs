//! G8: nothing one sender does stops the others. Messages that are legal on
//! the wire and hostile to a bridge (megabytes of MQTT 5 properties, tens
//! of thousands of them, a 60,000-character topic), and a foreign writer
//! on the Pulsar topic, against a three-zone cluster on the real brokers.
//! Results are read back with the official Pulsar client.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::cluster::TestCluster;
use common::*;
use firstseen::config::Protocol;

/// Three MQTT 5 upstreams while the HSL capture is replayed at its pace,
/// and one client publishing three hostile messages on a routed topic:
/// each is refused by the message bounds and set aside in every node's
/// dead-letter store, and every normal message reaches Pulsar exactly
/// once. Before the bounds counted the whole message, the 8 MB of user
/// properties passed the payload check, Pulsar refused the message by
/// closing the connection, and the publisher sent it again after every
/// reconnect: nothing after it was published.
#[test]
fn hostile_mqtt5_messages_are_set_aside_and_the_rest_is_published_once() {
    let Some(pulsar) =
        shared_pulsar("hostile_mqtt5_messages_are_set_aside_and_the_rest_is_published_once")
    else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("hostile");
    let mut c = TestCluster::start(&mqtt, &pulsar, &topic, 3, |s| {
        s.upstream().protocol = Protocol::V5;
    });
    c.wait_ready();
    let leader = c.wait_leader(None, Duration::from_secs(30));
    let normal = replay_cmd(mqtt.port, &["--pace", "500"])
        .spawn()
        .expect("replay.py starts");
    let hostile = Command::new("python3")
        .arg(repo().join("tests/tools/publish_hostile.py"))
        .args([
            "--port",
            &mqtt.port.to_string(),
            "--prefix",
            "/hfp/v1/hostile",
        ])
        .stdout(Stdio::piped())
        .output()
        .expect("publish_hostile.py runs");
    assert!(
        hostile.status.success(),
        "the broker took the hostile messages"
    );
    let out = normal.wait_with_output().expect("replay.py ends");
    assert!(out.status.success(), "replay.py failed");
    c.node(leader)
        .wait_published(HFP_DISTINCT, Duration::from_secs(120));
    for id in 1..=3 {
        let n = c.node(id);
        wait_until(
            Duration::from_secs(30),
            "every hostile message refused",
            || n.metric("firstseen_oversize_total") >= 3.0,
        );
        let dead = std::fs::read_dir(n.data_dir().join("dead-letter"))
            .map(|d| d.count())
            .unwrap_or(0);
        assert_eq!(dead, 3, "node {id}: each hostile message set aside once");
        let s = n.status().expect("node answers");
        let backlog: u64 = s.topics.iter().map(|t| t.backlog).sum();
        assert_eq!(backlog, 0, "node {id}: the outbox drained");
        assert!(s.ready, "node {id} not ready: {:?}", s.not_ready_reason);
    }
    assert_exactly_once(&read_back(&pulsar, &topic), &hfp_pairs(None));
    let (code, report) = verify(&pulsar, &topic, Some(HFP_DISTINCT), &c.secret_file());
    assert_eq!(code, 0, "{report}");
}

/// Half the capture is published and settled; every node stops; another
/// producer writes two messages labelled like firstseen's, one numbered a
/// thousand past the last and one `u64::MAX`; the rest of the capture is
/// published upstream while the nodes are down (their sessions queue it);
/// the nodes start again. The new publisher must resume after its own last
/// message, not after the foreign ones: before, it took the foreign tail
/// for its own, skipped 1,000 sequences, and the watermark that followed
/// trimmed those messages from the outbox unpublished (and `u64::MAX`
/// overflowed the resume point).
#[test]
fn a_foreign_tail_is_skipped_and_nothing_acked_is_lost() {
    let Some(pulsar) = shared_pulsar("a_foreign_tail_is_skipped_and_nothing_acked_is_lost") else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("foreign-tail");
    let mut c = TestCluster::start(&mqtt, &pulsar, &topic, 3, |_| {});
    c.wait_ready();
    let leader = c.wait_leader(None, Duration::from_secs(30));
    replay(mqtt.port, &["--limit", "2500", "--pace", "max"]);
    let first = hfp_pairs(Some(2500)).len() as u64;
    c.node(leader)
        .wait_published(first, Duration::from_secs(60));
    for id in 1..=3 {
        assert!(
            c.node(id).terminate(Duration::from_secs(30)).is_some(),
            "node {id} stops"
        );
    }
    let status = Command::new("python3")
        .arg(repo().join("tests/tools/pulsar_write.py"))
        .args(["--url", &pulsar.url, "--topic", &topic])
        .arg(format!("f0:{}", first + 1_000))
        .arg(format!("f1:{}", u64::MAX))
        .status()
        .expect("pulsar_write.py runs");
    assert!(status.success(), "the foreign writer wrote");
    replay(mqtt.port, &["--pace", "max"]);
    for id in 1..=3 {
        c.node(id).restart();
    }
    c.wait_ready();
    let leader = c.wait_leader(None, Duration::from_secs(30));
    c.node(leader)
        .wait_published(HFP_DISTINCT, Duration::from_secs(120));
    let foreign = c.node(leader).metric("firstseen_foreign_messages_total");
    assert!(
        foreign >= 2.0,
        "the foreign messages were reported: {foreign}"
    );
    let read = read_back_with(&pulsar, &topic, &["--skip-key", "f0", "--skip-key", "f1"]);
    // Ours in order, the foreign two between them: the seqs the reader saw
    // of ours are 1..=N with nothing skipped or repeated.
    assert_exactly_once(&read, &hfp_pairs(None));
    let (code, report) = verify(&pulsar, &topic, Some(HFP_DISTINCT), &c.secret_file());
    assert_eq!(code, 0, "{report}");
    assert!(report.contains("foreign         2"), "{report}");
}

/// A message larger than the broker accepts reaches the publisher (ingest
/// took it under larger settings, as a node configured apart from the
/// others would): it goes to the topic as a marker with its sequence and
/// key, it is kept in the dead-letter store, and everything behind it is
/// published once. Without the check the publisher sent it again after every
/// reconnect and nothing behind it was ever published.
#[test]
fn a_message_the_broker_would_refuse_goes_as_a_marker_and_nothing_waits_behind_it() {
    let Some(pulsar) = shared_pulsar(
        "a_message_the_broker_would_refuse_goes_as_a_marker_and_nothing_waits_behind_it",
    ) else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("set-aside");
    let mut spec = NodeSpec::new(&mqtt, &pulsar, &topic);
    // Messages on topics no route takes come in too.
    spec.upstream().subscriptions[0].filter = "#".into();
    // First, no broker to publish to: everything waits in the outbox.
    let real_url = spec.config.pulsar.url.clone();
    spec.config.pulsar.url = format!("pulsar://127.0.0.1:{}", free_port());
    spec.config.pulsar.admin_url = None;
    let mut node = Node::start(spec);
    wait_until(Duration::from_secs(30), "cluster level 2", || {
        node.status().is_some_and(|s| s.level.cluster >= 2)
    });
    let sent = replay(mqtt.port, &["--limit", "300", "--pace", "max"]).published;
    let big_topic = "/hfp/v2/journey/ongoing/vp/bus/big/1";
    let big = vec![b'x'; 400 * 1024];
    publish(mqtt.port, big_topic, &big);
    let after = replay(
        mqtt.port,
        // --limit counts from the file's start, before --skip.
        &["--skip", "300", "--limit", "400", "--pace", "max"],
    )
    .published;
    wait_until(Duration::from_secs(60), "every message acked", || {
        node.metric("firstseen_acks_total") >= (sent + 1 + after) as f64
    });
    node.terminate(Duration::from_secs(20)).expect("stops");

    // Then a broker that takes 256 KiB at most.
    node.spec.config.pulsar.url = real_url;
    node.spec.config.pulsar.max_message_bytes = 256 * 1024;
    node.spec.config.dedup.max_message_bytes = 128 * 1024;
    node.spec.config.dedup.max_payload_bytes = 128 * 1024;
    // The dead letters may hold 256 KiB.
    node.spec.config.dead_letter.max_bytes = 256 * 1024;
    node.restart();
    let mut want = hfp_pairs(Some(400));
    want.insert((big_topic.to_string(), String::new()));
    node.wait_published(want.len() as u64, Duration::from_secs(120));
    assert!(node.metric("firstseen_set_aside_total") >= 1.0);
    assert_exactly_once(&read_back(&pulsar, &topic), &want);
    let (code, report) = verify(
        &pulsar,
        &topic,
        Some(want.len() as u64),
        &node.secret_file(),
    );
    assert_eq!(code, 0, "{report}");
    assert!(report.contains("set aside       1"), "{report}");
    // A sender on a topic no route takes publishes a megabyte: kept in the
    // dead letters, which then had evicted the set-aside message (this
    // test on the tree before the set-aside store).
    for i in 0..20 {
        publish(mqtt.port, &format!("elsewhere/{i}"), &[b'u'; 50 * 1024]);
    }
    wait_until(
        Duration::from_secs(30),
        "the unrouted messages acked",
        || node.metric("firstseen_dead_letter_total") >= 20.0,
    );
    // The message itself, whole, in the replicated set-aside store (not in
    // the dead letters, where anyone's unrouted messages could evict it).
    let kept = node.set_aside();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(kept[0]["mqtt_topic"], big_topic);
    let (reason, payload) = node.set_aside_message(kept[0]["id"].as_u64().unwrap());
    assert!(reason.contains("pulsar.max_message_bytes"), "{reason}");
    assert_eq!(payload, big, "the payload is kept whole");
    assert!(
        report.contains(&format!("marker seq {}", kept[0]["seq"])),
        "verify lists the marker: {report}"
    );
}

/// A foreign producer keeps trying to write into the topic while a
/// three-node cluster publishes, and gets in when the leader is killed:
/// between the old leader's exclusive producer and the successor's. Its
/// messages are numbered far past the end and at `u64::MAX`. The successor
/// resumes after its own last message: nothing lost, nothing twice, and the
/// foreign messages that got in are reported by the node and by verify.
#[test]
fn a_foreign_write_during_a_leader_change_is_skipped_and_nothing_is_lost() {
    let Some(pulsar) =
        shared_pulsar("a_foreign_write_during_a_leader_change_is_skipped_and_nothing_is_lost")
    else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("foreign-failover");
    let mut c = TestCluster::start(&mqtt, &pulsar, &topic, 3, |_| {});
    c.wait_ready();
    let leader = c.wait_leader(None, Duration::from_secs(30));
    let mut load = replay_cmd(mqtt.port, &["--pace", "600"]).spawn().unwrap();
    // The leader holds the topic once it has published.
    wait_until(Duration::from_secs(60), "the leader publishing", || {
        c.node(leader).published() >= 500
    });
    // The writer is up and refused while the leader holds the topic.
    let labels = [
        format!("g0:{}", 1_000_000),
        format!("g1:{}", u64::MAX),
        format!("g2:{}", 2_000_000),
    ];
    let writer = Command::new("python3")
        .arg(repo().join("tests/tools/pulsar_write.py"))
        .args(["--url", &pulsar.url, "--topic", &topic, "--retry-for", "25"])
        .args(&labels)
        .stdout(Stdio::piped())
        .spawn()
        .expect("pulsar_write.py runs");
    std::thread::sleep(Duration::from_secs(2));
    c.node(leader).kill9();
    let successor = c.wait_leader(Some(leader), Duration::from_secs(30));
    let out = writer.wait_with_output().unwrap();
    let written: u64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .strip_prefix("written ")
        .and_then(|n| n.parse().ok())
        .expect("the writer says how many got in");
    assert!(load.wait().unwrap().success(), "the load ran");
    c.node(leader).restart();
    c.node(successor)
        .wait_published(HFP_DISTINCT, Duration::from_secs(120));
    eprintln!("foreign messages that got in during the leader change: {written}");
    assert!(written >= 1, "no foreign write got in: the test saw no gap");
    let foreign = c.node(successor).metric("firstseen_foreign_messages_total");
    assert!(
        foreign >= 1.0,
        "the foreign messages were reported: {foreign}"
    );
    let skip: Vec<&str> = ["g0", "g1", "g2"]
        .iter()
        .flat_map(|k| ["--skip-key", k])
        .collect();
    let read = read_back_with(&pulsar, &topic, &skip);
    assert_exactly_once(&read, &hfp_pairs(None));
    let (code, report) = verify(&pulsar, &topic, Some(HFP_DISTINCT), &c.secret_file());
    assert_eq!(code, 0, "{report}");
    assert!(
        report.contains(&format!("foreign         {written}")),
        "{report}"
    );
}

/// The Pulsar admin API, by curl: `method` on `path` with a JSON `body`.
fn admin(pulsar: &Pulsar, method: &str, path: &str, body: Option<&str>) -> String {
    let mut c = Command::new("curl");
    c.args(["-sS", "-X", method, &format!("{}{path}", pulsar.admin_url)]);
    if let Some(b) = body {
        c.args(["-H", "Content-Type: application/json", "-d", b]);
    }
    let out = c.output().expect("curl runs");
    assert!(out.status.success(), "{method} {path}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Creates `topic` with its own `maxMessageSize` policy, and waits until
/// the broker reports it (topic policies travel through a system topic).
fn topic_with_max_message_size(pulsar: &Pulsar, topic: &str, bytes: usize) {
    let path = topic.strip_prefix("persistent://").unwrap();
    admin(pulsar, "PUT", &format!("/admin/v2/persistent/{path}"), None);
    let policy = format!("/admin/v2/persistent/{path}/maxMessageSize");
    wait_until(Duration::from_secs(60), "the topic's policy", || {
        admin(pulsar, "POST", &policy, Some(&bytes.to_string()));
        admin(pulsar, "GET", &policy, None).trim() == bytes.to_string()
    });
}

/// A node whose topic takes at most 64 KiB (a topic policy, below the
/// broker's and firstseen's own bounds), with `admin` or without the admin
/// API to read it. While it cannot reach Pulsar, 300 lines of the capture,
/// one 200 KiB message and 400 more lines are acked into its outbox, the big
/// message in the middle of a publish batch; then it reaches Pulsar and
/// publishes them all. Returns the node and what the topic must hold.
fn publish_a_big_message_to_a_small_topic(
    pulsar: &Pulsar,
    mqtt: &Mosquitto,
    topic: &str,
    admin: bool,
) -> (Node, std::collections::BTreeSet<(String, String)>) {
    topic_with_max_message_size(pulsar, topic, 64 * 1024);
    let mut spec = NodeSpec::new(mqtt, pulsar, topic);
    let real_url = spec.config.pulsar.url.clone();
    spec.config.pulsar.url = format!("pulsar://127.0.0.1:{}", free_port());
    if !admin {
        spec.config.pulsar.admin_url = None;
    }
    let mut node = Node::start(spec);
    wait_until(Duration::from_secs(30), "cluster level 2", || {
        node.status().is_some_and(|s| s.level.cluster >= 2)
    });
    let sent = replay(mqtt.port, &["--limit", "300", "--pace", "max"]).published;
    let big_topic = "/hfp/v2/journey/ongoing/vp/bus/big/1";
    publish(mqtt.port, big_topic, &vec![b'y'; 200 * 1024]);
    let after = replay(
        mqtt.port,
        &["--skip", "300", "--limit", "400", "--pace", "max"],
    )
    .published;
    wait_until(Duration::from_secs(60), "every message acked", || {
        node.metric("firstseen_acks_total") >= (sent + 1 + after) as f64
    });
    node.terminate(Duration::from_secs(20)).expect("stops");
    node.spec.config.pulsar.url = real_url;
    node.restart();
    let mut want = hfp_pairs(Some(400));
    want.insert((big_topic.to_string(), String::new()));
    node.wait_published(want.len() as u64, Duration::from_secs(120));
    (node, want)
}

/// The topic itself takes at most 64 KiB (a topic policy, below the
/// broker's and firstseen's own bounds). The node reads the policy through
/// the admin API when it takes the producer, and sends a larger message as
/// a marker in its place: nothing refused, nothing late, the topic whole.
#[test]
fn a_topic_that_takes_smaller_messages_gets_a_marker_in_place() {
    let Some(pulsar) = shared_pulsar("a_topic_that_takes_smaller_messages_gets_a_marker_in_place")
    else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("topic-limit");
    let (node, want) = publish_a_big_message_to_a_small_topic(&pulsar, &mqtt, &topic, true);
    assert!(node.metric("firstseen_set_aside_total") >= 1.0);
    assert_eq!(node.metric("firstseen_publish_refusals_total"), 0.0);
    assert_exactly_once(&read_back(&pulsar, &topic), &want);
    let (code, report) = verify(
        &pulsar,
        &topic,
        Some(want.len() as u64),
        &node.secret_file(),
    );
    assert_eq!(code, 0, "{report}");
    assert!(report.contains("set aside       1"), "{report}");
    assert!(!report.contains("late"), "{report}");
}

/// The same topic policy, but the node has no admin API to read it: the
/// broker itself refuses what goes over 64 KiB, the large message and also
/// any entry of smaller messages that adds up to more, while the entries
/// after a refused one land. The publisher must not skip what was refused
/// (the tail is already past it) nor send it for ever: it sends each refused
/// message again after them, one per entry, and once the large one is
/// refused alone twice, a marker goes instead, marked late. Nothing lost,
/// nothing twice, and verify accounts for it. Before, the publisher resumed
/// after the tail and a refused message was never in the topic; with
/// several entries in flight, a refused entry also broke the connection as
/// a receipt out of order, and its messages were skipped.
#[test]
fn a_message_the_broker_refuses_is_sent_late_and_then_set_aside() {
    let Some(pulsar) =
        shared_pulsar("a_message_the_broker_refuses_is_sent_late_and_then_set_aside")
    else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("broker-refuses");
    let (node, want) = publish_a_big_message_to_a_small_topic(&pulsar, &mqtt, &topic, false);
    let refusals = node.metric("firstseen_publish_refusals_total");
    assert!(refusals >= 2.0, "refused {refusals} times");
    assert!(node.metric("firstseen_set_aside_total") >= 1.0);
    // A message is late when a higher sequence came before it.
    let read = read_back(&pulsar, &topic);
    let late = read.late();
    assert!(
        !late.is_empty(),
        "the refused ones come late: {:?}",
        read.seqs
    );
    assert_eq!(
        node.metric("firstseen_published_late_total"),
        late.len() as f64
    );
    assert_exactly_once_with_late(&read, &want, &late);
    let (code, report) = verify(
        &pulsar,
        &topic,
        Some(want.len() as u64),
        &node.secret_file(),
    );
    assert_eq!(code, 0, "{report}");
    assert!(report.contains("set aside       1"), "{report}");
    assert!(
        report.contains(&format!("late            {} ", late.len())),
        "{report}"
    );
    eprintln!("{report}");
    let kept = node.set_aside();
    assert_eq!(kept.len(), 1, "{kept:?}");
    let (reason, _) = node.set_aside_message(kept[0]["id"].as_u64().unwrap());
    assert!(reason.contains("refused by the broker"), "{reason}");
}

/// Publishes `count` messages of `bytes` bytes each with paho-mqtt at QoS 1
/// on `prefix<i>`, each payload its own, waiting for every PUBACK; returns
/// the (topic, payload) pairs the Pulsar topic must hold.
fn publish_wide(
    port: u16,
    prefix: &str,
    count: usize,
    bytes: usize,
) -> std::collections::BTreeSet<(String, String)> {
    const SCRIPT: &str = r#"
import sys
import paho.mqtt.client as mqtt
port, prefix, count, size = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
c.max_inflight_messages_set(50)
c.connect("127.0.0.1", port)
c.loop_start()
infos = []
for i in range(count):
    body = (f"{i:06d}:" + "w" * size)[:size]
    infos.append(c.publish(f"{prefix}{i}", body.encode(), qos=1))
for info in infos:
    info.wait_for_publish(timeout=60)
c.loop_stop()
c.disconnect()
sys.exit(0 if all(i.is_published() for i in infos) else 1)
"#;
    let status = Command::new("python3")
        .args(["-c", SCRIPT])
        .args([
            port.to_string(),
            prefix.to_string(),
            count.to_string(),
            bytes.to_string(),
        ])
        .status()
        .expect("python3 runs");
    assert!(status.success(), "the broker took every message");
    (0..count)
        .map(|i| {
            let body: String = format!("{i:06}:{}", "w".repeat(bytes))
                .chars()
                .take(bytes)
                .collect();
            (format!("{prefix}{i}"), body)
        })
        .collect()
}

/// Issue 48, as the operator met it: the topic takes at most 64 KiB (its
/// own `maxMessageSize` policy), the node has no admin API to learn that,
/// and 300 acked messages of 40 KiB wait in the outbox, so that every
/// entry of two or more goes over the bound. Pulsar refuses a batched
/// entry naming its highest sequence id; the producer waited on its first,
/// dropped the refusal unread, and only the receipt timeout ended each
/// entry, abandoning the whole connection: `published_seq` stayed 0 for
/// minutes with "no receipt within" in the log. Now each refusal settles
/// its entry at once: everything is published once (refused messages
/// late, as in the test above), well within a bound that a receipt timeout
/// per refused entry would exceed, and no receipt times out.
#[test]
fn entries_the_broker_refuses_by_their_last_id_do_not_stall_the_topic() {
    let Some(pulsar) =
        shared_pulsar("entries_the_broker_refuses_by_their_last_id_do_not_stall_the_topic")
    else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("refused-entries");
    topic_with_max_message_size(&pulsar, &topic, 64 * 1024);
    let mut spec = NodeSpec::new(&mqtt, &pulsar, &topic);
    let real_url = spec.config.pulsar.url.clone();
    spec.config.pulsar.url = format!("pulsar://127.0.0.1:{}", free_port());
    spec.config.pulsar.admin_url = None;
    let receipt_wait = spec.config.pulsar.operation_timeout();
    let mut node = Node::start(spec);
    wait_until(Duration::from_secs(30), "cluster level 2", || {
        node.status().is_some_and(|s| s.level.cluster >= 2)
    });
    let want = publish_wide(
        mqtt.port,
        "/hfp/v2/journey/ongoing/vp/bus/wide/",
        300,
        40 * 1024,
    );
    wait_until(Duration::from_secs(60), "every message acked", || {
        node.metric("firstseen_acks_total") >= want.len() as f64
    });
    node.terminate(Duration::from_secs(20)).expect("stops");
    node.spec.config.pulsar.url = real_url;
    let started = std::time::Instant::now();
    node.restart();
    // 300 messages make 100 entries of three (two of 40 KiB are already
    // over 64 KiB); a receipt timeout for even a tenth of them would take
    // longer than this, and before the fix nothing was published at all.
    let bound = receipt_wait * 10;
    node.wait_published(want.len() as u64, bound);
    eprintln!("published in {:?}", started.elapsed());
    let refusals = node.metric("firstseen_publish_refusals_total");
    assert!(refusals >= 1.0, "the broker refused no entry: {refusals}");
    // No connection was abandoned for a receipt that did not come.
    let log = std::fs::read_to_string(node.log_path()).unwrap();
    let this_run = log.rsplit("===== start #").next().unwrap_or_default();
    assert!(
        !this_run.contains("no receipt within"),
        "a receipt timed out:\n{}",
        node.log_tail(40)
    );
    let read = read_back(&pulsar, &topic);
    let late = read.late();
    assert_exactly_once_with_late(&read, &want, &late);
    let (code, report) = verify(
        &pulsar,
        &topic,
        Some(want.len() as u64),
        &node.secret_file(),
    );
    assert_eq!(code, 0, "{report}");
}
