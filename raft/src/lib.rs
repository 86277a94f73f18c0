//! firstseen's Raft group, on openraft 0.9 with sled underneath.
//!
//! - [`typ`]: every Raft type, declared once ([`TypeConfig`]), and this
//!   crate's errors. Log entries carry a [`firstseen_store::Command`];
//!   applying one yields a [`firstseen_store::Response`].
//! - [`storage`]: opens a node's storage: the two sled databases
//!   ([`firstseen_store::disk::Disk`]) and everything below on top of them.
//! - [`log_store`]: the Raft log and vote in sled. An append is flushed to disk
//!   before openraft is told it is durable, because commit — and with it the
//!   upstream PUBACK (G4) — is decided on that promise.
//! - [`state_machine`]: adapts [`firstseen_store::StateStore`] to openraft:
//!   applies committed entries in order, builds snapshots by streaming the
//!   sled state into a file and installs them the same way.
//! - [`snapshot_files`]: the snapshot files themselves: written whole and
//!   synced before `current.meta` names them, checked against their hash
//!   when read, promoted one at a time.
//! - [`outbox`]: the publisher's view of the outbox. The state keeps only
//!   references to first copies; their payloads are read from the log, which
//!   keeps every entry the outbox still needs.
//!
//! The network between nodes is the application's (see `src/cluster/` in the
//! `firstseen` crate); this crate only declares what travels over it.
//!
//! - [`guard`]: lower bounds of what the log made durable, kept beside it,
//!   so a log that a damaged file shortened is refused at start-up.
//! - [`rejoin`]: a damaged log set aside, and the rule that keeps the node
//!   from voting until the group has brought it up to date.
//! - [`recover`]: a lone survivor made a cluster of one, its log and state
//!   kept, when the rest of its cluster is gone for good.
//! - [`cover`]: what the snapshot on disk covers; the log's purge point
//!   never passes it, so a state rebuilt from that snapshot finds the rest
//!   in the log.
//! - [`damage`]: which errors and panics mean a damaged file, and the
//!   marker that asks the next start to rebuild the state.
//! - [`appends`]: when recent entries were written, for the commit path's
//!   telemetry.
//! - [`runtime`]: the runtime openraft's tasks run on (tokio; in the
//!   whole-cluster simulation, under the gate that pauses a node).

// openraft's StorageError is large by its design; boxing it at every call would
// only add noise to the storage code.
#![allow(clippy::result_large_err)]

pub mod appends;
pub mod cover;
pub mod damage;
pub mod guard;
pub mod log_store;
pub mod outbox;
pub mod recover;
pub mod rejoin;
pub mod runtime;
pub mod snapshot_files;
pub mod state_machine;
pub mod storage;
pub mod typ;

pub use appends::AppendClock;
pub use firstseen_store::{Command, NodeId, Response, StateStore};
pub use log_store::LogStore;
pub use outbox::Outbox;
pub use state_machine::StateMachine;
pub use storage::{open, open_with, OnDamagedLog, Storage};
pub use typ::log_id;
pub use typ::{
    CommittedLeaderId, Entry, LeaderId, LogId, Member, Membership, Raft, RaftError, Snapshot,
    SnapshotMeta, StorageResult, StoredMembership, TypeConfig, Vote,
};

/// Locks `m` under the one poisoning policy of every crate
/// ([`firstseen_store::lock`]).
pub(crate) use firstseen_store::lock::lock;
