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
use std::time::Instant;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::EntryPayload;
use openraft::{AnyError, Entry, LogId, OptionalSend, RaftLogReader, StorageIOError, Vote};
use tokio::sync::{mpsc, watch};

use firstseen_store::disk::Db;
use firstseen_store::{Command, StateStore, StoreError};

use crate::cover::SnapshotCover;
use crate::guard::{Guard, Marks};
use crate::{NodeId, RaftError, StorageResult, TypeConfig};

const VOTE: &[u8] = b"vote";
const COMMITTED: &[u8] = b"committed";
const LAST_PURGED: &[u8] = b"last_purged";

/// Log entries keyed by big-endian index, plus a small metadata tree.
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
}

/// What was written to the log and not yet known durable.
#[derive(Default)]
struct Written {
    /// Bumped by every truncation, so a sync that began before one does not
    /// mark removed entries durable.
    generation: u64,
    last: Option<LogId<NodeId>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The task that deletes purged entries ([`reap_loop`]). The caller runs it
/// (a node, under its supervisor) for as long as the log is open; it ends
/// once every handle of the [`LogStore`] is dropped. Without it, purged
/// entries stay on disk.
pub type Reaper = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'static>>;

/// How often the reaper looks at the outbox's hold without being woken: the
/// hold moves with every receipt the publisher commits.
const REAP_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Deletes purged entries, but never one the outbox still reads a message
/// from (`hold`, kept by the state machine): until it is published, a first
/// copy's payload exists only in its log entry.
///
/// The hold is that of a checkpoint made before the state is flushed and
/// the entries deleted. A state recovered after a crash is at least that
/// checkpoint, and the hold only grows as the state moves on, so a recovered
/// state never points at a deleted entry.
async fn reap_loop(
    log: sled::Tree,
    state: StateStore,
    first_kept: Arc<AtomicU64>,
    guard: Arc<Mutex<Guard>>,
    mut wake: mpsc::UnboundedReceiver<()>,
    passes: Arc<watch::Sender<u64>>,
) {
    let mut deleted_below = 0u64;
    loop {
        // Woken by a purge, or on the tick; the channel closes with the store.
        if let Ok(None) = tokio::time::timeout(REAP_EVERY, wake.recv()).await {
            return;
        }
        // The purge point this pass saw: every purge up to it is served.
        let served = first_kept.load(Ordering::Acquire);
        reap_once(&log, &state, served, &guard, &mut deleted_below).await;
        passes.send_modify(|n| *n = (*n).max(served));
        // The durable position the group commit's last run recorded, synced
        // within a tick once the log is idle (busy, the runs sync it).
        let g = guard.clone();
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || lock(&g).sync()).await {
            tracing::warn!(error = %e, "could not sync the guard");
        }
    }
}

/// One pass of the reaper: deletes what is purged and no longer held.
/// Failures are logged and left to the next pass.
async fn reap_once(
    log: &sled::Tree,
    state: &StateStore,
    first_kept: u64,
    guard: &Arc<Mutex<Guard>>,
    deleted_below: &mut u64,
) {
    if let Err(e) = state.checkpoint() {
        tracing::warn!(error = %e, "state checkpoint before deleting log entries failed; retrying");
        return;
    }
    let target = first_kept.min(state.durable_hold());
    if target <= *deleted_below {
        return;
    }
    let flushed = {
        let state = state.clone();
        tokio::task::spawn_blocking(move || state.flush()).await
    };
    match flushed {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "syncing the state before deleting log entries failed; retrying");
            return;
        }
        Err(e) => {
            tracing::warn!(error = %e, "state sync task failed; retrying");
            return;
        }
    }
    let tree = log.clone();
    let started = std::time::Instant::now();
    let guard = guard.clone();
    let result = tokio::task::spawn_blocking(move || {
        // Recorded before anything is deleted: a state that still reads
        // from below this point is not the one the node ran with.
        lock(&guard)
            .update(|m| m.deleted_below = m.deleted_below.max(target))
            .map_err(|e| sled::Error::Io(std::io::Error::other(e.to_string())))?;
        delete_upto(&tree, target - 1)
    })
    .await;
    match result {
        Ok(Ok(n)) => {
            *deleted_below = target;
            tracing::debug!(
                below = target,
                entries = n,
                ms = started.elapsed().as_millis() as u64,
                "purged log entries deleted"
            );
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, below = target, "deleting purged log entries failed; retrying")
        }
        Err(e) => tracing::warn!(error = %e, "log reaper task failed; retrying"),
    }
}

