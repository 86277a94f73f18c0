//! firstseen's Raft group, on openraft 0.9 with sled underneath.
//!
//! - [`TypeConfig`]: every Raft type, declared once. Log entries carry a
//!   [`firstseen_store::Command`]; applying one yields a
//!   [`firstseen_store::Response`].
//! - [`log_store`]: the Raft log and vote in sled. An append is flushed to disk
//!   before openraft is told it is durable, because commit — and with it the
//!   upstream PUBACK (G4) — is decided on that promise.
//! - [`state_machine`]: adapts [`firstseen_store::StateStore`] to openraft:
//!   applies committed entries in order, builds snapshots by streaming the
//!   sled state into a file and installs them the same way.
//! - [`outbox`]: the publisher's view of the outbox. The state keeps only
//!   references to first copies; their payloads are read from the log, which
//!   keeps every entry the outbox still needs.
//!
//! The network between nodes is the application's (see `src/cluster/` in the
//! `firstseen` crate); this crate only declares what travels over it.
//!
//! - [`guard`]: lower bounds of what the log made durable, kept beside it,
//!   so a log that a damaged file shortened is refused at start-up.
//!
//! [`open`] wires these to the node's two sled databases
//! ([`firstseen_store::disk::Disk`]).

// openraft's StorageError is large by its design; boxing it at every call would
// only add noise to the storage code.
#![allow(clippy::result_large_err)]

use std::fmt;
use std::path::{Path, PathBuf};

use firstseen_store::disk::Disk;
use serde::{Deserialize, Serialize};

pub mod guard;
pub mod log_store;
pub mod outbox;
pub mod state_machine;

pub use firstseen_store::{Command, NodeId, Response, StateStore};
pub use log_store::LogStore;
pub use outbox::Outbox;
pub use state_machine::StateMachine;

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
        AsyncRuntime = openraft::TokioRuntime,
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
    Codec(String),
    /// A file of this node is damaged: it must not vote or serve with it.
    #[error("{path} is damaged: {reason}")]
    Damaged { path: PathBuf, reason: String },
}

/// The storage of one node: the Raft log and the state machine, each in its
/// own sled database.
///
/// They are apart because sled never moves a live page to reclaim a segment:
/// in one database, the log's short-lived payloads shared segments with the
/// window's long-lived keys and could not be reclaimed until those keys
/// expired, so disk grew with everything written during a window
/// (docs/benchmarks.md has the figures). Apart, the log's segments free up
/// as soon as it is purged.
pub struct Storage {
    /// Both databases, `DIR/sled` (state) and `DIR/log` (entries, vote,
    /// committed, purge point), and their durability.
    pub disk: Disk,
    pub log: LogStore,
    pub state_machine: StateMachine,
    /// Direct read access to the replicated state, for the publisher and status.
    pub state: StateStore,
    /// The outbox with its payloads, for the publisher.
    pub outbox: Outbox,
}

/// Opens (or creates) a node's storage under `dir`.
///
/// Refuses damaged files with [`RaftError::Damaged`] (or the store's
/// equivalent), naming the file: a log shorter than its guard, a vote older
/// than the guard's, a state the log cannot serve.
pub async fn open(dir: &Path) -> Result<Storage, RaftError> {
    let disk = {
        let dir = dir.to_path_buf();
        tokio::task::spawn_blocking(move || Disk::open(&dir))
            .await
            .map_err(|e| RaftError::Codec(format!("opening storage: {e}")))??
    };
    let state = StateStore::open_on(&disk)?;
    let log = LogStore::open(&disk.log, state.clone())?;
    let state_machine =
        StateMachine::open(state.clone(), log.clone(), dir.join("snapshots")).await?;
    let outbox = Outbox::new(state.clone(), log.clone());
    Ok(Storage {
        disk,
        log,
        state_machine,
        state,
        outbox,
    })
}
