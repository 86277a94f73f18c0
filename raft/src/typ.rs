//! Every Raft type of firstseen, declared once: the entry and its
//! response, the member, the handle, and this crate's errors.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{runtime, Command, NodeId, Response};

/// What every storage call returns to openraft. openraft 0.10 takes a
/// plain `io::Error` and says itself which log id or snapshot it was about.
pub type StorageResult<T> = Result<T, std::io::Error>;

/// Where a cluster member lives. Stored in the membership config.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Address peers use for Raft RPC and forwarding (host:port).
    pub addr: String,
    /// Availability zone, for coverage per zone and for operators.
    pub zone: String,
    /// The node's HTTP API (host:port), so that any node can point an
    /// operator or the CLI at the leader's.
    #[serde(default)]
    pub http: String,
}

impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.zone, self.addr)
    }
}

openraft::declare_raft_types!(
    /// The Raft types of firstseen.
    pub TypeConfig:
        D = Command,
        R = Response,
        NodeId = NodeId,
        Node = Member,
        AsyncRuntime = runtime::GatedTokio,
);

// openraft's default log id, vote and entry. Their serde forms are those of
// openraft 0.9 (a leader id of term and node, then the index; the vote's
// leader id and committed flag; the entry's log id and payload), so a log,
// a snapshot and an append written by the previous release read the same
// (`tests/upgrade.rs` runs a cluster across the change).
/// A log id: the leader that proposed the entry and its index.
pub type LogId = openraft::alias::LogIdOf<TypeConfig>;
/// A node's vote: the leader it accepts, and whether a quorum granted it.
pub type Vote = openraft::alias::VoteOf<TypeConfig>;
/// A log entry.
pub type Entry = openraft::alias::EntryOf<TypeConfig>;
/// The leader id a log id carries (term and node).
pub type CommittedLeaderId = openraft::alias::CommittedLeaderIdOf<TypeConfig>;
/// A vote's leader id.
pub type LeaderId = openraft::alias::LeaderIdOf<TypeConfig>;
/// The membership config an entry carries.
pub type Membership = openraft::Membership<NodeId, Member>;
/// A membership config with the log id it was written at.
pub type StoredMembership = openraft::alias::StoredMembershipOf<TypeConfig>;
/// What a snapshot covers.
pub type SnapshotMeta = openraft::alias::SnapshotMetaOf<TypeConfig>;
/// The log id of entry `index`, proposed by `node_id` as leader of `term`.
pub fn log_id(term: u64, node_id: NodeId, index: u64) -> LogId {
    LogId::new(CommittedLeaderId { term, node_id }, index)
}

/// A snapshot: its metadata and its file.
pub type Snapshot = openraft::alias::SnapshotOf<TypeConfig, tokio::fs::File>;

/// The Raft handle the rest of firstseen uses.
pub type Raft = openraft::Raft<TypeConfig, crate::StateMachine>;

/// Everything that can go wrong in this crate outside openraft's own errors.
#[derive(Debug, thiserror::Error)]
pub enum RaftError {
    #[error("sled: {0}")]
    Sled(#[from] sled::Error),
    #[error(transparent)]
    Store(#[from] firstseen_store::StoreError),
    #[error("I/O on {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("encoding: {0}")]
    Codec(#[from] bincode::Error),
    /// A blocking storage task (opening, rebuilding the state) panicked or
    /// was cancelled.
    #[error("{what}: {source}")]
    Task {
        what: &'static str,
        source: tokio::task::JoinError,
    },
    /// The guard's record grew past the slot reserved for it.
    #[error("guard record of {0} bytes exceeds its slot")]
    GuardTooLarge(usize),
    /// A file of this node is damaged: it must not vote or serve with it.
    #[error("{path} is damaged: {reason}")]
    Damaged { path: PathBuf, reason: String },
}
