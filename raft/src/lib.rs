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
//! [`open`] wires these to one sled database in the node's data directory.

// openraft's StorageError is large by its design; boxing it at every call would
// only add noise to the storage code.
#![allow(clippy::result_large_err)]

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

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
    /// The state machine's database (`DIR/sled`).
    pub db: sled::Db,
    /// The Raft log's database (`DIR/log`): entries, vote, committed, purge point.
    pub log_db: sled::Db,
    pub log: LogStore,
    pub state_machine: StateMachine,
    /// Direct read access to the replicated state, for the publisher and status.
    pub state: StateStore,
    /// The outbox with its payloads, for the publisher.
    pub outbox: Outbox,
}

/// sled page cache of the state database.
const STATE_CACHE_BYTES: u64 = 64 * 1024 * 1024;
/// sled page cache of the log database.
const LOG_CACHE_BYTES: u64 = 128 * 1024 * 1024;

/// Opens (or creates) a node's storage under `dir`.
pub async fn open(dir: &Path) -> Result<Storage, RaftError> {
    std::fs::create_dir_all(dir).map_err(|source| RaftError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let db = sled::Config::new()
        .path(dir.join("sled"))
        // The state is re-derived from the log after a crash, so its flushes
        // are not on the commit path: checkpoints (firstseen_store::state)
        // and this background flush bound how much a crash re-applies, and
        // the log store flushes it before a purge.
        .flush_every_ms(Some(1_000))
        // The state is served from memory; sled is read only to expire
        // written records and to rebuild at start-up. Its default 1 GiB
        // page cache would only hold copies of what memory already has.
        .cache_capacity(STATE_CACHE_BYTES)
        .open()?;
    let log_db = sled::Config::new()
        .path(dir.join("log"))
        // Every append is flushed explicitly (group commit in the log store).
        .flush_every_ms(None)
        // Reads are of recent entries: replication, apply, the outbox.
        .cache_capacity(LOG_CACHE_BYTES)
        .open()?;
    let state = StateStore::open_with_log(&db, Some(log_db.clone()))?;
    let log = LogStore::open(&log_db, state.clone())?;
    let state_machine =
        StateMachine::open(state.clone(), log.clone(), dir.join("snapshots")).await?;
    let outbox = Outbox::new(state.clone(), log.clone());
    Ok(Storage {
        db,
        log_db,
        log,
        state_machine,
        state,
        outbox,
    })
}
