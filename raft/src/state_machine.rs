//! Adapts the sled state machine of `firstseen-store` to openraft.
//!
//! Snapshots are files: building one streams every state tree into a file
//! under `snapshots/` (never into memory), and installing one streams a
//! received file back into sled. A snapshot lets openraft purge the log, which
//! is what keeps the log bounded (G5). The files themselves, their checks
//! and their promotion are [`crate::snapshot_files`].

use std::io::BufReader;
use std::path::PathBuf;

use futures::StreamExt;
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{AnyError, EntryPayload, OptionalSend, RaftSnapshotBuilder};
use tokio::io::AsyncSeekExt;

use crate::cover::SnapshotCover;
use crate::snapshot_files::{
    any, copy_to_file, export_to_file, hash_file, id_hash, same_file, unique_suffix, Exported,
    Promotions, Source,
};
use crate::snapshot_files::{current_snapshot, Meta};
pub use crate::snapshot_files::{decode_current_meta, restore_current};
use crate::{
    LogId, LogStore, RaftError, Snapshot, StateStore, StorageResult, StoredMembership, TypeConfig,
};

/// The applied position and membership, stored atomically with each apply.
type AppliedMarker = (Option<LogId>, StoredMembership);

/// The ids of the snapshots the peer server received whole, as their
/// senders named them (`…-<blake3>`), newest last: openraft 0.10 hands the
/// state machine a snapshot's metadata without one, and the hash in it is
/// what the received file is checked against before it is installed.
///
/// A list, not one slot: the server serves each request on a task of its
/// own, so the last chunks of two transfers (a leader's snapshot and the
/// newer one it built meanwhile) can pass each other. With one slot the
/// second id overwrote the first before the first was installed, the
/// file was checked against the other snapshot's hash, and the follower's
/// Raft stopped on a "damaged" snapshot that was whole (whole-cluster
/// simulation, seed 1796594863220 with `SIM_PIPELINE=level`). Each install
/// takes the id whose hash its file has.
#[derive(Clone, Default)]
pub struct Incoming(std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<String>>>);

impl Incoming {
    /// Ids kept at most: a transfer that never reaches an install (openraft
    /// refused it as older) must not stay for ever.
    const KEPT: usize = 8;

    /// Notes a snapshot received whole, before Raft installs it.
    pub fn received(&self, snapshot_id: String) {
        let mut ids = firstseen_store::lock::lock(&self.0);
        if ids.len() == Self::KEPT {
            ids.pop_front();
        }
        ids.push_back(snapshot_id);
    }

    /// Takes the id whose hash is `blake3`; else, when some were received,
    /// the newest of them (the file is then not what any sender hashed).
    /// `None` when nothing was received: a snapshot of this node's own.
    fn take_for(&self, blake3: &str) -> Option<String> {
        let mut ids = firstseen_store::lock::lock(&self.0);
        match ids.iter().position(|id| id_hash(id) == Some(blake3)) {
            Some(at) => ids.remove(at),
            None => ids.back().cloned(),
        }
    }
}

/// openraft's view of the state machine.
pub struct StateMachine {
    store: StateStore,
    /// Where a snapshot reads the unpublished messages it must carry.
    log: LogStore,
    dir: PathBuf,
    last_applied: Option<LogId>,
    membership: StoredMembership,
    /// The file `begin_receiving_snapshot` handed out last, which becomes
    /// the current snapshot once installed.
    receiving: Option<PathBuf>,
    /// The id its sender gave it (see [`Incoming`]).
    incoming: Incoming,
    /// Told of every snapshot that reaches the disk, so the log's purges
    /// wait for it.
    cover: SnapshotCover,
    /// Shared with every builder this hands out.
    promotions: Promotions,
}

