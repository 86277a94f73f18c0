//! The publisher's own producer on the real broker (`src/publish/producer`):
//! batched entries with several in flight, exclusive access, the topic's
//! lookup again after the broker moves it, and what readers make of the
//! entries. Driven through the node's Pulsar adapter, as the publisher
//! drives it; read back with the official Python client, the `pulsar`
//! crate's consumer and `firstseen verify`.

mod common;

use std::time::Duration;

use common::*;
use firstseen::publish::adapter::PulsarBroker;
use firstseen::publish::port::{Broker, Receipt, SendError, Sending, Session};
use firstseen::publish::tail::Ours;
use firstseen::secret::ClusterKey;
use firstseen_store::{OutboxMessage, StateStore};
use futures::StreamExt;

struct Setup {
    broker: PulsarBroker,
    ours: Ours,
    secret: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

fn setup(pulsar: &Pulsar) -> Setup {
    let dir = tempfile::TempDir::new().unwrap();
    let secret = dir.path().join("cluster.secret");
    std::fs::write(
        &secret,
        "a producer test's secret, thirty-two bytes or more",
    )
    .unwrap();
    let key = ClusterKey::from_secret(&std::fs::read(&secret).unwrap());
    let ours = Ours::new(&key, &[], false);
    let db = sled::open(dir.path().join("state")).unwrap();
    let mut config = firstseen::config::PulsarConfig::new(pulsar.url.clone());
    config.admin_url = Some(pulsar.admin_url.clone());
    Setup {
        broker: PulsarBroker {
            config,
            state: StateStore::open(&db).unwrap(),
            ours: ours.clone(),
        },
        ours,
        secret,
        _dir: dir,
    }
}

fn message(seq: u64) -> OutboxMessage {
    OutboxMessage {
        key: *blake3::hash(format!("producer test {seq}").as_bytes()).as_bytes(),
        mqtt_topic: format!("/hfp/v2/test/{seq}"),
        payload: format!("payload {seq}").into_bytes(),
        node: 1,
        first_seen_ms: 1_700_000_000_000 + seq,
        properties: None,
    }
}

/// Sends `seqs` on `producer` as one publisher batch: queued, flushed, then
/// every receipt awaited in order.
async fn send_all(
    session: &impl Session<Producer = firstseen::publish::producer::Producer>,
    producer: &mut firstseen::publish::producer::Producer,
    seqs: std::ops::RangeInclusive<u64>,
) -> Result<(), SendError> {
    let mut receipts: Vec<Receipt> = Vec::new();
    for seq in seqs {
        receipts.push(
            session
                .send(producer, seq, message(seq), Sending::default())
                .await?,
        );
    }
    session.flush(producer).await?;
    for r in receipts {
        r.await?;
    }
    Ok(())
}

/// Distinct (ledger, entry) pairs holding the topic's messages, and how
/// many messages carried a batch index: read with the `pulsar` crate's
/// consumer, which splits batched entries.
async fn entries_of(pulsar: &Pulsar, topic: &str, expect: usize) -> (usize, usize) {
    let client =
        firstseen::publish::connect(&firstseen::config::PulsarConfig::new(pulsar.url.clone()))
            .await
            .unwrap();
    let mut consumer: pulsar::Consumer<Vec<u8>, _> = client
        .consumer()
        .with_topic(topic)
        .with_subscription(format!("entries-{}", std::process::id()))
        .with_subscription_type(pulsar::SubType::Exclusive)
        .with_options(pulsar::ConsumerOptions {
            initial_position: pulsar::consumer::InitialPosition::Earliest,
            ..Default::default()
        })
        .build()
        .await
        .unwrap();
    let mut entries = std::collections::BTreeSet::new();
    let mut indexed = 0;
    for _ in 0..expect {
        let m = tokio::time::timeout(Duration::from_secs(30), consumer.next())
            .await
            .expect("a message within 30 s")
            .unwrap()
            .unwrap();
        let id = m.message_id();
        entries.insert((id.ledger_id, id.entry_id));
        indexed += usize::from(id.batch_index.is_some());
    }
    (entries.len(), indexed)
}

/// 600 messages in three publisher batches land once each, in order, in far
/// fewer entries than messages; a second exclusive producer (on the same
/// connection or another) is refused as held elsewhere; the tail read, the
/// official client and `firstseen verify` all read the batched entries.
#[test]
fn messages_sent_together_share_entries_and_read_back_once_in_order() {
    let Some(pulsar) =
        shared_pulsar("messages_sent_together_share_entries_and_read_back_once_in_order")
    else {
        return;
    };
    let topic = unique_topic("producer-batches");
    let s = setup(&pulsar);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let session = s.broker.connect().await.unwrap();
        let mut producer = session
            .exclusive(&topic, &s.ours.producer_name("1-t1-a"))
            .await
            .unwrap();
        let again = session
            .exclusive(&topic, &s.ours.producer_name("1-t1-b"))
            .await;
        assert!(
            matches!(again, Err(SendError::HeldElsewhere(_))),
            "a second producer on the same connection: {:?}",
            again.err()
        );
        let other = s.broker.connect().await.unwrap();
        let elsewhere = other
            .exclusive(&topic, &s.ours.producer_name("2-t2-a"))
            .await;
        assert!(
            matches!(elsewhere, Err(SendError::HeldElsewhere(_))),
            "a second producer from another node: {:?}",
            elsewhere.err()
        );
        for batch in [1..=200u64, 201..=400, 401..=600] {
            send_all(&session, &mut producer, batch).await.unwrap();
        }
        let tail = session.last_seq(&topic, 600, true).await.unwrap();
        assert_eq!(tail.seq, Some(600), "the tail read: {tail:?}");
        let (entries, indexed) = entries_of(&pulsar, &topic, 600).await;
        eprintln!("600 messages in {entries} entries");
        assert!(entries <= 6, "600 messages took {entries} entries");
        assert_eq!(indexed, 600, "every message read with its batch index");
    });
    let back = read_back(&pulsar, &topic);
    assert_eq!(back.count, 600);
    assert_eq!(back.distinct_keys, 600);
    let seqs: Vec<u64> = back.seqs.iter().map(|s| s.unwrap()).collect();
    assert_eq!(seqs, (1..=600).collect::<Vec<_>>(), "in order, once each");
    let (code, out) = verify(&pulsar, &topic, Some(600), &s.secret);
    assert_eq!(code, 0, "verify: {out}");
}

