//! What can go wrong sending to the output broker, as the publisher decides
//! on it. Shared (the crate's [`crate::Error`] carries it) and importing no
//! stage; the publisher's port (`publish::port`) speaks it, its Pulsar
//! adapter sorts the client's errors into it, and the models answer it
//! directly.

/// What went wrong at the broker. Sorted by the broker's refusal code and
/// the client's error variant, never by text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// Another producer holds the topic's exclusive access (a predecessor
    /// that was paused or cut off keeps it until the broker drops its
    /// connection): tried again soon.
    #[error("the topic is held by another producer: {0}")]
    HeldElsewhere(String),
    /// The broker answered this one message with an error instead of a
    /// receipt, while the producer and its connection stayed up: a refusal
    /// of the message (a topic's `maxMessageSize`, say).
    #[error("the broker refused the message: {0}")]
    Refused(String),
    /// The broker refused the entry this message went in, of `messages`
    /// messages starting with this one: none of them is in the topic, and
    /// which of them it meant (a topic's `maxMessageSize` below the
    /// entry's size, say) it does not say. Entries sent after it may have
    /// landed.
    #[error("the broker refused an entry of {messages} messages: {why}")]
    RefusedEntry { messages: u64, why: String },
    /// The connection or the producer is gone (or never came): a message in
    /// flight may or may not be in the topic. Retried with backoff.
    #[error("lost the broker: {0}")]
    Lost(String),
    /// Exclusive access was taken, but writes an earlier producer handed
    /// the broker may still land in the topic (its connection dropped while
    /// the storage held them), or whether any do could not be learned: the
    /// topic's end is not final, so it is not read yet. The producer is let
    /// go and the acquisition retried with backoff.
    #[error("writes of an earlier producer may still land: {0}")]
    WritesPending(String),
    /// The broker has no such topic and creates none on its own
    /// (`allowAutoTopicCreation=false`): its `TopicNotFound`, on the lookup
    /// or on the producer. The publish adapter creates the topic through
    /// the admin API when it has one; otherwise retried with backoff.
    #[error("the broker has no such topic and does not create it: {0}")]
    TopicNotFound(String),
    /// The topic is partitioned (the admin API said so). firstseen writes a
    /// topic through one exclusive producer and reads its end to resume,
    /// which a partitioned topic does not give: nothing is published to it,
    /// and the acquisition is retried with backoff in case an operator
    /// replaces it with a non-partitioned one.
    #[error("the topic is partitioned: {0}")]
    Partitioned(String),
}
