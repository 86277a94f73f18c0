//! Every Raft type of firstseen, declared once: the entry and its
//! response, the member, the handle, and this crate's errors.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{runtime, Command, NodeId, Response};

/// What every storage call returns to openraft.
pub type StorageResult<T> = Result<T, openraft::StorageError<NodeId>>;

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
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = tokio::fs::File,
        AsyncRuntime = runtime::GatedTokio,
);

/// The Raft handle the rest of firstseen uses.
pub type Raft = openraft::Raft<TypeConfig>;

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
