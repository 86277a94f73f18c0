//! The Raft log, vote and committed marker in sled.
//!
//! Durability goes through [`firstseen_store::disk`]: an append is reported
//! durable only after a sync of the log database that began after it was
//! written (group commit, on the blocking pool), and the vote is synced
//! before `save_vote` returns. The [`Guard`] beside the log records lower
//! bounds of both, so a log that comes back shorter is refused at start-up.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use openraft::storage::{IOFlushed, LogState, RaftLogStorage};
use openraft::EntryPayload;
use openraft::{AnyError, OptionalSend, RaftLogReader};
use tokio::sync::{mpsc, watch};

use firstseen_store::disk::Db;
use firstseen_store::{Command, StateStore, StoreError};

use crate::cover::SnapshotCover;
use crate::guard::{Guard, Marks};
use crate::{lock, Entry, LogId, RaftError, StorageResult, TypeConfig, Vote};

mod flush;
mod reaper;

use crate::appends::AppendClock;
use flush::{FlushQueue, Flusher, Written};
use reaper::reap_loop;
pub use reaper::Reaper;

const VOTE: &[u8] = b"vote";
const COMMITTED: &[u8] = b"committed";
const LAST_PURGED: &[u8] = b"last_purged";

/// Log entries keyed by big-endian index, plus a small metadata tree.
/// How many entries back [`LogStore::last_stamp`] looks: past the receipts
/// and membership entries that follow the last observing one.
const LAST_STAMP_SCAN: usize = 256;

#[derive(Clone)]
pub struct LogStore {
    db: Db,
    /// The state machine, checkpointed and synced before a purge (see `purge`).
    state: StateStore,
    log: sled::Tree,
    meta: sled::Tree,
    /// Group commit: appends wait here for the sync that makes them durable.
    flusher: Arc<Flusher>,
    /// First index not purged. Entries below it may still be on disk while
    /// a background task deletes them, and are never returned to openraft.
    first_kept: Arc<AtomicU64>,
    /// Wakes the reaper after a purge; its end stops the reaper.
    reaper: mpsc::UnboundedSender<()>,
    /// Lower bounds of what this log made durable (see [`crate::guard`]).
    guard: Arc<Mutex<Guard>>,
    /// The last entry written, for the group commit to know what a sync
    /// covers.
    written: Arc<Mutex<Written>>,
    /// What the snapshot on disk covers: a purge never passes it.
    cover: SnapshotCover,
    /// What the reaper's last finished pass served (see `reaper_served`).
    passes: Arc<watch::Sender<u64>>,
    /// When recent entries were written (telemetry, see [`AppendClock`]).
    appends: AppendClock,
}

fn io_err(e: impl std::error::Error + 'static) -> AnyError {
    AnyError::new(&e)
}

fn encode<T: serde::Serialize>(v: &T) -> Result<Vec<u8>, AnyError> {
    bincode::serialize(v).map_err(io_err)
}

fn decode<T: serde::de::DeserializeOwned>(raw: &[u8]) -> Result<T, AnyError> {
    bincode::deserialize(raw).map_err(io_err)
}

/// A log entry as stored in `raft_log`. The decoders of what the log
/// database holds are public so that the fuzz target `stored` runs the
/// same code the store does on a damaged file.
pub fn decode_entry(raw: &[u8]) -> Result<Entry, bincode::Error> {
    bincode::deserialize(raw)
}

/// The vote as stored in `raft_meta`.
pub fn decode_vote(raw: &[u8]) -> Result<Vote, bincode::Error> {
    bincode::deserialize(raw)
}

/// The purge point as stored in `raft_meta`: a bare log id.
pub fn decode_log_id(raw: &[u8]) -> Result<LogId, bincode::Error> {
    bincode::deserialize(raw)
}

/// The committed log id as stored in `raft_meta`.
pub fn decode_committed(raw: &[u8]) -> Result<Option<LogId>, bincode::Error> {
    bincode::deserialize(raw)
}

