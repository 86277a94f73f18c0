//! What applying a command answers ([`Outcome`], [`Response`]) and what
//! the state shows of itself (the outbox's messages, a topic's sequences,
//! coverage, totals): the data that comes out of the state, beside
//! [`crate::command`], the data that goes into the log.

use serde::{Deserialize, Serialize};

use crate::command::*;

/// What applying one observation decided. A duplicate is an outcome, not an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// First copy of this key in the window: stored in the outbox with this
    /// gap-free per-topic sequence number.
    FirstSeen { seq: u64 },
    /// A copy of a key already committed (by any node). `seq` is the first
    /// copy's sequence number.
    Duplicate { seq: u64, first_node: NodeId },
    /// A slim copy (proposed without its payload, [`Command::ObserveSlim`])
    /// of a key the state did not hold: nothing was stored, and the leader
    /// proposes the copy again whole. Never the answer to a forwarded batch.
    Missing,
}

/// The state machine's answer to one command.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// For non-command entries (blank, membership).
    #[default]
    None,
    /// One outcome per observation, in order.
    Observed(Vec<Outcome>),
    /// The watermark after a `Published` command.
    Published { watermark: u64 },
}

/// The record kept for each key in the window.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FirstSeen {
    /// Window clock when the first copy was applied.
    pub ts_ms: u64,
    /// Topic sequence of the first copy.
    pub seq: u64,
    /// Node whose copy came first.
    pub node: NodeId,
    /// Nodes that have delivered a copy, for coverage. Small: one per zone.
    pub seen_by: Vec<NodeId>,
}

/// Where an outbox message's content is: normally still in the Raft log
/// entry that brought it (the state keeps a reference, not the payload), or
/// inline when it arrived with a snapshot, which carries no log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OutboxItem {
    Inline(OutboxMessage),
    InLog {
        /// Index of the log entry.
        log_index: u64,
        /// Position of the observation in the entry.
        pos: u32,
        first_seen_ms: u64,
    },
}

/// Per Pulsar topic counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicState {
    /// Last sequence assigned (0 = none yet). Sequences start at 1.
    pub last_seq: u64,
    /// Highest sequence confirmed in Pulsar through a `Published` command.
    pub published_seq: u64,
}

/// Per node coverage over the keys in the window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coverage {
    /// Keys in the window this node delivered at least one copy of.
    pub seen: u64,
    /// Keys in the window whose first copy came from this node.
    pub first: u64,
}

/// Totals over the whole state machine, kept in one record so that status
/// reads are O(1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    /// The window clock: the largest leader stamp applied so far.
    pub clock_ms: u64,
    /// Keys currently in the window.
    pub window_keys: u64,
    /// Messages in the outbox, over all topics.
    pub outbox_messages: u64,
    /// Payload and topic bytes in the outbox, for the disk quota.
    pub outbox_bytes: u64,
    /// Observations applied since the cluster began.
    pub observed: u64,
    /// Of those, duplicates dropped.
    pub duplicates: u64,
    /// Keys expired from the window.
    pub expired: u64,
    /// Window records written since the cluster began: the next one's id.
    pub records: u64,
}