impl StateMachine {
    /// Opens the adapter over `store`, keeping snapshot files in `dir`.
    pub async fn open(
        store: StateStore,
        log: LogStore,
        dir: PathBuf,
        cover: SnapshotCover,
    ) -> Result<Self, RaftError> {
        // Its name must outlive a power cut, or so would none of the
        // snapshots in it: with the log purged past them, the node could
        // not rebuild its state.
        firstseen_store::disk::create_dir_durable(&dir)?;
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
            Some(raw) => bincode::deserialize::<AppliedMarker>(&raw).map_err(RaftError::Codec)?,
            None => (None, StoredMembership::default()),
        };
        Ok(Self {
            store,
            log,
            dir,
            last_applied,
            membership,
            receiving: None,
            incoming: Incoming::default(),
            cover,
            promotions: Promotions::default(),
        })
    }

    fn marker(&self) -> Result<Vec<u8>, AnyError> {
        bincode::serialize(&(self.last_applied, self.membership.clone())).map_err(any)
    }

    /// Applies `entries` as openraft would, without anyone awaiting their
    /// responses: for tools and tests that drive the state machine alone.
    pub async fn apply_entries(
        &mut self,
        entries: impl IntoIterator<Item = crate::Entry>,
    ) -> StorageResult<()> {
        let items: Vec<Result<EntryResponder<TypeConfig>, std::io::Error>> =
            entries.into_iter().map(|e| Ok((e, None))).collect();
        self.apply(futures::stream::iter(items)).await
    }

    /// Where the peer server puts the id of the snapshot it is receiving.
    pub fn incoming(&self) -> Incoming {
        self.incoming.clone()
    }

    /// Installs a received snapshot: first as the current snapshot on disk,
    /// then into the state.
    ///
    /// In that order so that every moment a crash can come leaves a node
    /// that starts: the log's purge for this snapshot waits until it is on
    /// disk (see [`crate::cover`]), and a state import cut short is refused
    /// at the next start and rebuilt from that snapshot. Promoted last, as
    /// before, a kill during the import left a purge point past the only
    /// snapshot on disk, and the node never started again (finding 16).
    async fn install(&mut self, meta: &Meta, file: tokio::fs::File) -> StorageResult<()> {
        let werr = std::io::Error::other;
        let mut file = file;
        file.seek(std::io::SeekFrom::Start(0))
            .await
            .map_err(|e| werr(any(e)))?;
        let mut std_file = file.into_std().await;
        // The bytes in a file of their own in the snapshots directory,
        // synced, with their hash: the file handed out for receiving when
        // that is what openraft passed here (it always is in a node), or a
        // copy of what it passed.
        let (received, dir) = (self.receiving.take(), self.dir.clone());
        let (exported, f) = tokio::task::spawn_blocking(move || {
            let exported = match received {
                Some(path) if same_file(&path, &std_file) => {
                    hash_file(&path).and_then(|(blake3, len)| {
                        std_file.sync_all()?;
                        Ok(Exported { path, blake3, len })
                    })
                }
                other => {
                    if let Some(unused) = other {
                        let _ = std::fs::remove_file(unused);
                    }
                    copy_to_file(&mut std_file, &dir)
                }
            };
            let rewound = std::io::Seek::seek(&mut std_file, std::io::SeekFrom::Start(0));
            (rewound.and(exported), std_file)
        })
        .await
        .map_err(|e| werr(any(e)))?;
        std_file = f;
        let exported = exported.map_err(|e| werr(any(e)))?;
        // A snapshot whose bytes are not what the sender hashed is refused
        // before any of it reaches the disk's current snapshot or the state.
        let mut meta = meta.clone();
        if let Some(sent) = self.incoming.take_for(&exported.blake3) {
            meta.snapshot_id = sent;
        }
        match id_hash(&meta.snapshot_id) {
            Some(want) if want != exported.blake3 => {
                let _ = std::fs::remove_file(&exported.path);
                return Err(werr(any(RaftError::Damaged {
                    path: exported.path.clone(),
                    reason: format!(
                        "snapshot {} received with blake3 {}, expected {want}",
                        meta.snapshot_id, exported.blake3
                    ),
                })));
            }
            Some(_) => {}
            // Not named by its hash: named so now, as this node serves it on.
            None => meta.snapshot_id = format!("{}-{}", meta.snapshot_id, exported.blake3),
        }
        {
            let (dir, m, promotions) = (self.dir.clone(), meta.clone(), self.promotions.clone());
            tokio::task::spawn_blocking(move || {
                promotions.promote(&dir, &exported, &m, Source::Installed)
            })
            .await
            .map_err(|e| werr(any(e)))?
            .map_err(werr)?;
        }
        self.cover.installed(meta.last_log_id);
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
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || store.flush())
            .await
            .map_err(|e| werr(any(e)))?
            .map_err(|e| werr(any(e)))?;
        tracing::info!(snapshot = %meta.snapshot_id, records, "snapshot installed");
        Ok(())
    }

    fn meta_now(&self) -> Meta {
        let snapshot_id = match &self.last_applied {
            Some(l) => format!("{}-{}-{}", l.leader_id, l.index, unique_suffix()),
            None => format!("none-{}", unique_suffix()),
        };
        Meta {
            last_log_id: self.last_applied,
            last_membership: self.membership.clone(),
            snapshot_id,
        }
    }
}

/// The log id an applied marker records.
pub fn decode_applied(raw: &[u8]) -> Result<Option<LogId>, bincode::Error> {
    Ok(bincode::deserialize::<AppliedMarker>(raw)?.0)
}

/// The last log id a loaded state has applied, from its marker.
pub fn applied_in(store: &StateStore) -> Result<Option<LogId>, RaftError> {
    match store.applied_marker()? {
        Some(raw) => Ok(decode_applied(&raw).map_err(RaftError::Codec)?),
        None => Ok(None),
    }
}

/// A snapshot whose data was already exported when openraft asked for a builder.
pub struct Builder {
    dir: PathBuf,
    exported: Result<Exported, AnyError>,
    meta: Meta,
    cover: SnapshotCover,
    promotions: Promotions,
}