/// Group commit: one sync of the log covers every append written before it
/// began. openraft does not wait for an append's sync before handing over
/// the next one, so under load several appends share a sync; when idle, an
/// append is synced at once.
///
/// The syncs run on the blocking pool, one run at a time, which goes on
/// while appends keep arriving and ends when none waits: `fdatasync` blocks
/// for as long as the disk takes, and on a two-core node a runtime worker is
/// too dear to spend on it. A dedicated thread did this before; the pool
/// does it as cheaply, and tokio's paused clock sees a sync in progress
/// (the whole-cluster simulation's clock would otherwise run on while the
/// disk works).
struct Flusher {
    db: Db,
    guard: Arc<Mutex<Guard>>,
    written: Arc<Mutex<Written>>,
    queue: Mutex<FlushQueue>,
}

#[derive(Default)]
struct FlushQueue {
    /// Appends written and waiting for a sync.
    waiting: Vec<LogFlushed<TypeConfig>>,
    /// Whether a run is under way; it takes `waiting` before each sync.
    running: bool,
    /// When the guard was last synced by a run.
    guarded_at: Option<Instant>,
}

impl Flusher {
    /// Reports `callback` durable after the next sync, starting a run
    /// unless one is under way (it takes the callback before its next sync).
    fn submit(self: &Arc<Self>, callback: LogFlushed<TypeConfig>) {
        let start = {
            let mut q = lock(&self.queue);
            q.waiting.push(callback);
            !std::mem::replace(&mut q.running, true)
        };
        if start {
            let me = self.clone();
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    rt.spawn_blocking(move || me.run());
                }
                // Outside a runtime (no caller of openraft's is): sync here.
                Err(_) => me.run(),
            }
        }
    }

    /// Syncs until no append waits. Blocking.
    fn run(&self) {
        loop {
            let waiting = {
                let mut q = lock(&self.queue);
                if q.waiting.is_empty() {
                    q.running = false;
                    return;
                }
                std::mem::take(&mut q.waiting)
            };
            // Every callback in `waiting` was queued after its entries were
            // written, so this sync covers them all.
            let (generation, upto) = {
                let w = lock(&self.written);
                (w.generation, w.last)
            };
            let result = self.db.sync();
            metrics::counter!("firstseen_raft_log_flushes_total").increment(1);
            let synced = result.is_ok();
            for callback in waiting {
                // G4 and G6 rest on this: openraft counts this node towards
                // a commit, which releases upstream acks, only after the
                // entries are on stable storage.
                callback.log_io_completed(
                    result
                        .as_ref()
                        .map(|_| ())
                        .map_err(|e| std::io::Error::other(e.to_string())),
                );
            }
            let mut g = lock(&self.guard);
            // Checked under the guard's lock: a truncation bumps the
            // generation before it lowers the guard, so a sync that raced
            // one never raises the mark above entries it removed.
            if synced && lock(&self.written).generation == generation {
                if let Err(e) = g.note_durable(upto) {
                    tracing::warn!(error = %e, "could not record the durable log position in the guard");
                }
            }
            // Busy, the guard is synced here at most every second; idle, the
            // reaper's tick syncs what the last run recorded.
            let mut q = lock(&self.queue);
            if q.guarded_at.is_none_or(|t| t.elapsed() >= Guard::EVERY) {
                q.guarded_at = Some(Instant::now());
                if let Err(e) = g.sync() {
                    tracing::warn!(error = %e, "could not sync the guard");
                }
            }
        }
    }
}

