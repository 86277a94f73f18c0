//! Adapts the sled state machine of `firstseen-store` to openraft.
//!
//! Snapshots are files: building one streams every state tree into
//! `snapshots/current.snap` (never into memory), and installing one streams a
//! received file back into sled. A snapshot lets openraft purge the log, which
//! is what keeps the log bounded (G5).

use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    AnyError, Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, SnapshotMeta,
    StorageError, StorageIOError, StoredMembership,
};
use tokio::io::AsyncSeekExt;

use crate::{LogStore, Member, NodeId, RaftError, Response, StateStore, TypeConfig};

type StorageResult<T> = Result<T, StorageError<NodeId>>;
type Meta = SnapshotMeta<NodeId, Member>;

const CURRENT_DATA: &str = "current.snap";
const CURRENT_META: &str = "current.meta";

/// The applied position and membership, stored atomically with each apply.
type AppliedMarker = (Option<LogId<NodeId>>, StoredMembership<NodeId, Member>);

/// openraft's view of the state machine.
pub struct StateMachine {
    store: StateStore,
    /// Where a snapshot reads the unpublished messages it must carry.
    log: LogStore,
    dir: PathBuf,
    last_applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, Member>,
}

fn any(e: impl std::error::Error + 'static) -> AnyError {
    AnyError::new(&e)
}

fn unique_suffix() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default()
}

impl StateMachine {
    /// Opens the adapter over `store`, keeping snapshot files in `dir`.
    pub async fn open(store: StateStore, log: LogStore, dir: PathBuf) -> Result<Self, RaftError> {
        std::fs::create_dir_all(&dir).map_err(|source| RaftError::Io {
            path: dir.clone(),
            source,
        })?;
        // Leftovers of an interrupted build or transfer are never valid.
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with("building-") || name.starts_with("incoming-") {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        let (last_applied, membership) = match store.applied_marker()? {
            Some(raw) => bincode::deserialize::<AppliedMarker>(&raw)
                .map_err(|e| RaftError::Codec(e.to_string()))?,
            None => (None, StoredMembership::default()),
        };
        Ok(Self {
            store,
            log,
            dir,
            last_applied,
            membership,
        })
    }

    fn marker(&self) -> Result<Vec<u8>, AnyError> {
        bincode::serialize(&(self.last_applied, self.membership.clone())).map_err(any)
    }

    fn meta_now(&self) -> Meta {
        let snapshot_id = match self.last_applied {
            Some(l) => format!("{}-{}-{}", l.leader_id, l.index, unique_suffix()),
            None => format!("none-{}", unique_suffix()),
        };
        SnapshotMeta {
            last_log_id: self.last_applied,
            last_membership: self.membership.clone(),
            snapshot_id,
        }
    }
}

/// Exports the state into a temporary file in `dir` (synchronously, so it sees
/// exactly the applied state), returning its path.
fn export_to_file(store: &StateStore, log: &LogStore, dir: &Path) -> Result<PathBuf, AnyError> {
    let path = dir.join(format!("building-{}.snap", unique_suffix()));
    let file = std::fs::File::create(&path).map_err(any)?;
    let mut out = BufWriter::new(file);
    store
        .export(&mut out, &mut |index| log.observations(index))
        .map_err(any)?;
    out.flush().map_err(any)?;
    out.get_ref().sync_all().map_err(any)?;
    Ok(path)
}

/// Makes an exported file the current snapshot: data first, then the meta
/// that points at it, each renamed into place after an fsync.
fn promote(dir: &Path, data: &Path, meta: &Meta) -> Result<(), AnyError> {
    std::fs::rename(data, dir.join(CURRENT_DATA)).map_err(any)?;
    let tmp = dir.join(format!("building-{}.meta", unique_suffix()));
    let raw = bincode::serialize(meta).map_err(any)?;
    let mut f = std::fs::File::create(&tmp).map_err(any)?;
    f.write_all(&raw).map_err(any)?;
    f.sync_all().map_err(any)?;
    std::fs::rename(&tmp, dir.join(CURRENT_META)).map_err(any)?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

async fn open_current(dir: &Path) -> StorageResult<Option<Snapshot<TypeConfig>>> {
    let meta_path = dir.join(CURRENT_META);
    let raw = match tokio::fs::read(&meta_path).await {
        Ok(raw) => raw,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StorageIOError::read_snapshot(None, any(e)).into()),
    };
    let meta: Meta =
        bincode::deserialize(&raw).map_err(|e| StorageIOError::read_snapshot(None, any(e)))?;
    let file = tokio::fs::File::open(dir.join(CURRENT_DATA))
        .await
        .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), any(e)))?;
    Ok(Some(Snapshot {
        meta,
        snapshot: Box::new(file),
    }))
}

/// A snapshot whose data was already exported when openraft asked for a builder.
pub struct Builder {
    dir: PathBuf,
    exported: Result<PathBuf, AnyError>,
    meta: Meta,
}

