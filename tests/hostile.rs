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
    let (code, report) = verify(&pulsar, &topic, Some(HFP_DISTINCT));
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
    let (code, report) = verify(&pulsar, &topic, Some(HFP_DISTINCT));
    assert_eq!(code, 0, "{report}");
    assert!(report.contains("foreign         2"), "{report}");
}
