//! The tail read on the real brokers (issue 48): what a new producer finds
//! at the end of its topic decides where it resumes and what goes late.
//! One foreign entry of 150,000 tiny messages must not wear the read's
//! bound out, and what the broker refused must still reach the topic when
//! the leader that saw the refusal is gone. Results are read back with the
//! official Pulsar client and `firstseen verify`.

mod common;

use std::process::Command;
use std::time::Duration;

use common::cluster::TestCluster;
use common::*;

/// Writes one batched entry of `n` tiny messages, without firstseen's
/// properties, into `topic` with the official client.
fn write_one_big_entry(pulsar: &Pulsar, topic: &str, n: usize) {
    let script = r#"
import logging, os, sys, pulsar
url, topic, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
log = logging.getLogger("w"); log.setLevel(logging.ERROR)
client = pulsar.Client(url, logger=log, operation_timeout_seconds=30)
# One entry: the batch holds every message, and nothing sends it before
# the flush.
producer = client.create_producer(
    topic, batching_enabled=True, batching_max_messages=n,
    batching_max_allowed_size_in_bytes=4 * 1024 * 1024,
    batching_max_publish_delay_ms=600000, max_pending_messages=n,
    block_if_queue_full=True)
ids = []
for _ in range(n):
    producer.send_async(b"x", lambda res, mid: ids.append((mid.ledger_id(), mid.entry_id())))
producer.flush()
producer.close()
print(len(set(ids)), len(ids), flush=True)
os._exit(0)
"#;
    let out = Command::new("python3")
        .args(["-c", script, &pulsar.url, topic, &n.to_string()])
        .output()
        .expect("python3 runs");
    assert!(out.status.success(), "the writer wrote: {out:?}");
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(said.trim(), format!("1 {n}"), "one entry of {n} messages");
}

/// A foreign producer wrote one batched entry of 150,000 tiny messages into
/// the topic before the cluster's first message; the cluster publishes
/// after it, and its leader is killed mid-replay. The tail read of each new
/// producer reads the whole last ledger, that entry included. It counted
/// messages against a bound of 100,000: the entry used it up, the read
/// never reached the cluster's messages after it, and each new producer
/// resumed after the watermark (`firstseen_tail_cut_short_total`), sending
/// again what had landed since. Counted by entries, the read takes the
/// entry whole and finds the cluster's tail: every key once.
#[test]
fn one_foreign_entry_of_150_000_messages_sends_nothing_twice() {
    let Some(pulsar) = shared_pulsar("one_foreign_entry_of_150_000_messages_sends_nothing_twice")
    else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("big-foreign-entry");
    write_one_big_entry(&pulsar, &topic, 150_000);
    let mut c = TestCluster::start(&mqtt, &pulsar, &topic, 3, |_| {});
    c.wait_ready();
    let leader = c.wait_leader(None, Duration::from_secs(30));
    replay(mqtt.port, &["--limit", "2500", "--pace", "max"]);
    let first = hfp_pairs(Some(2500)).len() as u64;
    c.node(leader)
        .wait_published(first, Duration::from_secs(60));
    let short = c.node(leader).metric("firstseen_tail_cut_short_total");
    assert_eq!(
        short,
        0.0,
        "the first producer's tail read reached its bound: {}",
        c.node(leader).log_tail(20)
    );
    // The first producer found only the foreign entry in the topic, and
    // read all of it. (A successor may stop before it: it finds the
    // watermark's successor among the dead leader's messages first.)
    let foreign = c.node(leader).metric("firstseen_foreign_messages_total");
    assert!(foreign >= 150_000.0, "the entry read whole: {foreign}");
    // While the rest goes at the capture's pace, the leader dies with
    // receipts ahead of the committed watermark.
    let (mut load, old, _, successor) =
        c.kill_leader_mid_replay(&["--skip", "2500", "--pace", "600"], first + 300);
    assert!(load.wait().unwrap().success(), "the load ran");
    c.node(successor)
        .wait_published(HFP_DISTINCT, Duration::from_secs(120));
    let short = c.node(successor).metric("firstseen_tail_cut_short_total");
    assert_eq!(
        short,
        0.0,
        "the successor's tail read reached its bound: {}",
        c.node(successor).log_tail(20)
    );
    c.node(old).restart();
    let read = read_back_with(&pulsar, &topic, &["--skip-key", ""]);
    assert_exactly_once(&read, &hfp_pairs(None));
    let (code, report) = verify(&pulsar, &topic, Some(HFP_DISTINCT), &c.secret_file());
    assert_eq!(code, 0, "{report}");
    assert!(report.contains("foreign         150000"), "{report}");
}