impl RaftSnapshotBuilder<TypeConfig> for Builder {
    async fn build_snapshot(&mut self) -> StorageResult<Snapshot<TypeConfig>> {
        let sig = Some(self.meta.signature());
        let data = match &self.exported {
            Ok(p) => p.clone(),
            Err(e) => return Err(StorageIOError::write_snapshot(sig, e.clone()).into()),
        };
        let (dir, meta) = (self.dir.clone(), self.meta.clone());
        tokio::task::spawn_blocking(move || promote(&dir, &data, &meta))
            .await
            .map_err(|e| StorageIOError::write_snapshot(sig.clone(), any(e)))?
            .map_err(|e| StorageIOError::write_snapshot(sig.clone(), e))?;
        tracing::info!(snapshot = %self.meta.snapshot_id, "snapshot built");
        open_current(&self.dir).await?.ok_or_else(|| {
            StorageIOError::read_snapshot(sig, AnyError::error("snapshot vanished")).into()
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = Builder;

    async fn applied_state(
        &mut self,
    ) -> StorageResult<(Option<LogId<NodeId>>, StoredMembership<NodeId, Member>)> {
        Ok((self.last_applied, self.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> StorageResult<Vec<Response>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut out = Vec::new();
        for entry in entries {
            self.last_applied = Some(entry.log_id);
            let cmd = match entry.payload {
                EntryPayload::Blank => None,
                EntryPayload::Normal(cmd) => Some(cmd),
                EntryPayload::Membership(m) => {
                    self.membership = StoredMembership::new(Some(entry.log_id), m);
                    None
                }
            };
            let marker = self
                .marker()
                .map_err(|e| StorageIOError::apply(entry.log_id, e))?;
            let response = self
                .store
                .apply(cmd.as_ref(), entry.log_id.index, &marker)
                .map_err(|e| StorageIOError::apply(entry.log_id, any(e)))?;
            out.push(response);
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        // Exported here, on the state machine's own task, so no apply can
        // interleave: the file matches `last_applied` exactly.
        let meta = self.meta_now();
        let started = std::time::Instant::now();
        // On the blocking pool: this task still waits for it, so no apply
        // interleaves, but the runtime's worker threads (two on a 2-core
        // node) keep serving Raft RPCs and ingest meanwhile.
        let (store, log, dir) = (self.store.clone(), self.log.clone(), self.dir.clone());
        let exported = tokio::task::spawn_blocking(move || export_to_file(&store, &log, &dir))
            .await
            .unwrap_or_else(|e| Err(any(e)));
        // Apply waits for this: the benchmark reads it against latency spikes.
        tracing::info!(
            ms = started.elapsed().as_millis() as u64,
            "state exported for a snapshot"
        );
        Builder {
            exported,
            dir: self.dir.clone(),
            meta,
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> StorageResult<Box<tokio::fs::File>> {
        let path = self.dir.join(format!("incoming-{}.snap", unique_suffix()));
        let file = tokio::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .await
            .map_err(|e| StorageIOError::write_snapshot(None, any(e)))?;
        Ok(Box::new(file))
    }

    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        snapshot: Box<tokio::fs::File>,
    ) -> StorageResult<()> {
        let sig = Some(meta.signature());
        let werr = |e: AnyError| StorageError::from(StorageIOError::write_snapshot(sig.clone(), e));
        let mut file = *snapshot;
        file.seek(std::io::SeekFrom::Start(0))
            .await
            .map_err(|e| werr(any(e)))?;
        let std_file = file.into_std().await;
        let store = self.store.clone();
        let id = meta.snapshot_id.clone();
        let records = tokio::task::spawn_blocking(move || {
            store.import_with_progress(&mut BufReader::new(std_file), |n| {
                tracing::info!(snapshot = %id, records = n, "installing snapshot");
            })
        })
        .await
        .map_err(|e| werr(any(e)))?
        .map_err(|e| werr(any(e)))?;
        self.last_applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        let marker = self.marker().map_err(werr)?;
        self.store
            .apply(None, 0, &marker)
            .map_err(|e| werr(any(e)))?;
        self.store.flush().await.map_err(|e| werr(any(e)))?;
        // Keep it as our own current snapshot, so this node can serve it on.
        let exported = export_to_file(&self.store, &self.log, &self.dir).map_err(werr)?;
        let (dir, m) = (self.dir.clone(), meta.clone());
        tokio::task::spawn_blocking(move || promote(&dir, &exported, &m))
            .await
            .map_err(|e| werr(any(e)))?
            .map_err(werr)?;
        tracing::info!(snapshot = %meta.snapshot_id, records, "snapshot installed");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StorageResult<Option<Snapshot<TypeConfig>>> {
        open_current(&self.dir).await
    }
}