impl Drop for Flusher {
    /// The log is closing: the guard gets its exact last position.
    fn drop(&mut self) {
        if let Err(e) = lock(&self.guard).sync() {
            tracing::warn!(error = %e, "could not sync the guard");
        }
    }
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
pub fn decode_entry(raw: &[u8]) -> Result<Entry<TypeConfig>, bincode::Error> {
    bincode::deserialize(raw)
}

/// The vote as stored in `raft_meta`.
pub fn decode_vote(raw: &[u8]) -> Result<Vote<NodeId>, bincode::Error> {
    bincode::deserialize(raw)
}

/// The purge point as stored in `raft_meta`: a bare log id.
pub fn decode_log_id(raw: &[u8]) -> Result<LogId<NodeId>, bincode::Error> {
    bincode::deserialize(raw)
}

/// The committed log id as stored in `raft_meta`.
pub fn decode_committed(raw: &[u8]) -> Result<Option<LogId<NodeId>>, bincode::Error> {
    bincode::deserialize(raw)
}

/// The purge point recorded in a log database, before the log store opens
/// it: a state applied below it can no longer be brought up to date.
pub fn purged_in(db: &Db) -> Result<Option<LogId<NodeId>>, RaftError> {
    let meta = db.sled().open_tree("raft_meta")?;
    match meta.get(LAST_PURGED)? {
        Some(raw) => Ok(Some(decode_log_id(&raw)?)),
        None => Ok(None),
    }
}

impl LogStore {
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
        let sled = db.sled();
        let meta = sled.open_tree("raft_meta")?;
        // Stored as a bare LogId by `purge`: decoding it as an Option once
        // read the term's first byte as the tag, and failed from term 2 on.
        let purged: Option<LogId<NodeId>> = match meta.get(LAST_PURGED)? {
            Some(raw) => Some(decode_log_id(&raw)?),
            None => None,
        };
        let log = sled.open_tree("raft_log")?;
        let vote: Option<Vote<NodeId>> = match meta.get(VOTE)? {
            Some(raw) => Some(decode_vote(&raw)?),
            None => None,
        };
        let last_entry: Option<LogId<NodeId>> = match log.last()? {
            Some((_, raw)) => Some(decode_entry(&raw)?.log_id),
            None => None,
        };
        let last = last_entry.max(purged);
        let dir: PathBuf = db
            .dir()
            .map(|d| d.to_path_buf())
            .unwrap_or_else(|| PathBuf::from("(temporary)"));
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
        let entry: Entry<TypeConfig> =
            decode(&raw).map_err(|e| StoreError::Log(format!("entry {index}: {e}")))?;
        match entry.payload {
            EntryPayload::Normal(cmd) if cmd.as_observe().is_some() => Ok(cmd),
            _ => Err(StoreError::Log(format!(
                "entry {index} holds no observations"
            ))),
        }
    }

    fn get_meta<T: serde::de::DeserializeOwned>(&self, key: &[u8]) -> StorageResult<Option<T>> {
        let raw = self
            .meta
            .get(key)
            .map_err(|e| StorageIOError::read(io_err(e)))?;
        match raw {
            Some(raw) => Ok(Some(decode(&raw).map_err(StorageIOError::read)?)),
            None => Ok(None),
        }
    }

