//! One node, whole path, real brokers: Mosquitto in, Apache Pulsar out.
//!
//! Every test publishes with paho-mqtt (tests/tools/replay.py) and checks the
//! result by reading the topic back with the official Python client and with
//! `firstseen verify`.

mod common;

use std::time::Duration;

use common::*;

/// The HFP capture twice, plus injected upstream duplicates: one copy per
/// distinct topic+payload, numbered 1..=4956.
#[test]
fn replay_twice_keeps_exactly_one_copy_per_key() {
    let Some(pulsar) = shared_pulsar("replay_twice_keeps_exactly_one_copy_per_key") else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("replay-twice");
    let node = Node::start(NodeSpec::new(&mqtt, &pulsar, &topic));

    let r = replay(mqtt.port, &["--times", "2", "--dup-every", "7"]);
    assert_eq!(
        r.distinct, HFP_DISTINCT,
        "the capture holds 4,956 distinct pairs"
    );
    assert!(
        r.published > 2 * 5_000,
        "duplicates were injected on top of two replays"
    );
    eprintln!("replayed {} messages at {:.0} msg/s", r.published, r.rate);

    node.wait_published(HFP_DISTINCT, Duration::from_secs(120));
    // The last batches may hold only duplicates and commit after the last
    // first copy was published.
    wait_until(Duration::from_secs(30), "every copy committed", || {
        node.status()
            .is_some_and(|s| s.totals.observed == r.published)
    });
    let s = node.status().unwrap();
    assert_eq!(s.totals.observed, r.published);
    assert_eq!(s.totals.duplicates, r.published - HFP_DISTINCT);

    assert_exactly_once(&read_back(&pulsar, &topic), &hfp_pairs(None));
    let (code, report) = verify(&pulsar, &topic, Some(HFP_DISTINCT), &node.secret_file());
    assert_eq!(code, 0, "verify failed:\n{report}");
    assert!(report.contains("firstseen-seq   1..=4956"), "{report}");
}

/// SIGKILL in the middle of a replay, then restart: the persistent session
/// redelivers what was not acked, and dedup absorbs what was.
#[test]
fn sigkill_mid_replay_loses_nothing_and_doubles_nothing() {
    let Some(pulsar) = shared_pulsar("sigkill_mid_replay_loses_nothing_and_doubles_nothing") else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("sigkill");
    let mut node = Node::start(NodeSpec::new(&mqtt, &pulsar, &topic));
    node.wait_ready();

    let replay = replay_cmd(mqtt.port, &["--pace", "1500"]).spawn().unwrap();
    wait_until(
        Duration::from_secs(30),
        "the node to have taken part of the feed",
        || node.status().is_some_and(|s| s.totals.observed > 1_000),
    );
    node.kill9();
    let out = replay.wait_with_output().unwrap();
    assert!(out.status.success());
    let r = parse_replay(&out.stdout);
    assert_eq!(r.published, 5_000);

    node.restart();
    node.wait_published(HFP_DISTINCT, Duration::from_secs(120));
    assert_exactly_once(&read_back(&pulsar, &topic), &hfp_pairs(None));
    let (code, report) = verify(&pulsar, &topic, Some(HFP_DISTINCT), &node.secret_file());
    assert_eq!(code, 0, "verify failed:\n{report}");
}

/// G4 and G5 together. With Pulsar unreachable and an outbox quota of one
/// byte, the first batch fills the outbox and every later batch waits
/// uncommitted — and so unacked. A SIGKILL then throws away everything the
/// node held in memory. If anything had been acked before its commit, the
/// broker would not redeliver it and it would be missing at the end.
#[test]
fn nothing_is_acked_before_commit() {
    let Some(pulsar) = shared_pulsar("nothing_is_acked_before_commit") else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("ack-after-commit");
    let mut spec = NodeSpec::new(&mqtt, &pulsar, &topic);
    spec.config.pulsar.url = format!("pulsar://127.0.0.1:{}", free_port());
    spec.config.pulsar.admin_url = None;
    spec.config.outbox.quota_bytes = 1;
    let mut node = Node::start(spec);
    node.wait_ready();

    let r = replay(mqtt.port, &["--pace", "max"]);
    assert_eq!(r.published, 5_000);
    wait_until(
        Duration::from_secs(30),
        "backpressure with a non-empty outbox",
        || node.status().is_some_and(|s| s.totals.outbox_messages > 0),
    );
    let held = node.status().unwrap();
    let committed = held.totals.observed;
    assert!(
        committed < 5_000,
        "backpressure must hold most of the feed uncommitted (committed {committed})"
    );
    wait_until(
        Duration::from_secs(10),
        "the upstream to report the backlog",
        || node.log_tail(200).contains("outbox over quota"),
    );
    node.kill9();

    // Same data, a reachable Pulsar and a normal quota.
    node.spec.config.pulsar.url = pulsar.url.clone();
    node.spec.config.outbox.quota_bytes = 1 << 30;
    node.restart();
    node.wait_published(HFP_DISTINCT, Duration::from_secs(120));
    let s = node.status().unwrap();
    let redelivered = s.upstreams[0].received;
    assert!(
        redelivered >= 5_000 - committed,
        "the broker redelivered {redelivered} messages; at least {} were never committed",
        5_000 - committed
    );
    assert_exactly_once(&read_back(&pulsar, &topic), &hfp_pairs(None));
}

