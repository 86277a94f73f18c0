//! Reading the last `firstseen-seq` actually written to a topic.
//!
//! The Raft watermark may lag what is in Pulsar (a receipt arrived but the
//! `Published` entry was not committed before a leader change), so a new
//! publisher resumes after whichever is larger: the tail or the watermark.

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

/// The `firstseen-seq` of the last message in `topic`, or `None` if the topic
/// is empty. A last message without the property is an error: the topic is
/// shared with another writer, and resuming after it would be a guess.
pub async fn last_seq(
    pulsar: &Pulsar<TokioExecutor>,
    topic: &str,
    wait: Duration,
) -> Result<Option<u64>, Error> {
    let mut probe = reader(pulsar, topic, None, "tail").await?;
    let last = probe
        .get_last_message_id()
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| Error::topic(topic, TopicProblem::NoLastMessageId))?;
    let _ = probe.close().await;
    if is_empty_marker(&last) {
        return Ok(None);
    }
    let mut consumer = reader(pulsar, topic, Some(just_before(&last)), "tail").await?;
    let end = (last.ledger_id, last.entry_id);
    let result = tokio::time::timeout(wait, async {
        // The last entry may be a batch: its last message holds the highest
        // sequence, and every message of it was persisted with it.
        let mut highest = None;
        while let Some(msg) = consumer.next().await {
            let msg = msg?;
            let id = msg.message_id();
            let at = (id.ledger_id, id.entry_id);
            if at < end {
                continue;
            }
            let seq = props::get(msg.metadata(), props::SEQ)
                .ok_or_else(|| Error::topic(topic, TopicProblem::NoSequence))?;
            let seq = seq
                .parse::<u64>()
                .map_err(|_| Error::topic(topic, TopicProblem::BadSequence(seq.to_string())))?;
            highest = highest.max(Some(seq));
            if at > end || ends_entry(id, msg.metadata()) {
                return Ok(highest);
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
