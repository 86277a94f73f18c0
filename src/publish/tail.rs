//! Reading the last `firstseen-seq` this cluster actually wrote to a topic.
//!
//! The Raft watermark may lag what is in Pulsar (a receipt arrived but the
//! `Published` entry was not committed before a leader change), so a new
//! publisher resumes after whichever is larger: the tail or the watermark.
//!
//! The tail counts only messages that are ours ([`Tail::classify`]): written
//! by a firstseen producer and numbered within what the group has assigned.
//! Anyone with a producer on the topic can write while no node holds it;
//! trusting such a message's `firstseen-seq` made a new leader skip every
//! sequence up to it, and the watermark that followed trimmed them from the
//! outbox unpublished: 1,000 acked messages lost after one foreign write,
//! and `u64::MAX` overflowed the resume point. Foreign messages are counted
//! and skipped; the read goes back from the end until it finds one of ours.

use std::time::Duration;

use futures::StreamExt;
use pulsar::consumer::InitialPosition;
use pulsar::proto::MessageIdData;
use pulsar::{Consumer, ConsumerOptions, Pulsar, SubType, TokioExecutor};

use super::props;
use crate::{Error, TopicProblem};

/// Whether a last-message id means "the topic has no message".
pub fn is_empty_marker(id: &MessageIdData) -> bool {
    // The broker answers entry id -1 for a topic with no entries.
    id.entry_id == u64::MAX || id.ledger_id == u64::MAX
}

/// Whether a message read from a topic is the last one of its entry. A
/// batching producer writes many messages as one entry; a reader gets them
/// one by one, with the entry's id and their index in it.
pub fn ends_entry(id: &MessageIdData, meta: &pulsar::proto::MessageMetadata) -> bool {
    match (id.batch_index, meta.num_messages_in_batch) {
        (Some(index), Some(count)) => index + 1 >= count,
        _ => true,
    }
}

/// A position just before `id`, so that a non-durable subscription started
/// there delivers `id` first (such a start position is exclusive).
pub fn just_before(id: &MessageIdData) -> MessageIdData {
    MessageIdData {
        ledger_id: id.ledger_id,
        // -1 within the same ledger means "before its first entry".
        entry_id: id.entry_id.wrapping_sub(1),
        partition: id.partition,
        batch_index: None,
        ack_set: Vec::new(),
        batch_size: None,
        first_chunk_message_id: None,
    }
}

/// A throwaway, non-durable subscription name: it leaves no cursor behind.
pub fn scratch_subscription(purpose: &str) -> String {
    let n: u64 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default();
    format!("firstseen-{purpose}-{n:x}")
}

/// Opens a non-durable reader on `topic` starting after `start` (or at the
/// earliest message when `None`).
pub async fn reader(
    pulsar: &Pulsar<TokioExecutor>,
    topic: &str,
    start: Option<MessageIdData>,
    purpose: &str,
) -> Result<Consumer<Vec<u8>, TokioExecutor>, Error> {
    let mut options = ConsumerOptions::default()
        .durable(false)
        .with_initial_position(InitialPosition::Earliest);
    if let Some(start) = start {
        options = options.starting_on_message(start);
    }
    Ok(pulsar
        .consumer()
        .with_topic(topic)
        .with_subscription(scratch_subscription(purpose))
        .with_subscription_type(SubType::Exclusive)
        .with_options(options)
        .build()
        .await?)
}

/// Every firstseen producer's name starts with this. `verify`, which knows
/// no cluster, tells firstseen's messages from others' by it alone.
pub const PRODUCER_PREFIX: &str = "firstseen-";

/// Which producer names are this cluster's: `firstseen-c<cluster id>-…`,
/// with the id derived from the cluster secret
/// ([`crate::cluster::wire::ClusterKey::cluster_id`]). A second firstseen
/// cluster writing to the same topic (another environment pointed at it by
/// mistake) names its producers with another id, and its messages are
/// foreign to this one: taking its sequence numbers for ours would skip or
/// repeat ours.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ours {
    prefix: String,
}

impl Ours {
    /// The names of a cluster with this secret's key; `None` for a group of
    /// one without a secret file, whose key is drawn at every start and so
    /// cannot name anything that must outlive a restart: it gets the fixed
    /// id `local`.
    pub fn of(key: Option<&crate::cluster::wire::ClusterKey>) -> Self {
        match key {
            Some(k) => Self::cluster(&k.cluster_id()),
            None => Self::cluster("local"),
        }
    }

    pub fn cluster(id: &str) -> Self {
        Self {
            prefix: format!("{PRODUCER_PREFIX}c{id}-"),
        }
    }

