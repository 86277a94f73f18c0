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
//! - [`cover`]: what the snapshot on disk covers; the log's purge point
//!   never passes it, so a state rebuilt from that snapshot finds the rest
//!   in the log.
//! - [`runtime`]: the runtime openraft's tasks run on (tokio; in the
//!   whole-cluster simulation, under the gate that pauses a node).
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

pub mod cover;
pub mod guard;
pub mod log_store;
pub mod outbox;
pub mod rejoin;
pub mod runtime;
pub mod snapshot_files;
pub mod state_machine;

pub use firstseen_store::{Command, NodeId, Response, StateStore};
pub use log_store::LogStore;
pub use outbox::Outbox;
pub use state_machine::StateMachine;

/// A file beside the databases saying the state database was found
/// inconsistent while the log was applied to it; the next start rebuilds the
/// state (see [`open`]).
pub(crate) const STATE_DAMAGED: &str = "state.damaged";

/// Records that applying the log found the state database inconsistent
/// (`reason`), so that the next start rebuilds it. Blocking; best effort,
/// since the caller is about to report the failure anyway.
pub(crate) fn mark_state_damaged(dir: &Path, reason: &str) {
    let path = dir.join(STATE_DAMAGED);
    let written = std::fs::write(&path, format!("{reason}\n"))
        .and_then(|()| std::fs::File::open(&path)?.sync_all())
        .map_err(|e| e.to_string())
        .and_then(|()| firstseen_store::disk::sync_dir(dir).map_err(|e| e.to_string()));
    match written {
        Ok(()) => tracing::error!(
            file = %path.display(),
            reason,
            "the state database is inconsistent with the log it applied; the next start rebuilds it from the current snapshot and the Raft log"
        ),
        Err(e) => {
            tracing::error!(file = %path.display(), error = %e, "could not record that the state database is inconsistent")
        }
    }
}

/// Whether a state store error means its data is damaged (rather than
/// unreachable).
pub(crate) fn store_damage(e: &firstseen_store::StoreError) -> bool {
    use firstseen_store::StoreError as S;
    match e {
        S::Damaged { .. } | S::Corrupt(_) | S::Codec(_) => true,
        S::Sled(s) => sled_damage(s),
        S::Log(_) | S::Io(_) | S::File { .. } => false,
    }
}

/// Whether a sled error means damaged data. A file sled's own records point
/// at and cannot find is damage too: after a power cut sled removes blobs
/// "with a higher lsn than our stable log" at start-up, and a later read of
/// the state then failed with ENOENT on every start (the soak). Locks,
/// permissions and a full disk are other kinds and are not repaired.
fn sled_damage(e: &sled::Error) -> bool {
    match e {
        sled::Error::Corruption { .. }
        | sled::Error::ReportableBug(_)
        | sled::Error::Unsupported(_) => true,
        sled::Error::Io(io) => io.kind() == std::io::ErrorKind::NotFound,
        _ => false,
    }
}

/// The message of a caught panic, for the error that reports it.
pub(crate) fn panic_reason(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "sled panicked while reading it".into())
}

/// Locks `m` under the one poisoning policy of every crate
/// ([`firstseen_store::sync`]).
pub(crate) use firstseen_store::sync::lock;

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
    /// Deletes purged log entries; the caller runs it while the log is open.
    pub reaper: log_store::Reaper,
}

