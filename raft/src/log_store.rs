//! The Raft log, vote and committed marker in sled.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{
    AnyError, Entry, LogId, OptionalSend, RaftLogReader, StorageError, StorageIOError, Vote,
};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;

use firstseen_store::{Command, Observation, StateStore, StoreError};
use openraft::EntryPayload;

use crate::{NodeId, RaftError, TypeConfig};

const VOTE: &[u8] = b"vote";
const COMMITTED: &[u8] = b"committed";
const LAST_PURGED: &[u8] = b"last_purged";

type StorageResult<T> = Result<T, StorageError<NodeId>>;

/// Log entries keyed by big-endian index, plus a small metadata tree.
#[derive(Clone)]
pub struct LogStore {
    db: sled::Db,
    /// The state machine, checkpointed and flushed before a purge (see `purge`).
    state: StateStore,
    log: sled::Tree,
    meta: sled::Tree,
    /// Appended batches waiting for the flush that makes them durable.
    flusher: mpsc::UnboundedSender<LogFlushed<TypeConfig>>,
    /// First index not purged. Entries below it may still be on disk while
    /// a background task deletes them, and are never returned to openraft.
    first_kept: Arc<AtomicU64>,
    /// Wakes the reaper after a purge; its end stops the reaper.
    reaper: mpsc::UnboundedSender<()>,
}

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
    mut wake: mpsc::UnboundedReceiver<()>,
) {
    let mut deleted_below = 0u64;
    loop {
        // Woken by a purge, or on the tick; the channel closes with the store.
        if let Ok(None) = tokio::time::timeout(REAP_EVERY, wake.recv()).await {
            return;
        }
        if let Err(e) = state.checkpoint() {
            tracing::warn!(error = %e, "state checkpoint before deleting log entries failed; retrying");
            continue;
        }
        let target = first_kept.load(Ordering::Acquire).min(state.durable_hold());
        if target <= deleted_below {
            continue;
        }
        if let Err(e) = state.flush().await {
            tracing::warn!(error = %e, "flushing the state before deleting log entries failed; retrying");
            continue;
        }
        let tree = log.clone();
        let started = std::time::Instant::now();
        let result = tokio::task::spawn_blocking(move || delete_upto(&tree, target - 1)).await;
        match result {
            Ok(Ok(n)) => {
                deleted_below = target;
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
}

/// Group commit: one fsync covers every append made before it started.
/// openraft does not wait for an append's flush before handing over the next
/// one, so under load several appends share a flush instead of each paying
/// for its own; when idle, an append is flushed at once, as before.
async fn flush_loop(db: sled::Db, mut rx: mpsc::UnboundedReceiver<LogFlushed<TypeConfig>>) {
    let mut waiting = Vec::new();
    while let Some(first) = rx.recv().await {
        waiting.push(first);
        while let Ok(more) = rx.try_recv() {
            waiting.push(more);
        }
        // Every callback in `waiting` was queued after its entries were
        // written, so this flush covers them all.
        let result = db.flush_async().await.map_err(|e| e.to_string());
        metrics::counter!("firstseen_raft_log_flushes_total").increment(1);
        for callback in waiting.drain(..) {
            // G4 rests on this: openraft counts this node towards a commit,
            // which releases upstream acks, only after the entries are on disk.
            callback.log_io_completed(result.clone().map(|_| ()).map_err(std::io::Error::other));
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

impl LogStore {
    /// Opens the log trees in `db` and starts its flusher task, so it must be
    /// called inside a tokio runtime. The task ends when the last clone of
    /// the store is dropped.
    ///
    /// `state` is the state machine: it is made durable before a purge, and
    /// its outbox holds back the entries it still reads messages from.
    pub fn open(db: &sled::Db, state: StateStore) -> Result<Self, RaftError> {
        let (flusher, rx) = mpsc::unbounded_channel();
        tokio::spawn(flush_loop(db.clone(), rx));
        let meta = db.open_tree("raft_meta")?;
        // Stored as a bare LogId by `purge`: decoding it as an Option once
        // read the term's first byte as the tag, and failed from term 2 on.
        let purged: Option<LogId<NodeId>> = match meta.get(LAST_PURGED)? {
            Some(raw) => {
                Some(decode::<LogId<NodeId>>(&raw).map_err(|e| RaftError::Codec(e.to_string()))?)
            }
            None => None,
        };
        let log = db.open_tree("raft_log")?;
        let first_kept = Arc::new(AtomicU64::new(purged.map_or(0, |l| l.index + 1)));
        let (reaper, wake) = mpsc::unbounded_channel();
        tokio::spawn(reap_loop(
            log.clone(),
            state.clone(),
            first_kept.clone(),
            wake,
        ));
        Ok(Self {
            db: db.clone(),
            state,
            log,
            meta,
            flusher,
            first_kept,
            reaper,
        })
    }

    /// The observations of entry `index`, even if openraft has purged it:
    /// the outbox reads unpublished payloads from here.
    pub fn observations(&self, index: u64) -> Result<Vec<Observation>, StoreError> {
        let raw = self
            .log
            .get(index.to_be_bytes())
            .map_err(StoreError::Sled)?
            .ok_or_else(|| StoreError::Log(format!("entry {index} is not in the log")))?;
        let entry: Entry<TypeConfig> =
            decode(&raw).map_err(|e| StoreError::Log(format!("entry {index}: {e}")))?;
        match entry.payload {
            EntryPayload::Normal(Command::Observe { observations, .. }) => Ok(observations),
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

    async fn put_meta<T: serde::Serialize>(&self, key: &[u8], v: &T) -> StorageResult<()> {
        let raw = encode(v).map_err(StorageIOError::write)?;
        self.meta
            .insert(key, raw)
            .map_err(|e| StorageIOError::write(io_err(e)))?;
        self.db
            .flush_async()
            .await
            .map_err(|e| StorageIOError::write(io_err(e)))?;
        Ok(())
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
        // Flushed before returning: a vote forgotten in a crash could let this
        // node vote twice in one term.
        self.put_meta(VOTE, vote).await
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
        let mut batch = sled::Batch::default();
        let (mut count, mut bytes) = (0u64, 0u64);
        for entry in entries {
            let raw = encode(&entry).map_err(StorageIOError::write_logs)?;
            count += 1;
            bytes += raw.len() as u64;
            batch.insert(&entry.log_id.index.to_be_bytes(), raw);
        }
        // The benchmark reports Raft entries and bytes per second from these.
        metrics::counter!("firstseen_raft_log_entries_total").increment(count);
        metrics::counter!("firstseen_raft_log_bytes_total").increment(bytes);
        self.log
            .apply_batch(batch)
            .map_err(|e| StorageIOError::write_logs(io_err(e)))?;
        // Reported durable by the flusher, never before the flush.
        if let Err(mpsc::error::SendError(callback)) = self.flusher.send(callback) {
            // The flusher is gone only while the runtime shuts down: flush here.
            let flushed = self
                .db
                .flush_async()
                .await
                .map(|_| ())
                .map_err(std::io::Error::other);
            callback.log_io_completed(flushed);
        }
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        let mut batch = sled::Batch::default();
        for item in self.log.range(log_id.index.to_be_bytes()..) {
            let (k, _) = item.map_err(|e| StorageIOError::write_logs(io_err(e)))?;
            batch.remove(k);
        }
        self.log
            .apply_batch(batch)
            .map_err(|e| StorageIOError::write_logs(io_err(e)))?;
        self.db
            .flush_async()
            .await
            .map_err(|e| StorageIOError::write_logs(io_err(e)))?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        // The state is written in checkpoints to its own database. Entries
        // up to `log_id` are applied, but maybe not yet durably: were they
        // purged first, a crash would leave applied state that can be neither
        // found on disk nor re-applied from the log.
        self.state
            .flush()
            .await
            .map_err(|e| StorageIOError::write_logs(io_err(e)))?;
        // Record the purge point first: a crash between the two steps leaves
        // extra entries, never a hole openraft does not know about.
        self.put_meta(LAST_PURGED, &log_id).await?;
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