    /// The name of a producer of this cluster, `rest` telling them apart.
    pub fn producer_name(&self, rest: &str) -> String {
        format!("{}{rest}", self.prefix)
    }

    /// Whether a producer of this cluster wrote the message. Names without a
    /// cluster id (`firstseen-<node>-t<term>-…`, from releases before it)
    /// count as ours, so that an upgrade does not take its own tail for
    /// foreign and publish it again.
    pub fn wrote(&self, producer_name: &str) -> bool {
        producer_name.starts_with(&self.prefix)
            || producer_name
                .strip_prefix(PRODUCER_PREFIX)
                .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
    }
}

/// Entries read back from the end at first; the read goes back sixteen
/// times further each time it finds nothing of ours.
const LOOKBACK: u64 = 64;

/// What the tail read found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tail {
    /// The highest `firstseen-seq` of ours in what was read: `None` when the
    /// topic holds nothing of ours.
    pub seq: Option<u64>,
    /// Messages read that are not ours: another producer's, unnumbered, or
    /// numbered beyond what the group has assigned.
    pub foreign: u64,
}

impl Tail {
    /// Counts one message read from the topic, with the last sequence the
    /// group has assigned on it (`assigned`).
    pub fn classify(&mut self, meta: &pulsar::proto::MessageMetadata, assigned: u64, ours: &Ours) {
        match our_seq(meta, assigned, ours) {
            Some(seq) => self.seq = self.seq.max(Some(seq)),
            None => self.foreign += 1,
        }
    }
}

/// The sequence of a message this cluster wrote, or `None` for one it did
/// not: written by a producer not named as ours, without a parseable
/// `firstseen-seq`, or with one beyond `assigned` (no firstseen producer
/// can have written a sequence the group never assigned).
pub fn our_seq(meta: &pulsar::proto::MessageMetadata, assigned: u64, ours: &Ours) -> Option<u64> {
    if !ours.wrote(&meta.producer_name) {
        return None;
    }
    props::get(meta, props::SEQ)?
        .parse::<u64>()
        .ok()
        .filter(|seq| (1..=assigned).contains(seq))
}

/// The last sequence of ours in `topic` (see [`Tail`]), where the group has
/// assigned up to `assigned`. Reads back from the end, further each time
/// it finds nothing of ours, and the whole topic at last. `wait` bounds each
/// read.
pub async fn last_seq(
    pulsar: &Pulsar<TokioExecutor>,
    topic: &str,
    assigned: u64,
    ours: &Ours,
    wait: Duration,
) -> Result<Tail, Error> {
    let mut probe = reader(pulsar, topic, None, "tail").await?;
    let last = probe
        .get_last_message_id()
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| Error::topic(topic, TopicProblem::NoLastMessageId))?;
    let _ = probe.close().await;
    if is_empty_marker(&last) {
        return Ok(Tail::default());
    }
    let mut lookback = LOOKBACK;
    loop {
        // Within the last ledger; before its first entry once the lookback
        // reaches it, and from the topic's start after that.
        let whole_ledger = last.entry_id < lookback;
        let start = MessageIdData {
            entry_id: last.entry_id.saturating_sub(lookback),
            ..last.clone()
        };
        let tail = read_to(
            pulsar,
            topic,
            Some(just_before(&start)),
            &last,
            assigned,
            ours,
            wait,
        )
        .await?;
        if tail.seq.is_some() {
            return Ok(tail);
        }
        if whole_ledger {
            return read_to(pulsar, topic, None, &last, assigned, ours, wait).await;
        }
        lookback = lookback.saturating_mul(16);
    }
}