/// The purge point recorded in a log database, before the log store opens
/// it: a state applied below it can no longer be brought up to date.
pub fn purged_in(db: &Db) -> Result<Option<LogId>, RaftError> {
    let read = || -> Result<_, RaftError> {
        let meta = db.sled().open_tree("raft_meta")?;
        match meta.get(LAST_PURGED)? {
            Some(raw) => Ok(Some(decode_log_id(&raw)?)),
            None => Ok(None),
        }
    };
    let damaged = |reason: String| RaftError::Damaged {
        path: db.dir().map(|d| d.join("db")).unwrap_or_default(),
        reason,
    };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(read)) {
        Ok(Err(e)) if crate::damage::is_damage(&e) => Err(damaged(e.to_string())),
        Ok(read) => read,
        Err(panic) => Err(damaged(crate::damage::panic_reason(panic.as_ref()))),
    }
}

/// The trees of a log database and what `LogStore::open` checks first:
/// the purge point, the vote and the last entry's id.
type Heads = (
    sled::Tree,
    sled::Tree,
    Option<LogId>,
    Option<Vote>,
    Option<LogId>,
);

fn read_heads(db: &Db) -> Result<Heads, RaftError> {
    let sled = db.sled();
    let meta = sled.open_tree("raft_meta")?;
    // Stored as a bare LogId by `purge`: decoding it as an Option once
    // read the term's first byte as the tag, and failed from term 2 on.
    let purged: Option<LogId> = match meta.get(LAST_PURGED)? {
        Some(raw) => Some(decode_log_id(&raw)?),
        None => None,
    };
    let log = sled.open_tree("raft_log")?;
    let vote: Option<Vote> = match meta.get(VOTE)? {
        Some(raw) => Some(decode_vote(&raw)?),
        None => None,
    };
    let last_entry: Option<LogId> = match log.last()? {
        Some((_, raw)) => Some(decode_entry(&raw)?.log_id),
        None => None,
    };
    Ok((meta, log, purged, vote, last_entry))
}

/// Writes `vote` into the empty log database `db` and syncs it: the vote a
/// node keeps when its damaged log is set aside ([`crate::rejoin`]).
/// Blocking.
pub fn seed_vote(db: &Db, vote: &Vote) -> Result<(), RaftError> {
    let meta = db.sled().open_tree("raft_meta")?;
    meta.insert(VOTE, bincode::serialize(vote)?)?;
    db.sync()?;
    Ok(())
}

impl LogStore {
    /// When recent entries were written to this log (telemetry).
    pub fn append_clock(&self) -> AppendClock {
        self.appends.clone()
    }

    /// The first index kept by the purges the reaper has served: once it
    /// passes a purge's point, the reaper has deleted what that purge
    /// allowed (or found it still held). Tests wait on it to see a purge's
    /// effect.
    pub fn reaper_served(&self) -> watch::Receiver<u64> {
        self.passes.subscribe()
    }