/// Opens (or creates) a node's storage under `dir`.
///
/// Refuses damaged files with [`RaftError::Damaged`] (or the store's
/// equivalent), naming the file: a guard that cannot be read, a snapshot
/// that fails its hash, a state the log cannot serve, and (see below) a
/// damaged log.
///
/// A state database that fails to open or to load is rebuilt instead: it is
/// derived data, and the current snapshot plus the Raft log hold everything
/// it held. sled 0.34 does not always recover a database that lost unsynced
/// writes (the soak's losses of power on every node left state databases
/// that sled called corrupt, or panicked on).
///
/// A damaged log (one sled cannot read, or shorter than its guard) is set
/// aside and the node rejoins with an empty one, abstaining from votes until
/// the group has brought it up to date ([`rejoin`]; [`rejoin::pending`]
/// says so), if `on_damaged_log` allows it: only a node with other voters
/// can be brought up to date, and for a group of one the log is the only
/// copy, so it is refused.
pub async fn open_with(dir: &Path, on_damaged_log: OnDamagedLog) -> Result<Storage, RaftError> {
    match open_once(dir).await {
        Err(e) if rejoin::is_log_damage(dir, &e) => {
            let OnDamagedLog::Rejoin { min_free_bytes } = on_damaged_log else {
                return Err(e);
            };
            let d = dir.to_path_buf();
            tokio::task::spawn_blocking(move || rejoin::set_aside(&d, e, min_free_bytes))
                .await
                .map_err(|source| RaftError::Task {
                    what: "setting the damaged log aside",
                    source,
                })??;
            open_once(dir).await
        }
        other => other,
    }
}

/// [`open_with`] refusing a damaged log.
pub async fn open(dir: &Path) -> Result<Storage, RaftError> {
    open_with(dir, OnDamagedLog::Refuse).await
}

/// What [`open_with`] does with a Raft log it finds damaged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnDamagedLog {
    /// Refuse to start, naming the file.
    Refuse,
    /// Set it aside and rejoin the group with an empty log ([`rejoin`]),
    /// unless the disk has less than `min_free_bytes` free: a full disk
    /// makes sled fail in ways that look like damage, and a log is never
    /// given up for that.
    Rejoin { min_free_bytes: u64 },
}

async fn open_once(dir: &Path) -> Result<Storage, RaftError> {
    let (log_db, state_db, state, rebuilt) = {
        let dir = dir.to_path_buf();
        tokio::task::spawn_blocking(move || open_databases(&dir))
            .await
            .map_err(|source| RaftError::Task {
                what: "opening storage",
                source,
            })??
    };
    let snapshots = dir.join("snapshots");
    if rebuilt {
        let restored = state_machine::restore_current(&state, &snapshots).await?;
        if let Some(p) = log_store::purged_in(&log_db)? {
            if restored.is_none_or(|r| r.index < p.index) {
                return Err(RaftError::Damaged {
                    path: snapshots.join(snapshot_files::CURRENT_META),
                    reason: format!(
                        "the state must be rebuilt, but the snapshot ends at {restored:?} and the log was purged up to {p}"
                    ),
                });
            }
        }
        tracing::warn!(
            snapshot = ?restored,
            "state rebuilt from the current snapshot; the log is re-applied from there"
        );
    }
    let disk = Disk {
        log: log_db,
        state: state_db,
    };
    let cover = cover::SnapshotCover::new(snapshot_files::on_disk(&snapshots));
    let (log, reaper) = LogStore::open(&disk.log, state.clone(), cover.clone())?;
    let state_machine = StateMachine::open(state.clone(), log.clone(), snapshots, cover).await?;
    let outbox = Outbox::new(state.clone(), log.clone());
    Ok(Storage {
        disk,
        log,
        state_machine,
        state,
        outbox,
        reaper,
    })
}

/// The log database, the state database and the state loaded from it, and
/// whether the state had to be started afresh. Blocking.
fn open_databases(
    dir: &Path,
) -> Result<
    (
        firstseen_store::disk::Db,
        firstseen_store::disk::Db,
        StateStore,
        bool,
    ),
    RaftError,