/// Another exclusive producer that takes the topic the moment the node
/// lets go of it: it waits until the node holds the topic (its own
/// attempt refused), then asks again every 2 ms; the node, after an error,
/// waits 200 ms before it asks. The crate's client, with its own retries
/// off: the official one retries a refused producer inside for the whole
/// operation timeout and missed the gap. Says when it holds the topic on
/// the receiver; lets go when the sender is dropped.
fn take_the_topic_when_released(
    pulsar: &Pulsar,
    topic: &str,
) -> (std::sync::mpsc::Receiver<()>, std::sync::mpsc::Sender<()>) {
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let (url, topic) = (pulsar.url.clone(), topic.to_string());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let config = firstseen::config::PulsarConfig::new(url);
            let client = firstseen::publish::connect(&config).await.unwrap();
            let take = || async {
                client
                    .producer()
                    .with_topic(&topic)
                    .with_options(pulsar::producer::ProducerOptions {
                        access_mode: Some(1), // Exclusive
                        ..Default::default()
                    })
                    .build()
                    .await
                    .ok()
            };
            // Nobody held it yet: let the node take it first.
            while let Some(mut p) = take().await {
                let _ = p.close().await;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let deadline = std::time::Instant::now() + Duration::from_secs(120);
            let mut held = None;
            while held.is_none() && std::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(2)).await;
                held = take().await;
            }
            let Some(mut p) = held else {
                return;
            };
            let _ = held_tx.send(());
            let _ = tokio::task::spawn_blocking(move || release_rx.recv()).await;
            let _ = p.close().await;
        });
    });
    (held_rx, release_tx)
}

/// The broker refuses entries (a topic that takes 64 KiB at most, which the
/// node learns only by refusal) while later entries land. The refused
/// messages were held in the leader's memory only, to go late once it had
/// the topic again; here another producer takes the topic the moment the
/// node lets go, and the node is killed while it waits. Before, the
/// restarted node resumed after the tail and the refused messages were
/// never published (a gap). Now the tail read finds what the topic lacks
/// between the watermark and the tail, and sends it late: every message
/// once.
#[test]
fn refused_messages_a_dead_leader_held_are_sent_late() {
    let Some(pulsar) = shared_pulsar("refused_messages_a_dead_leader_held_are_sent_late") else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("refused-then-killed");
    let path = topic.strip_prefix("persistent://").unwrap();
    let admin = |method: &str, what: &str, body: Option<&str>| {
        let mut c = Command::new("curl");
        c.args(["-sS", "-X", method]).arg(format!(
            "{}/admin/v2/persistent/{path}{what}",
            pulsar.admin_url
        ));
        if let Some(b) = body {
            c.args(["-H", "Content-Type: application/json", "-d", b]);
        }
        String::from_utf8_lossy(&c.output().expect("curl runs").stdout).into_owned()
    };
    admin("PUT", "", None);
    wait_until(Duration::from_secs(60), "the topic's policy", || {
        admin("POST", "/maxMessageSize", Some("65536"));
        admin("GET", "/maxMessageSize", None).trim() == "65536"
    });
    // First no broker: the whole capture waits in the outbox.
    let mut spec = NodeSpec::new(&mqtt, &pulsar, &topic);
    let real_url = spec.config.pulsar.url.clone();
    spec.config.pulsar.url = format!("pulsar://127.0.0.1:{}", free_port());
    // Without the admin API the node learns the topic's bound by refusal.
    spec.config.pulsar.admin_url = None;
    let mut node = Node::start(spec);
    wait_until(Duration::from_secs(30), "cluster level 2", || {
        node.status().is_some_and(|s| s.level.cluster >= 2)
    });
    let sent = replay(mqtt.port, &["--limit", "1500", "--pace", "max"]).published;
    wait_until(Duration::from_secs(60), "every message acked", || {
        node.metric("firstseen_acks_total") >= sent as f64
    });
    node.terminate(Duration::from_secs(20)).expect("stops");
    let (held, release) = take_the_topic_when_released(&pulsar, &topic);
    node.spec.config.pulsar.url = real_url;
    node.restart();
    assert!(
        held.recv_timeout(Duration::from_secs(180)).is_ok(),
        "the other producer took the topic: {}",
        node.log_tail(40)
    );
    // The node let go because the broker refused an entry; what it holds
    // back is in its memory only.
    wait_until(Duration::from_secs(30), "a refusal", || {
        node.metric("firstseen_publish_refusals_total") >= 1.0
    });
    assert_eq!(node.metric("firstseen_published_late_total"), 0.0);
    node.kill9();
    drop(release);
    node.restart();
    let want = hfp_pairs(Some(1500));
    node.wait_published(want.len() as u64, Duration::from_secs(180));
    let read = read_back(&pulsar, &topic);
    let late = read.late();
    eprintln!("late: {} messages", late.len());
    assert_exactly_once_with_late(&read, &want, &late);
    let (code, report) = verify(
        &pulsar,
        &topic,
        Some(want.len() as u64),
        &node.secret_file(),
    );
    assert_eq!(code, 0, "{report}");
}