/// Reads from after `start` (the topic's start when `None`) through the
/// whole entry `last`, classifying every message.
async fn read_to(
    pulsar: &Pulsar<TokioExecutor>,
    topic: &str,
    start: Option<MessageIdData>,
    last: &MessageIdData,
    assigned: u64,
    ours: &Ours,
    wait: Duration,
) -> Result<Tail, Error> {
    let mut consumer = reader(pulsar, topic, start, "tail").await?;
    let end = (last.ledger_id, last.entry_id);
    let result = tokio::time::timeout(wait, async {
        let mut tail = Tail::default();
        while let Some(msg) = consumer.next().await {
            let msg = msg?;
            let id = msg.message_id();
            let at = (id.ledger_id, id.entry_id);
            if at > end {
                return Ok(tail);
            }
            tail.classify(msg.metadata(), assigned, ours);
            // The last entry may be a batch: its last message holds the
            // highest sequence, and every message of it was persisted
            // with it.
            if at == end && ends_entry(id, msg.metadata()) {
                return Ok(tail);
            }
        }
        Err(Error::topic(topic, TopicProblem::ReaderClosed))
    })
    .await;
    let _ = consumer.close().await;
    match result {
        Ok(r) => r,
        Err(_) => Err(Error::topic(topic, TopicProblem::TailTimedOut)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pulsar::proto::MessageMetadata;

    fn id(batch_index: Option<i32>) -> MessageIdData {
        MessageIdData {
            ledger_id: 7,
            entry_id: 3,
            partition: None,
            batch_index,
            ack_set: Vec::new(),
            batch_size: None,
            first_chunk_message_id: None,
        }
    }

    fn meta(in_batch: Option<i32>) -> MessageMetadata {
        MessageMetadata {
            num_messages_in_batch: in_batch,
            ..Default::default()
        }
    }

    fn written(producer: &str, seq: Option<&str>) -> MessageMetadata {
        MessageMetadata {
            producer_name: producer.into(),
            properties: seq
                .map(|s| pulsar::proto::KeyValue {
                    key: props::SEQ.into(),
                    value: s.into(),
                })
                .into_iter()
                .collect(),
            ..Default::default()
        }
    }

    fn ours() -> Ours {
        Ours::cluster("00aa11bb22cc33dd")
    }

    fn our_seq(meta: &MessageMetadata, assigned: u64) -> Option<u64> {
        super::our_seq(meta, assigned, &ours())
    }

    #[test]
    fn another_cluster_s_producers_are_not_ours_and_names_from_before_ids_are() {
        let name = ours().producer_name("1-t3-p");
        assert_eq!(name, "firstseen-c00aa11bb22cc33dd-1-t3-p");
        assert_eq!(our_seq(&written(&name, Some("7")), 10), Some(7));
        let other = Ours::cluster("ffffffffffffffff").producer_name("1-t3-p");
        assert_eq!(our_seq(&written(&other, Some("7")), 10), None);
        // Before cluster ids: still ours, so an upgrade keeps its tail.
        assert_eq!(
            our_seq(&written("firstseen-2-t9-p", Some("7")), 10),
            Some(7)
        );
        // Neither: a name that only starts like ours.
        assert_eq!(our_seq(&written("firstseen-x", Some("7")), 10), None);
        assert_eq!(our_seq(&written("firstseen-c", Some("7")), 10), None);
    }

    #[test]
    fn only_numbered_messages_of_our_producers_within_the_assigned_count_are_ours() {
        assert_eq!(
            our_seq(&written("firstseen-1-t3-p", Some("7")), 10),
            Some(7)
        );
        assert_eq!(
            our_seq(&written("firstseen-1-t3-p", Some("10")), 10),
            Some(10)
        );
        // Another producer, whatever it says.
        assert_eq!(our_seq(&written("standalone-0-4", Some("7")), 10), None);
        // Beyond what the group assigned: foreign, and no overflow.
        assert_eq!(
            our_seq(&written("firstseen-1-t3-p", Some("1007")), 10),
            None
        );
        let max = u64::MAX.to_string();
        assert_eq!(our_seq(&written("firstseen-1-t3-p", Some(&max)), 10), None);
        // Unnumbered or garbled.
        assert_eq!(our_seq(&written("firstseen-1-t3-p", None), 10), None);
        assert_eq!(our_seq(&written("firstseen-1-t3-p", Some("x")), 10), None);
        assert_eq!(our_seq(&written("firstseen-1-t3-p", Some("0")), 10), None);
    }

    #[test]
    fn the_tail_is_the_highest_of_ours_with_foreign_messages_counted() {
        let mut t = Tail::default();
        for m in [
            written("firstseen-1-t3-p", Some("8")),
            written("firstseen-1-t3-p", Some("9")),
            written("intruder", Some("1009")),
            written("firstseen-2-t4-p", Some(&u64::MAX.to_string())),
        ] {
            t.classify(&m, 9, &ours());
        }
        assert_eq!(
            t,
            Tail {
                seq: Some(9),
                foreign: 2
            }
        );
    }

    #[test]
    fn a_message_sent_alone_ends_its_entry() {
        assert!(ends_entry(&id(None), &meta(None)));
    }

    #[test]
    fn only_the_last_message_of_a_batch_ends_its_entry() {
        assert!(!ends_entry(&id(Some(0)), &meta(Some(3))));
        assert!(!ends_entry(&id(Some(1)), &meta(Some(3))));
        assert!(ends_entry(&id(Some(2)), &meta(Some(3))));
        assert!(ends_entry(&id(Some(0)), &meta(Some(1))));
    }
}
