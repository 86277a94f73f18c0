//! What goes wrong on the publish path, as the publisher's own errors: a
//! topic not as firstseen left it, a lease a quorum did not confirm, a
//! set-aside record not committed. What crosses stages (the store, Raft,
//! the Pulsar client, the broker's answer) stays in the crate's
//! [`crate::Error`], carried here whole ([`Error::Node`]); the tail read's
//! reader is `verify`'s too, so its errors are these.

use crate::cluster::wire::ForwardError;

/// An error of the publish path. The publisher decides on the variant
/// (and, for the broker's answer, on [`crate::send::SendError`]'s), never
/// on the text.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Pulsar topic is not as firstseen left it, or could not be read.
    #[error("{topic}: {problem}")]
    Topic {
        topic: String,
        problem: TopicProblem,
    },
    /// This node could not confirm with a quorum that it still leads.
    #[error("leadership not confirmed by a quorum")]
    LeaseLost,
    /// A message the broker would refuse could not be kept in the
    /// replicated set-aside store: its marker is not sent (the publisher
    /// tries again).
    #[error("set-aside message not committed: {0}")]
    SetAside(#[source] ForwardError),
    /// An error of the node's that the publish path met (the store, Raft,
    /// the Pulsar client, the broker's answer, connecting).
    #[error(transparent)]
    Node(#[from] crate::Error),
}

impl Error {
    /// A problem with Pulsar topic `topic`.
    pub fn topic(topic: &str, problem: TopicProblem) -> Self {
        Error::Topic {
            topic: topic.to_string(),
            problem,
        }
    }

    /// The broker's (or the connection's) answer, when this is one: what
    /// the publisher's policy reads.
    pub fn broker(&self) -> Option<&crate::send::SendError> {
        match self {
            Error::Node(crate::Error::Broker(e)) => Some(e),
            _ => None,
        }
    }
}

// The crate's errors the publish path meets through `?`, each kept whole
// in the crate's error (one conversion is all `?` makes).
impl From<crate::send::SendError> for Error {
    fn from(e: crate::send::SendError) -> Self {
        Error::Node(e.into())
    }
}

impl From<firstseen_store::StoreError> for Error {
    fn from(e: firstseen_store::StoreError) -> Self {
        Error::Node(e.into())
    }
}

impl From<pulsar::Error> for Error {
    fn from(e: pulsar::Error) -> Self {
        Error::Node(e.into())
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Node(e.into())
    }
}

/// What is wrong with a Pulsar topic.
#[derive(Debug, thiserror::Error)]
pub enum TopicProblem {
    #[error("broker returned no last message id")]
    NoLastMessageId,
    #[error("last message has no firstseen-seq property; is another producer writing here?")]
    NoSequence,
    #[error("last message has firstseen-seq={0:?}")]
    BadSequence(String),
    #[error("reader closed before the last message")]
    ReaderClosed,
    #[error("timed out reading the last message")]
    TailTimedOut,
    #[error(
        "no message for {idle:?} before reaching the last one ({ledger}:{entry}); read {count}"
    )]
    Stalled {
        idle: std::time::Duration,
        ledger: u64,
        entry: u64,
        count: u64,
    },
    #[error("outbox starts at {first} but the next sequence is {next}")]
    OutboxGap { first: u64, next: u64 },
    #[error("not a persistent:// topic")]
    NotPersistent,
}