/// Pulsar down for a while: the node keeps committing into its outbox and
/// acking upstream; when Pulsar returns the outbox drains in order.
#[test]
fn pulsar_outage_buffers_in_the_outbox_and_drains_in_order() {
    if shared_pulsar("pulsar_outage_buffers_in_the_outbox_and_drains_in_order").is_none() {
        return;
    }
    // A broker of this test's own, so stopping it disturbs no other test.
    let own = OwnPulsar::start();
    let mqtt = Mosquitto::start();
    let topic = unique_topic("outage");
    let mut spec = NodeSpec::new(&mqtt, &own.pulsar, &topic);
    // Small entries and a snapshot every 10 of them, so the log is purged
    // past messages still waiting for Pulsar: their payloads are only in the
    // log, which must keep those entries, also across the crash below.
    spec.config.batch.max_messages = 50;
    spec.config.cluster.snapshot_logs = 10;
    let mut node = Node::start(spec);
    node.wait_ready();

    replay(mqtt.port, &["--limit", "1000", "--pace", "max"]);
    let first: u64 = hfp_pairs(Some(1000)).len() as u64;
    node.wait_published(first, Duration::from_secs(60));

    own.stop();
    let r = replay(mqtt.port, &["--skip", "1000", "--pace", "max"]);
    assert_eq!(r.published, 4_000);
    wait_until(
        Duration::from_secs(60),
        "the rest of the feed committed into the outbox",
        || {
            node.status()
                .is_some_and(|s| s.totals.observed == 5_000 && s.totals.outbox_messages > 0)
        },
    );
    let during = node.status().unwrap();
    let backlog = during.totals.outbox_messages;
    assert_eq!(
        backlog,
        HFP_DISTINCT - first,
        "everything after the outage waits in the outbox"
    );
    // A crash while it waits: the restarted node finds the outbox in its last
    // checkpoint and the payloads in its log.
    node.kill9();
    node.restart();
    node.wait_ready();
    wait_until(
        Duration::from_secs(60),
        "the outbox back after the crash, from the checkpoint and the log",
        || {
            node.status()
                .is_some_and(|s| s.totals.outbox_messages == backlog)
        },
    );

    own.restart();
    node.wait_published(HFP_DISTINCT, Duration::from_secs(180));
    assert_exactly_once(&read_back(&own.pulsar, &topic), &hfp_pairs(None));
    node.kill9();
}

/// A batching producer writes many messages as one entry. firstseen's
/// publisher sends each message as an entry of its own (a batching one
/// measured slower; docs/benchmarks.md, "Tried and reverted"), but its
/// readers must not rest on that. A new leader resumes after the topic's
/// last `firstseen-seq`, so the tail read must take the last message of the
/// last entry, not its first; and `firstseen verify` must read that entry
/// whole. Two entries are written here, of three messages and of two. Read
/// as the first message of the last entry, the tail is 4, and a new leader
/// would send message 5 twice.
#[test]
fn the_tail_of_a_topic_ending_in_a_batch_is_its_last_message() {
    let Some(pulsar) = shared_pulsar("the_tail_of_a_topic_ending_in_a_batch_is_its_last_message")
    else {
        return;
    };
    let topic = unique_topic("tail-batch");
    let secret_dir = tempfile::TempDir::new().unwrap();
    let secret_file = secret_dir.path().join("cluster.secret");
    std::fs::write(&secret_file, "a test secret of more than thirty-two bytes").unwrap();
    let ours = firstseen::publish::tail::Ours::new(
        &firstseen::cluster::wire::ClusterKey::from_secret(&std::fs::read(&secret_file).unwrap()),
        &[],
        false,
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let tail = rt.block_on(async {
        let config = firstseen::config::PulsarConfig::new(pulsar.url.clone());
        let client = firstseen::publish::connect(&config).await.unwrap();
        let mut producer = client
            .producer()
            .with_topic(&topic)
            // Named as firstseen names its producers, and each message
            // proven: the tail counts only the cluster's messages.
            .with_name(ours.producer_name("test-batch"))
            .with_options(pulsar::producer::ProducerOptions {
                batch_size: Some(100),
                // Long enough that only send_batch sends an entry.
                batch_timeout: Some(Duration::from_secs(60)),
                ..Default::default()
            })
            .build()
            .await
            .unwrap();
        let mut entries = Vec::new();
        for seqs in [1..=3u64, 4..=5] {
            let mut receipts = Vec::new();
            for seq in seqs {
                let key = format!("{seq:064x}");
                let body = format!("payload {seq}").into_bytes();
                let proof = ours.proofs().sign(&firstseen::publish::proof::Claim {
                    topic: &topic,
                    seq,
                    key: &firstseen::publish::proof::key_of(&key).unwrap(),
                    marker: false,
                    body: &body,
                });
                receipts.push(
                    producer
                        .create_message()
                        .with_content(body)
                        .with_key(key.clone())
                        .with_property(firstseen::publish::props::SEQ, seq.to_string())
                        .with_property(firstseen::publish::props::KEY, key)
                        .with_property(firstseen::publish::props::PROOF, proof)
                        .send_non_blocking()
                        .await
                        .unwrap(),
                );
            }
            producer.send_batch().await.unwrap();
            for r in receipts {
                let id = r.await.unwrap().message_id.unwrap();
                entries.push((id.ledger_id, id.entry_id));
            }
        }
        entries.dedup();
        assert_eq!(entries.len(), 2, "two entries of 3 and 2 messages");
        firstseen::publish::tail::last_seq(
            &client,
            &ours,
            firstseen::publish::tail::TailQuery {
                topic: &topic,
                assigned: 5,
                strict: true,
                budget: Duration::from_secs(30),
            },
        )
        .await
        .unwrap()
    });
    assert_eq!(
        tail.seq,
        Some(5),
        "the tail is the last message of the last entry"
    );
    let (code, report) = verify(&pulsar, &topic, Some(5), &secret_file);
    assert_eq!(
        code, 0,
        "verify reads every message of the last entry: {report}"
    );
}
