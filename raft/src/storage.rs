//! Opening a node's storage: the two databases, the state rebuilt when it
//! is damaged, a damaged log set aside when the caller allows it, and the
//! log store, state machine and outbox on top.

use std::path::Path;

use firstseen_store::disk::Disk;

use crate::damage::{is_damage, panic_reason, STATE_DAMAGED};
use crate::{
    cover, log_store, rejoin, snapshot_files, state_machine, LogStore, Outbox, RaftError,
    StateMachine, StateStore,
};

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