/// The broker unloads the topic under a live producer: the producer's
/// sends fail as lost (never as a refusal), a new producer looks the topic
/// up again and takes it, and resuming after the tail leaves every message
/// in the topic once, in order.
#[test]
fn a_producer_whose_topic_is_unloaded_is_lost_and_a_new_one_resumes_after_the_tail() {
    let Some(pulsar) = shared_pulsar(
        "a_producer_whose_topic_is_unloaded_is_lost_and_a_new_one_resumes_after_the_tail",
    ) else {
        return;
    };
    let topic = unique_topic("producer-unload");
    let s = setup(&pulsar);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let session = s.broker.connect().await.unwrap();
        let mut producer = session
            .exclusive(&topic, &s.ours.producer_name("1-t1-a"))
            .await
            .unwrap();
        send_all(&session, &mut producer, 1..=50).await.unwrap();

        let path = topic.strip_prefix("persistent://").unwrap();
        let unloaded = reqwest::Client::new()
            .put(format!(
                "{}/admin/v2/persistent/{path}/unload",
                pulsar.admin_url
            ))
            .send()
            .await
            .unwrap();
        assert!(
            unloaded.status().is_success(),
            "unload: {}",
            unloaded.status()
        );

        // The broker tells the producer it is closed; until that arrives a
        // send may still go through. Within a few seconds one fails, lost.
        let mut next = 51;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let failed = loop {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the unloaded producer kept sending"
            );
            match send_all(&session, &mut producer, next..=next + 9).await {
                Ok(()) => next += 10,
                Err(e) => break e,
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(matches!(failed, SendError::Lost(_)), "{failed:?}");
        drop(producer);

        // A new producer, as the publisher makes one: looked up again,
        // retried while the topic loads, resumed after the tail.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let mut producer = loop {
            match session
                .exclusive(&topic, &s.ours.producer_name("1-t1-b"))
                .await
            {
                Ok(p) => break p,
                Err(e) => {
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "no new producer: {e}"
                    );
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        };
        let tail = session.last_seq(&topic, next + 9, true).await.unwrap();
        let from = tail.seq.unwrap() + 1;
        assert!(from >= 51, "the first 50 had receipts: tail {tail:?}");
        send_all(&session, &mut producer, from..=from + 99)
            .await
            .unwrap();
        from + 99
    });
    let back = read_back(&pulsar, &topic);
    let seqs: Vec<u64> = back.seqs.iter().map(|s| s.unwrap()).collect();
    let last = *seqs.last().unwrap();
    assert_eq!(seqs, (1..=last).collect::<Vec<_>>(), "once each, in order");
    let (code, out) = verify(&pulsar, &topic, Some(last), &s.secret);
    assert_eq!(code, 0, "verify: {out}");
}
