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
    let result = tokio::time::timeout(wait, async {
        while let Some(msg) = consumer.next().await {
            let msg = msg?;
            let id = msg.message_id();
            if (id.ledger_id, id.entry_id) < (last.ledger_id, last.entry_id) {
                continue;
            }
            let seq = props::get(msg.metadata(), props::SEQ)
                .ok_or_else(|| Error::topic(topic, TopicProblem::NoSequence))?;
            return seq
                .parse::<u64>()
                .map(Some)
                .map_err(|_| Error::topic(topic, TopicProblem::BadSequence(seq.to_string())));
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