> {
    firstseen_store::disk::create_dir_durable(dir)?;
    // The data directory itself may have been made by someone else (an
    // operator's mkdir, an installer, a test harness), and nobody synced
    // the directory that holds its name. A power cut soon after the first
    // start could then take the whole data directory away: the crash
    // filesystem, which keeps a name only once its directory is synced,
    // did so in the simulation (the node came back empty and published
    // again what the group had published). So that directory is synced
    // here, once per start; if it cannot be opened (another owner), the
    // name is as durable as whoever made it left it.
    // A relative data directory (`data_dir = "data"`) is held by the
    // working directory, whose path is empty here.
    if let Some(holder) = dir.parent().and_then(Path::parent).map(|p| {
        if p.as_os_str().is_empty() {
            Path::new(".")
        } else {
            p
        }
    }) {
        if let Err(e) = firstseen_store::disk::sync_dir(holder) {
            tracing::warn!(dir = %holder.display(), error = %e, "cannot sync the directory that holds the data directory");
        }
    }
    let log_db = Disk::open_log(dir)?;
    let purged = log_store::purged_in(&log_db)?;
    let has_snapshot = dir
        .join("snapshots")
        .join(snapshot_files::CURRENT_META)
        .exists();
    // `check`: off for the fresh state of a rebuild, which the current
    // snapshot brings past the purge point next.
    let load = |log_db: &firstseen_store::disk::Db, check: bool| {
        let state_db = Disk::open_state(dir)?;
        let state = StateStore::open_with_log(&state_db, Some(log_db.clone()))?;
        // sled opens some damaged files as an empty database without a
        // word (a file overwritten whole did): a state behind the purge
        // point cannot be the one this node ran with. Only checked with a
        // snapshot to rebuild from: a node purges only after one.
        let applied = state_machine::applied_in(&state)?;
        if let Some(p) = purged.filter(|_| check && has_snapshot) {
            if applied.is_none_or(|a| a.index < p.index) {
                return Err(RaftError::Damaged {
                    path: Disk::state_dir(dir).join("db"),
                    reason: format!(
                        "the state is applied up to {applied:?} but the log was purged up to {p}"
                    ),
                });
            }
        }
        Ok::<_, RaftError>((state_db, state))
    };
    // sled 0.34 panics on some damaged pages instead of returning an error.
    let load = |log_db: &firstseen_store::disk::Db, check: bool| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| load(log_db, check)))
            .unwrap_or_else(|panic| {
                Err(RaftError::Damaged {
                    path: Disk::state_dir(dir).join("db"),
                    reason: panic_reason(panic.as_ref()),
                })
            })
    };
    // A state that an earlier run found inconsistent while applying the log
    // to it (sled can come back from a power cut with the head of a
    // checkpoint but not every record it names, and the gap shows only when
    // that record expires) is rebuilt before anything reads it.
    let marked = std::fs::read_to_string(dir.join(STATE_DAMAGED)).ok();
    let first = match &marked {
        Some(reason) => Err(RaftError::Damaged {
            path: Disk::state_dir(dir).join("db"),
            reason: format!("applying the log found it inconsistent: {}", reason.trim()),
        }),
        None => load(&log_db, true),
    };
    match first {
        Ok((state_db, state)) => Ok((log_db, state_db, state, false)),
        // An I/O error (a lock still held, permissions, a full disk) says
        // nothing about the data: it is reported, never "repaired".
        Err(e) if !is_damage(&e) => Err(e),
        Err(e) => {
            let from = Disk::state_dir(dir);
            let stamp = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis())
                .unwrap_or_default();
            let to = dir.join(format!("sled.damaged-{stamp}"));
            tracing::error!(
                error = %e,
                moved_to = %to.display(),
                "the state database cannot be read; moving it aside and rebuilding the state from the current snapshot and the Raft log (delete the damaged copy once you no longer need it)"
            );
            std::fs::rename(&from, &to).map_err(|source| RaftError::Io {
                path: from.clone(),
                source,
            })?;
            firstseen_store::disk::sync_dir(dir)?;
            let (state_db, state) = load(&log_db, false)?;
            if marked.is_some() {
                let marker = dir.join(STATE_DAMAGED);
                std::fs::remove_file(&marker).map_err(|source| RaftError::Io {
                    path: marker,
                    source,
                })?;
                firstseen_store::disk::sync_dir(dir)?;
            }
            Ok((log_db, state_db, state, true))
        }
    }
}

/// Whether an error opening or loading the state database means its data is
/// damaged (rather than unreachable).
pub(crate) fn is_damage(e: &RaftError) -> bool {
    match e {
        RaftError::Damaged { .. } | RaftError::Codec(_) | RaftError::GuardTooLarge(_) => true,
        RaftError::Sled(s) => sled_damage(s),
        RaftError::Store(s) => store_damage(s),
        RaftError::Io { .. } | RaftError::Task { .. } => false,
    }
}