impl RaftSnapshotBuilder<TypeConfig> for Builder {
    type SnapshotData = tokio::fs::File;

    async fn build_snapshot(&mut self) -> StorageResult<Snapshot> {
        let exported = match std::mem::replace(
            &mut self.exported,
            Err(AnyError::error("snapshot already built")),
        ) {
            Ok(e) => e,
            Err(e) => return Err(std::io::Error::other(e)),
        };
        // The id ends with the data's hash, so a receiver can check it.
        self.meta.snapshot_id = format!("{}-{}", self.meta.snapshot_id, exported.blake3);
        let (dir, meta, promotions) =
            (self.dir.clone(), self.meta.clone(), self.promotions.clone());
        let promoted = tokio::task::spawn_blocking(move || {
            promotions.promote(&dir, &exported, &meta, Source::Built)
        })
        .await
        .map_err(std::io::Error::other)?
        .map_err(std::io::Error::other)?;
        if promoted {
            self.cover.built(self.meta.last_log_id);
            tracing::info!(snapshot = %self.meta.snapshot_id, "snapshot built");
        } else {
            // openraft takes the newer one it is handed below, as if built.
            tracing::info!(
                snapshot = %self.meta.snapshot_id,
                "snapshot built, then dropped: a newer one was installed meanwhile"
            );
        }
        current_snapshot(&self.dir)
            .await?
            .ok_or_else(|| std::io::Error::other("snapshot vanished"))
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = tokio::fs::File;
    type SnapshotBuilder = Builder;

    async fn applied_state(&mut self) -> StorageResult<(Option<LogId>, StoredMembership)> {
        Ok((self.last_applied, self.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> StorageResult<()>
    where
        Strm: futures::Stream<Item = Result<EntryResponder<TypeConfig>, std::io::Error>>
            + Unpin
            + OptionalSend,
    {
        let applying = metrics::histogram!("firstseen_commit_leg_seconds", "leg" => "apply");
        while let Some(item) = entries.next().await {
            let (entry, responder) = item?;
            let started = std::time::Instant::now();
            let log_id = entry.log_id;
            self.last_applied = Some(log_id);
            let cmd = match entry.payload {
                EntryPayload::Blank => None,
                EntryPayload::Normal(cmd) => Some(cmd),
                EntryPayload::Membership(m) => {
                    self.membership = StoredMembership::new(Some(log_id), m);
                    None
                }
            };
            let marker = self.marker().map_err(std::io::Error::other)?;
            let response = match self.store.apply(cmd.as_ref(), log_id.index, &marker) {
                Ok(r) => r,
                Err(e) => {
                    // Applying a committed entry cannot fail on sound data:
                    // the state is damaged, and without this every restart
                    // re-applied the same entry and stopped on it again.
                    if crate::damage::store_damage(&e) {
                        if let Some(raft_dir) = self.dir.parent() {
                            crate::damage::mark_state_damaged(raft_dir, &e.to_string());
                        }
                    }
                    return Err(std::io::Error::other(format!("applying {log_id}: {e}")));
                }
            };
            if let Some(responder) = responder {
                responder.send(response);
            }
            applying.record(started.elapsed().as_secs_f64());
        }
        Ok(())
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
            cover: self.cover.clone(),
            promotions: self.promotions.clone(),
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &crate::SnapshotMeta,
        snapshot: tokio::fs::File,
    ) -> StorageResult<()> {
        // One of this node's names, which `install` replaces with the id
        // its sender named it by (`Incoming`), or completes with the data's
        // hash.
        let snapshot_id = match &meta.last_log_id {
            Some(l) => format!("{}-{}-{}", l.leader_id, l.index, unique_suffix()),
            None => format!("none-{}", unique_suffix()),
        };
        let meta = Meta {
            last_log_id: meta.last_log_id,
            last_membership: meta.last_membership.clone(),
            snapshot_id,
        };
        let result = self.install(&meta, snapshot).await;
        if result.is_err() {
            // A purge openraft queued with this install must not pass the
            // snapshot on disk, which may still be the old one.
            self.cover.install_failed();
        }
        result
    }

    async fn get_current_snapshot(&mut self) -> StorageResult<Option<Snapshot>> {
        current_snapshot(&self.dir).await
    }
}

/// The chunked transfer of openraft 0.9's protocol, which peers of the
/// previous release still speak, writes a received snapshot into a file of
/// the snapshots directory: the one `install` then makes current without
/// a copy.
impl openraft_legacy::network_v1::SnapshotReceiverFactory<TypeConfig> for StateMachine {
    type SnapshotReceiver = tokio::fs::File;

    async fn begin_receiving_snapshot(&mut self) -> StorageResult<tokio::fs::File> {
        let path = self.dir.join(format!("incoming-{}.snap", unique_suffix()));
        let file = tokio::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .await?;
        self.receiving = Some(path);
        self.cover.receiving();
        Ok(file)
    }
}
