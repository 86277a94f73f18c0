//! firstseen's replicated state, in the order a message meets it:
//!
//! 1. [`command`]: the plain data in the Raft log — a [`command::Observation`] is
//!    one copy of an upstream message, a [`command::Command`] one log entry;
//!    [`view`], what applying one answers and what the state shows of itself
//!    (outcomes, the outbox's messages, a topic's sequences, totals).
//! 2. [`window`]: the pure rules of the dedup window (leader-stamped clock,
//!    cutoff) and the byte layouts of the sled keys.
//! 3. [`record`]: the packed byte layouts of the window on disk.
//! 4. [`index`]: the in-memory key index of the window, rebuilt from those
//!    records at open.
//! 5. [`state`]: the state machine. Each committed entry is applied in
//!    memory (`state/apply.rs`: first copies, sequences, coverage, expiry,
//!    the outbox as references into the Raft log), and what changed is
//!    written to sled in one transaction per checkpoint with its applied
//!    marker (`state/checkpoint.rs`).
//! 6. [`disk`]: the one owner of durability for both of a node's sled
//!    databases: sled's flush, then `fdatasync` of their files.
//!
//! [`level`] is the cluster level: which of these formats and rules every
//! member has agreed to; [`topic`] the one name of a Pulsar topic.
//! [`lock`] holds the one mutex-poisoning policy of every firstseen crate.
//!
//! This crate knows neither openraft nor the network: the Raft adapter in
//! `firstseen-raft` feeds it committed commands in log order.

pub mod command;
pub mod disk;
pub mod index;
pub mod level;
pub mod lock;
pub mod record;
pub mod state;
pub mod topic;
pub mod view;
pub mod window;

pub use command::*;
pub use state::StateStore;
pub use view::*;

/// Everything that can go wrong in the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// sled reported an I/O or internal error (disk full lands here).
    #[error("sled: {0}")]
    Sled(#[from] sled::Error),
    /// A value could not be encoded or decoded.
    #[error("encoding: {0}")]
    Codec(#[from] bincode::Error),
    /// The data on disk is not what this version wrote.
    #[error("corrupt state: {0}")]
    Corrupt(String),
    /// A Raft log entry the outbox refers to could not be read.
    #[error("raft log: {0}")]
    Log(String),
    /// Reading or writing a snapshot stream failed.
    #[error("snapshot I/O: {0}")]
    Io(#[from] std::io::Error),
    /// Syncing or opening one of the node's files failed.
    #[error("{path}: {source}")]
    File {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// The cluster's level is past what this release runs.
    #[error(transparent)]
    TooNew(#[from] level::TooNew),
    /// A file on disk is damaged: the node must not run on it.
    #[error("{path} is damaged: {reason}")]
    Damaged {
        path: std::path::PathBuf,
        reason: String,
    },
}

impl From<sled::transaction::TransactionError<StoreError>> for StoreError {
    fn from(e: sled::transaction::TransactionError<StoreError>) -> Self {
        match e {
            sled::transaction::TransactionError::Abort(inner) => inner,
            sled::transaction::TransactionError::Storage(s) => StoreError::Sled(s),
        }
    }
}