/// The last ledger of the topic holds 101,000 foreign entries of one
/// message each (the topic unloaded first, as after a broker restart): more
/// than the tail read takes ([`firstseen::publish::tail::MAX_ENTRIES`]). It
/// stops at its bound, or at its time, without finding the cluster's
/// messages in the ledger before, and the publisher resumes after the
/// committed watermark: every message once, nothing wedged.
#[test]
fn a_last_ledger_of_more_entries_than_the_bound_ends_in_the_watermark() {
    let Some(pulsar) =
        shared_pulsar("a_last_ledger_of_more_entries_than_the_bound_ends_in_the_watermark")
    else {
        return;
    };
    let entries = firstseen::publish::tail::MAX_ENTRIES as usize + 1_000;
    let mqtt = Mosquitto::start();
    let topic = unique_topic("many-foreign-entries");
    let mut node = Node::start(NodeSpec::new(&mqtt, &pulsar, &topic));
    node.wait_ready();
    replay(mqtt.port, &["--limit", "1000", "--pace", "max"]);
    let first = hfp_pairs(Some(1000)).len() as u64;
    node.wait_published(first, Duration::from_secs(60));
    assert!(node.terminate(Duration::from_secs(30)).is_some());
    let path = topic.strip_prefix("persistent://").unwrap();
    let out = Command::new("curl")
        .args(["-sSf", "-X", "PUT"])
        .arg(format!(
            "{}/admin/v2/persistent/{path}/unload",
            pulsar.admin_url
        ))
        .output()
        .expect("curl runs");
    assert!(out.status.success(), "unload: {out:?}");
    let script = r#"
import logging, os, sys, pulsar
url, topic, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
log = logging.getLogger("w"); log.setLevel(logging.ERROR)
client = pulsar.Client(url, logger=log, operation_timeout_seconds=30)
# An entry per message.
producer = client.create_producer(topic, batching_enabled=False,
    max_pending_messages=5000, block_if_queue_full=True)
for _ in range(n):
    producer.send_async(b"x", None)
producer.flush()
producer.close()
os._exit(0)
"#;
    let status = Command::new("python3")
        .args(["-c", script, &pulsar.url, &topic, &entries.to_string()])
        .status()
        .expect("python3 runs");
    assert!(status.success(), "the foreign writer wrote");
    replay(mqtt.port, &["--skip", "1000", "--pace", "max"]);
    node.restart();
    node.wait_published(HFP_DISTINCT, Duration::from_secs(120));
    assert!(
        node.metric("firstseen_tail_cut_short_total") >= 1.0,
        "the tail read stopped at its bound: {}",
        node.log_tail(30)
    );
    let read = read_back_with(&pulsar, &topic, &["--skip-key", ""]);
    assert_exactly_once(&read, &hfp_pairs(None));
}