    /// Opens the log trees in `db` and starts its group-commit thread and
    /// reaper task, so it must be called inside a tokio runtime. Both end
    /// when the last clone of the store is dropped.
    ///
    /// `state` is the state machine: it is made durable before a purge, and
    /// its outbox holds back the entries it still reads messages from.
    ///
    /// Refuses a log that holds less than its guard recorded (a truncated or
    /// corrupted file), naming the file.
    pub fn open(
        db: &Db,
        state: StateStore,
        cover: SnapshotCover,
    ) -> Result<(Self, Reaper), RaftError> {
        let dir: PathBuf = db
            .dir()
            .map(|d| d.to_path_buf())
            .unwrap_or_else(|| PathBuf::from("(temporary)"));
        // sled 0.34 panics on some pages a power cut damaged ("cannot find
        // pid N in view_for_key") where it should return an error: both
        // are the file's damage, reported as such.
        let heads = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| read_heads(db)));
        let damaged = |reason: String| RaftError::Damaged {
            path: dir.join("db"),
            reason,
        };
        let (meta, log, purged, vote, last_entry) = match heads {
            Ok(Ok(heads)) => heads,
            Ok(Err(e)) if crate::damage::is_damage(&e) => return Err(damaged(e.to_string())),
            Ok(Err(e)) => return Err(e),
            Err(panic) => return Err(damaged(crate::damage::panic_reason(panic.as_ref()))),
        };
        let last = last_entry.max(purged);
        let guard_path = dir.with_file_name("guard");
        let guard = Guard::open(&guard_path, || Marks {
            vote,
            durable: last,
            purged,
            deleted_below: 0,
        })?;
        guard.check(&dir, vote.as_ref(), last)?;
        let deleted_below = guard.marks().deleted_below;
        let guard = Arc::new(Mutex::new(guard));
        let written = Arc::new(Mutex::new(Written {
            generation: 0,
            last,
        }));
        let flusher = Arc::new(Flusher {
            db: db.clone(),
            guard: guard.clone(),
            written: written.clone(),
            queue: Mutex::new(FlushQueue::default()),
        });
        let first_kept = Arc::new(AtomicU64::new(purged.map_or(0, |l| l.index + 1)));
        let (reaper, wake) = mpsc::unbounded_channel();
        let passes = Arc::new(watch::channel(0).0);
        let reaping: Reaper = Box::pin(reap_loop(
            log.clone(),
            state.clone(),
            first_kept.clone(),
            guard.clone(),
            wake,
            passes.clone(),
        ));
        let store = Self {
            db: db.clone(),
            state,
            log,
            meta,
            flusher,
            first_kept,
            reaper,
            guard,
            written,
            cover,
            passes,
            appends: AppendClock::default(),
        };
        // A state whose outbox reads entries that were deleted is older than
        // the checkpoint the deletion was based on. That is not damage by
        // itself: the state is derived, and every entry after the one it is
        // applied up to is still in the log (open_databases rebuilds a state
        // behind the purge point from the snapshot first), so re-applying the
        // log brings back the receipts that trimmed those messages before
        // the publisher, which waits for the state to catch up with the
        // commit, reads any of them. The soak found such a state after every
        // node lost power at once, and refusing it kept a sound node down for
        // good. A message that is really gone is still not published
        // silently: reading it fails with "entry N is not in the log".
        let hold = store.state.durable_hold();
        if hold < deleted_below {
            tracing::warn!(
                hold,
                deleted_below,
                "the state's outbox reads log entries that were deleted: the state is older than the one they were deleted for, and re-applying the log trims them"
            );
        }
        Ok((store, reaping))
    }

    /// The observing command of entry `index`, even if openraft has purged
    /// it: the outbox reads unpublished payloads (and their properties) from
    /// here.
    pub fn command(&self, index: u64) -> Result<Command, StoreError> {
        let raw = self
            .log
            .get(index.to_be_bytes())
            .map_err(StoreError::Sled)?
            .ok_or_else(|| StoreError::Log(format!("entry {index} is not in the log")))?;
        let entry: Entry =
            decode(&raw).map_err(|e| StoreError::Log(format!("entry {index}: {e}")))?;
        match entry.payload {
            EntryPayload::Normal(cmd) if cmd.as_observe().is_some() => Ok(cmd),
            _ => Err(StoreError::Log(format!(
                "entry {index} holds no observations"
            ))),
        }
    }

    /// The leader's stamp of the last observing entry in the log, looking
    /// back at most [`LAST_STAMP_SCAN`] entries; `None` when there is none
    /// there (an empty or purged log: the state's window clock, restored
    /// from the snapshot, is then the whole story).
    ///
    /// A new leader's applied state can be behind its log (the entries of
    /// the previous term are applied after the election, or re-applied after
    /// a restart), even empty; its window clock then reads 0 and used to let
    /// the leader's own clock through uncapped: one clock a day ahead
    /// stamped an entry that, applied after the older ones, expired every
    /// key. The log knows the window's time before the state does.
    pub fn last_stamp(&self) -> Result<Option<u64>, StoreError> {
        for item in self.log.iter().rev().take(LAST_STAMP_SCAN) {
            let (_, raw) = item.map_err(StoreError::Sled)?;
            let entry: Entry =
                decode(&raw).map_err(|e| StoreError::Log(format!("last stamp: {e}")))?;
            if let EntryPayload::Normal(cmd) = &entry.payload {
                if let Some((stamped_ms, _, _)) = cmd.as_observe() {
                    return Ok(Some(stamped_ms));
                }
            }
        }
        Ok(None)
    }

    fn get_meta<T: serde::de::DeserializeOwned>(&self, key: &[u8]) -> StorageResult<Option<T>> {
        let raw = self.meta.get(key).map_err(std::io::Error::other)?;
        match raw {
            Some(raw) => Ok(Some(decode(&raw).map_err(std::io::Error::other)?)),
            None => Ok(None),
        }
    }

    /// Writes a metadata record and syncs the log, off the runtime's threads.
    async fn put_meta<T: serde::Serialize>(&self, key: &[u8], v: &T) -> StorageResult<()> {
        let raw = encode(v).map_err(std::io::Error::other)?;
        self.meta.insert(key, raw).map_err(std::io::Error::other)?;
        self.sync().await.map_err(std::io::Error::other)?;
        Ok(())
    }

    /// A sync of the log database, on the blocking pool.
    async fn sync(&self) -> Result<(), AnyError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || db.sync())
            .await
            .map_err(io_err)?
            .map_err(io_err)
    }

    /// Changes the guard's marks and syncs it, on the blocking pool.
    async fn guard(&self, f: impl FnOnce(&mut Marks) + Send + 'static) -> Result<(), AnyError> {
        let guard = self.guard.clone();
        tokio::task::spawn_blocking(move || lock(&guard).update(f))
            .await
            .map_err(io_err)?
            .map_err(io_err)
    }

    /// Number of entries currently held (after purges), for status.
    pub fn len(&self) -> usize {
        self.log.len()
    }

    /// Whether the log holds no entries.
    pub fn is_empty(&self) -> bool {
        self.log.is_empty()
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<Entry>> {
        let start = match range.start_bound() {
            Bound::Included(x) => *x,
            Bound::Excluded(x) => x + 1,
            Bound::Unbounded => 0,
        }
        .max(self.first_kept.load(Ordering::Acquire));
        let mut out = Vec::new();
        for item in self.log.range(start.to_be_bytes()..) {
            let (k, v) = item.map_err(std::io::Error::other)?;
            let index = u64::from_be_bytes(k.as_ref().try_into().map_err(std::io::Error::other)?);
            if !range.contains(&index) {
                break;
            }
            out.push(decode(&v).map_err(std::io::Error::other)?);
        }
        Ok(out)
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote>> {
        self.get_meta(VOTE)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> StorageResult<LogState<TypeConfig>> {
        let last_purged_log_id: Option<LogId> = self.get_meta(LAST_PURGED)?;
        let last = match self.log.last().map_err(std::io::Error::other)? {
            Some((_, v)) => {
                let e: Entry = decode(&v).map_err(std::io::Error::other)?;
                // Purged entries not yet deleted do not count.
                Some(e.log_id).max(last_purged_log_id)
            }
            None => last_purged_log_id,
        };
        Ok(LogState {
            last_purged_log_id,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> StorageResult<()> {
        // Synced before returning, and recorded in the guard: a vote
        // forgotten in a power cut could let this node vote twice in a term.
        self.put_meta(VOTE, vote).await?;
        let vote = *vote;
        self.guard(move |m| m.vote = Some(vote))
            .await
            .map_err(std::io::Error::other)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> StorageResult<()> {
        // Not flushed on its own: losing it only means re-deriving the commit
        // index from a quorum after a restart.
        let raw = encode(&committed).map_err(std::io::Error::other)?;
        self.meta
            .insert(COMMITTED, raw)
            .map_err(std::io::Error::other)?;
        Ok(())
    }

    async fn read_committed(&mut self) -> StorageResult<Option<LogId>> {
        Ok(self.get_meta::<Option<LogId>>(COMMITTED)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> StorageResult<()>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        // One insert per entry, in index order, rather than one sled batch:
        // sled 0.34 seals and writes its current IO buffer twice for every
        // batch (`PageCache::pin_log`), each a write and a synchronous
        // `sync_file_range` on its IO pool, which wakes every idle pool
        // thread. At the HSL peak that was two thirds of the log's writes
        // and most of a node's context switches. A batch's atomicity buys
        // nothing here: sled recovers a prefix of its log, so a crash keeps
        // a prefix of these entries, which is a valid Raft log, and none of
        // them was reported durable before the sync below.
        let (mut count, mut bytes) = (0u64, 0u64);
        let mut first = None;
        let mut last = None;
        for entry in entries {
            first.get_or_insert(entry.log_id.index);
            let raw = encode(&entry).map_err(std::io::Error::other)?;
            count += 1;
            bytes += raw.len() as u64;
            self.log
                .insert(entry.log_id.index.to_be_bytes(), raw)
                .map_err(std::io::Error::other)?;
            last = Some(entry.log_id);
        }
        // The benchmark reports Raft entries and bytes per second from these.
        metrics::counter!("firstseen_raft_log_entries_total").increment(count);
        metrics::counter!("firstseen_raft_log_bytes_total").increment(bytes);
        if let (Some(first), Some(l)) = (first, last) {
            self.appends.wrote(first, l.index);
            let mut w = lock(&self.written);
            w.last = w.last.max(last);
        }
        // Reported durable by the group commit, never before a sync.
        self.flusher.submit(callback);
        Ok(())
    }

    async fn truncate_after(&mut self, last: Option<LogId>) -> StorageResult<()> {
        let from = last.as_ref().map_or(0, |l| l.index + 1);
        // Rare in a healthy cluster (a tail from a deposed leader), so worth
        // a line: a node truncating again and again is a livelock to see.
        tracing::info!(from, "truncating a conflicting log tail");
        metrics::counter!("firstseen_raft_log_truncations_total").increment(1);
        // Entries after `last` were never committed (openraft truncates
        // only a conflicting tail). The guard's durable mark goes down to
        // what is kept first, so it never claims what is about to be
        // removed.
        let before: Option<LogId> = match last {
            Some(l) => Some(l),
            None => self.get_meta(LAST_PURGED)?,
        };
        {
            let mut w = lock(&self.written);
            w.generation += 1;
            w.last = w.last.min(before);
        }
        let keep = before;
        self.guard(move |m| m.durable = m.durable.min(keep))
            .await
            .map_err(std::io::Error::other)?;
        let mut batch = sled::Batch::default();
        for item in self.log.range(from.to_be_bytes()..) {
            let (k, _) = item.map_err(std::io::Error::other)?;
            batch.remove(k);
        }
        self.log.apply_batch(batch).map_err(std::io::Error::other)?;
        self.sync().await.map_err(std::io::Error::other)?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> StorageResult<()> {
        // Never past the snapshot on disk: a follower's purge for a snapshot
        // it is still installing waits here for the install (see `cover`).
        self.cover
            .wait_until_covered(log_id)
            .await
            .map_err(std::io::Error::other)?;
        // The state is written in checkpoints to its own database. Entries
        // up to `log_id` are applied, but maybe not yet durably: were they
        // purged first, a crash would leave applied state that can be neither
        // found on disk nor re-applied from the log.
        let state = self.state.clone();
        tokio::task::spawn_blocking(move || state.flush())
            .await
            .map_err(std::io::Error::other)?
            .map_err(std::io::Error::other)?;
        // Record the purge point first: a crash between the two steps leaves
        // extra entries, never a hole openraft does not know about.
        self.put_meta(LAST_PURGED, &log_id).await?;
        self.guard(move |m| m.purged = Some(log_id))
            .await
            .map_err(std::io::Error::other)?;
        self.first_kept
            .fetch_max(log_id.index + 1, Ordering::AcqRel);
        // Deleting tens of thousands of entries takes long enough to stall
        // appends, and with them every commit (it showed as p99 spikes every
        // snapshot in the benchmark). Nothing reads below the purge point but
        // the outbox, so the reaper deletes beside the log instead of in its
        // I/O sequence, and keeps what the outbox still needs.
        let _ = self.reaper.send(());
        Ok(())
    }
}
