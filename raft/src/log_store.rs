//! The Raft log, vote and committed marker in sled.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{
    AnyError, Entry, LogId, OptionalSend, RaftLogReader, StorageError, StorageIOError, Vote,
};

use crate::{NodeId, RaftError, TypeConfig};

const VOTE: &[u8] = b"vote";
const COMMITTED: &[u8] = b"committed";
const LAST_PURGED: &[u8] = b"last_purged";

type StorageResult<T> = Result<T, StorageError<NodeId>>;

/// Log entries keyed by big-endian index, plus a small metadata tree.
#[derive(Clone)]
pub struct LogStore {
    db: sled::Db,
    log: sled::Tree,
    meta: sled::Tree,
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
    pub fn open(db: &sled::Db) -> Result<Self, RaftError> {
        Ok(Self {
            db: db.clone(),
            log: db.open_tree("raft_log")?,
            meta: db.open_tree("raft_meta")?,
        })
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

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<Entry<TypeConfig>>> {
        let start = match range.start_bound() {
            Bound::Included(x) => *x,
            Bound::Excluded(x) => x + 1,
            Bound::Unbounded => 0,
        };
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
                Some(e.log_id)
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
        // G4 rests on this order: the entries are on disk before openraft may
        // count this node towards a commit, and only a commit releases acks.
        let flushed = self
            .db
            .flush_async()
            .await
            .map(|_| ())
            .map_err(std::io::Error::other);
        callback.log_io_completed(flushed);
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
        // Record the purge point first: a crash between the two steps leaves
        // extra entries, never a hole openraft does not know about.
        self.put_meta(LAST_PURGED, &log_id).await?;
        let mut batch = sled::Batch::default();
        for item in self.log.range(..=log_id.index.to_be_bytes()) {
            let (k, _) = item.map_err(|e| StorageIOError::write_logs(io_err(e)))?;
            batch.remove(k);
        }
        self.log
            .apply_batch(batch)
            .map_err(|e| StorageIOError::write_logs(io_err(e)))?;
        Ok(())
    }
}