/// Copies the message numbered `seq` in `topic` (properties, key, payload:
/// its proof holds) to the topic's end with the official client, as anyone
/// with a producer on the topic can while no node holds it.
fn replay_message(pulsar: &Pulsar, topic: &str, seq: u64) {
    let script = r#"
import logging, os, sys, pulsar
url, topic, seq = sys.argv[1], sys.argv[2], sys.argv[3]
log = logging.getLogger("w"); log.setLevel(logging.ERROR)
client = pulsar.Client(url, logger=log, operation_timeout_seconds=30)
reader = client.create_reader(topic, pulsar.MessageId.earliest)
while True:
    m = reader.read_next(timeout_millis=30000)
    if m.properties().get("firstseen-seq") == seq:
        break
producer = client.create_producer(topic, batching_enabled=False)
producer.send(m.data(), properties=m.properties(), partition_key=m.partition_key())
producer.close()
print("copied", flush=True)
os._exit(0)
"#;
    let out = Command::new("python3")
        .args(["-c", script, &pulsar.url, topic, &seq.to_string()])
        .output()
        .expect("python3 runs");
    assert!(out.status.success(), "the copier: {out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "copied");
}

/// The review's replay (G2): a leader dies with everything published but
/// none of its `Published` entries committed (its watermark 0), 1,500
/// entries of one message each in the topic; before the next publisher
/// comes, an outsider copies proven message 1 to the topic's end. The tail
/// read's first window (the last 64 entries) holds 1438..=1500 and the
/// copy. Counted as the watermark's witness, the copy stopped the read
/// there, and 2..=1437 went again, late. Now it lies after higher messages
/// and counts for nothing: every key once, apart from the copy.
///
/// The uncommitted watermark is the node's data directory as it was before
/// it published (a copy taken while it was stopped): what a successor
/// holds when the leader's `Published` entries never reached a majority.
#[test]
fn a_replayed_message_at_the_end_sends_nothing_again() {
    let Some(pulsar) = shared_pulsar("a_replayed_message_at_the_end_sends_nothing_again") else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("replayed-at-the-end");
    let mut spec = NodeSpec::new(&mqtt, &pulsar, &topic);
    // One message per entry: the dead leader's run spans many windows.
    spec.config.pulsar.publish_batch = 1;
    // First no broker: the whole capture waits in the outbox.
    let real_url = spec.config.pulsar.url.clone();
    spec.config.pulsar.url = format!("pulsar://127.0.0.1:{}", free_port());
    let mut node = Node::start(spec);
    wait_until(Duration::from_secs(30), "cluster level 2", || {
        node.status().is_some_and(|s| s.level.cluster >= 2)
    });
    let sent = replay(mqtt.port, &["--limit", "1500", "--pace", "max"]).published;
    wait_until(Duration::from_secs(60), "every message acked", || {
        node.metric("firstseen_acks_total") >= sent as f64
    });
    node.terminate(Duration::from_secs(20)).expect("stops");
    let want = hfp_pairs(Some(1500));
    let n = want.len() as u64;
    let data = node.data_dir();
    let saved = data.with_file_name("data-before-publishing");
    let cp = |from: &std::path::Path, to: &std::path::Path| {
        let _ = std::fs::remove_dir_all(to);
        let status = Command::new("cp").arg("-a").arg(from).arg(to).status();
        assert!(status.expect("cp runs").success(), "cp -a {from:?} {to:?}");
    };
    cp(&data, &saved);
    node.spec.config.pulsar.url = real_url;
    node.restart();
    node.wait_published(n, Duration::from_secs(120));
    node.kill9();
    cp(&saved, &data);
    replay_message(&pulsar, &topic, 1);
    node.restart();
    node.wait_published(n, Duration::from_secs(120));
    let read = read_back(&pulsar, &topic);
    // The copy is the last message; without it, every key once in order.
    let mut seen = std::collections::BTreeSet::new();
    let again: Vec<u64> = read
        .seqs
        .iter()
        .flatten()
        .filter(|s| !seen.insert(**s))
        .copied()
        .collect();
    assert_eq!(
        (read.count, read.keys_with_copies),
        (n + 1, 1),
        "sent again: {} sequences, the first {:?}; {}",
        again.len(),
        &again[..again.len().min(10)],
        node.log_tail(20)
    );
    assert_eq!(read.distinct_keys, n);
    let mut want_seqs: Vec<Option<u64>> = (1..=n).map(Some).collect();
    want_seqs.push(Some(1));
    assert!(read.seqs == want_seqs, "not 1..={n} then the copy of 1");
    assert_eq!(node.metric("firstseen_published_late_total"), 0.0);
    let got: std::collections::BTreeSet<(String, String)> = read.pairs.iter().cloned().collect();
    assert_eq!(got, want);
}

/// The tail read decides where a new leader resumes, so it must tell a
/// topic with nothing in it from one it could not read: taking an
/// unreadable topic for an empty one resumes after the watermark, and
/// sends again what landed past it. A topic no one has written reads as
/// empty (the broker's own answer, its last message id -1); a topic whose
/// lookup the broker refuses (its namespace does not exist: the broker
/// answers with an error code, as it does for a missing topic when it
/// creates none) and a read out of time are errors, never empty. With
/// the read planted to take any error for "nothing there", the last two
/// came back empty.
#[test]
fn a_tail_read_tells_an_empty_topic_from_one_it_could_not_read() {
    use firstseen::publish::tail::{self, Ours, TailQuery};
    use firstseen::publish::{Error, TopicProblem};
    let Some(pulsar) = shared_pulsar("a_tail_read_tells_an_empty_topic_from_one_it_could_not_read")
    else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut config = firstseen::publish::config::PulsarConfig::new(pulsar.url.clone());
        config.operation_timeout_ms = 10_000;
        let client = firstseen::publish::connect(&config).await.unwrap();
        let ours = Ours::new(
            &firstseen::secret::ClusterKey::from_secret(b"s"),
            &[],
            false,
        );
        let query = |topic| TailQuery {
            topic,
            assigned: 0,
            strict: true,
            budget: Duration::from_secs(30),
        };
        let fresh = unique_topic("tail-never-written");
        let t = tail::landed(&client, &ours, query(&fresh), 0)
            .await
            .expect("a topic no one has written reads");
        assert_eq!(
            (t.seq, t.cut_short, t.foreign, t.forged),
            (None, false, 0, 0)
        );
        assert_eq!(t.missing, Some(Vec::new()));

        let absent = unique_topic("tail-no-namespace").replace(
            "persistent://public/default/",
            "persistent://public/firstseen-absent-namespace/",
        );
        assert!(absent.contains("firstseen-absent-namespace"), "{absent}");
        // The broker's answer, by its code: what a missing topic gets
        // when the broker creates none.
        match tail::last_seq(&client, &ours, query(&absent)).await {
            Err(Error::Node(firstseen::Error::Pulsar(pulsar::Error::ServiceDiscovery(
                pulsar::error::ServiceDiscoveryError::Query(Some(code), _),
            )))) => assert_eq!(code, pulsar::proto::ServerError::TopicNotFound),
            other => panic!("a topic the broker would not look up read as {other:?}"),
        }

        let out_of_time = TailQuery {
            budget: Duration::ZERO,
            ..query(&fresh)
        };
        match tail::last_seq(&client, &ours, out_of_time).await {
            Err(Error::Topic {
                problem: TopicProblem::TailTimedOut,
                ..
            }) => {}
            other => panic!("a read out of time read as {other:?}"),
        }
    });
}