    /// Writes a metadata record and syncs the log, off the runtime's threads.
    async fn put_meta<T: serde::Serialize>(&self, key: &[u8], v: &T) -> StorageResult<()> {
        let raw = encode(v).map_err(StorageIOError::write)?;
        self.meta
            .insert(key, raw)
            .map_err(|e| StorageIOError::write(io_err(e)))?;
        self.sync().await.map_err(StorageIOError::write)?;
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

/// Deletes every entry up to `upto`, in chunks, by computed key: the
/// entries' values are never read.
fn delete_upto(log: &sled::Tree, upto: u64) -> Result<u64, sled::Error> {
    let Some((first, _)) = log.first()? else {
        return Ok(0);
    };
    let Ok(first) = <[u8; 8]>::try_from(first.as_ref()) else {
        return Ok(0);
    };
    let mut index = u64::from_be_bytes(first);
    let mut deleted = 0;
    while index <= upto {
        let end = upto.min(index.saturating_add(1_000));
        let mut batch = sled::Batch::default();
        for i in index..=end {
            batch.remove(&i.to_be_bytes());
        }
        log.apply_batch(batch)?;
        deleted += end - index + 1;
        index = end + 1;
    }
    Ok(deleted)
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<Entry<TypeConfig>>> {
        let start = match range.start_bound() {
            Bound::Included(x) => *x,
            Bound::Excluded(x) => x + 1,
            Bound::Unbounded => 0,
        }
        .max(self.first_kept.load(Ordering::Acquire));
        let mut out = Vec::new();
        for item in self.log.range(start.to_be_bytes()..) {
            let (k, v) = item.map_err(|e| StorageIOError::read_logs(io_err(e)))?;
            let index = u64::from_be_bytes(
                k.as_ref()
                    .try_into()
                    .map_err(|e| StorageIOError::read_logs(io_err(e)))?,
            );
            if !range.contains(&index) {
                break;
            }
            out.push(decode(&v).map_err(StorageIOError::read_logs)?);
        }
        Ok(out)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> StorageResult<LogState<TypeConfig>> {
        let last_purged_log_id: Option<LogId<NodeId>> = self.get_meta(LAST_PURGED)?;
        let last = match self
            .log
            .last()
            .map_err(|e| StorageIOError::read_logs(io_err(e)))?
        {
            Some((_, v)) => {
                let e: Entry<TypeConfig> = decode(&v).map_err(StorageIOError::read_logs)?;
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

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> StorageResult<()> {
        // Synced before returning, and recorded in the guard: a vote
        // forgotten in a power cut could let this node vote twice in a term.
        self.put_meta(VOTE, vote).await?;
        let vote = *vote;
        self.guard(move |m| m.vote = Some(vote))
            .await
            .map_err(|e| StorageIOError::write_vote(e).into())
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote<NodeId>>> {
        self.get_meta(VOTE)
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> StorageResult<()> {
        // Not flushed on its own: losing it only means re-deriving the commit
        // index from a quorum after a restart.
        let raw = encode(&committed).map_err(StorageIOError::write)?;
        self.meta
            .insert(COMMITTED, raw)
            .map_err(|e| StorageIOError::write(io_err(e)))?;
        Ok(())
    }

    async fn read_committed(&mut self) -> StorageResult<Option<LogId<NodeId>>> {
        Ok(self.get_meta::<Option<LogId<NodeId>>>(COMMITTED)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StorageResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
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
        let mut last = None;
        for entry in entries {
            let raw = encode(&entry).map_err(StorageIOError::write_logs)?;
            count += 1;
            bytes += raw.len() as u64;
            self.log
                .insert(entry.log_id.index.to_be_bytes(), raw)
                .map_err(|e| StorageIOError::write_logs(io_err(e)))?;
            last = Some(entry.log_id);
        }
        // The benchmark reports Raft entries and bytes per second from these.
        metrics::counter!("firstseen_raft_log_entries_total").increment(count);
        metrics::counter!("firstseen_raft_log_bytes_total").increment(bytes);
        if last.is_some() {
            let mut w = lock(&self.written);
            w.last = w.last.max(last);
        }
        // Reported durable by the group commit, never before a sync.
        self.flusher.submit(callback);
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        // Rare in a healthy cluster (a tail from a deposed leader), so worth
        // a line: a node truncating again and again is a livelock to see.
        tracing::info!(from = %log_id, "truncating a conflicting log tail");
        metrics::counter!("firstseen_raft_log_truncations_total").increment(1);
        // Entries from `log_id` on were never committed (openraft truncates
        // only a conflicting tail). The guard's durable mark goes below them
        // first, so it never claims what is about to be removed.
        let before: Option<LogId<NodeId>> =
            match self.log.range(..log_id.index.to_be_bytes()).next_back() {
                Some(item) => {
                    let (_, raw) = item.map_err(|e| StorageIOError::write_logs(io_err(e)))?;
                    let e: Entry<TypeConfig> = decode(&raw).map_err(StorageIOError::write_logs)?;
                    Some(e.log_id)
                }
                None => self.get_meta(LAST_PURGED)?,
            };
        {
            let mut w = lock(&self.written);
            w.generation += 1;
            w.last = w.last.min(before);
        }
        self.guard(move |m| m.durable = m.durable.min(before))
            .await
            .map_err(StorageIOError::write_logs)?;
        let mut batch = sled::Batch::default();
        for item in self.log.range(log_id.index.to_be_bytes()..) {
            let (k, _) = item.map_err(|e| StorageIOError::write_logs(io_err(e)))?;
            batch.remove(k);
        }
        self.log
            .apply_batch(batch)
            .map_err(|e| StorageIOError::write_logs(io_err(e)))?;
        self.sync().await.map_err(StorageIOError::write_logs)?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        // Never past the snapshot on disk: a follower's purge for a snapshot
        // it is still installing waits here for the install (see `cover`).
        self.cover
            .wait_until_covered(log_id)
            .await
            .map_err(|e| StorageIOError::write_logs(io_err(e)))?;
        // The state is written in checkpoints to its own database. Entries
        // up to `log_id` are applied, but maybe not yet durably: were they
        // purged first, a crash would leave applied state that can be neither
        // found on disk nor re-applied from the log.
        let state = self.state.clone();
        tokio::task::spawn_blocking(move || state.flush())
            .await
            .map_err(|e| StorageIOError::write_logs(io_err(e)))?
            .map_err(|e| StorageIOError::write_logs(io_err(e)))?;
        // Record the purge point first: a crash between the two steps leaves
        // extra entries, never a hole openraft does not know about.
        self.put_meta(LAST_PURGED, &log_id).await?;
        self.guard(move |m| m.purged = Some(log_id))
            .await
            .map_err(StorageIOError::write_logs)?;
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
