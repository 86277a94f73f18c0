//! The snapshot files of one node, under `snapshots/`.
//!
//! `current.meta` names the current snapshot's data file (`snap-….snap`)
//! and holds its length and blake3 hash; the hash is also the last part of
//! the snapshot id, so a node receiving one checks the file before
//! installing it, and a node serving or reopening one checks its own. A
//! damaged snapshot is refused with an error naming the file, never
//! installed or sent. Files are written whole and synced before a name
//! points at them, and promotes take turns (`Promotions`); the state
//! machine in [`crate::state_machine`] decides when.

use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use openraft::AnyError;
use serde::{Deserialize, Serialize};

use crate::{LogId, LogStore, RaftError, Snapshot, StateStore, StorageResult, StoredMembership};

/// A snapshot's metadata as firstseen keeps it: what it covers, and the id
/// that names it and ends with its data's blake3. openraft 0.10 dropped the
/// id from its own metadata; this keeps 0.9's three fields in 0.9's order,
/// so a `current.meta` reads the same in either release.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    pub last_log_id: Option<LogId>,
    pub last_membership: StoredMembership,
    pub snapshot_id: String,
}

impl Meta {
    /// openraft's metadata: what the snapshot covers.
    pub fn openraft(&self) -> crate::SnapshotMeta {
        crate::SnapshotMeta {
            last_log_id: self.last_log_id,
            last_membership: self.last_membership.clone(),
        }
    }
}

pub(crate) fn any(e: impl std::error::Error + 'static) -> AnyError {
    AnyError::new(&e)
}

pub(crate) const CURRENT_META: &str = "current.meta";

/// What `current.meta` holds: openraft's metadata, and the data file with
/// what it must hash to.
#[derive(serde::Serialize, serde::Deserialize)]
struct Current {
    meta: Meta,
    /// File name of the data, in the snapshots directory.
    data: String,
    len: u64,
    blake3: String,
}

/// A writer that hashes what passes through it.
struct Hashing<W> {
    inner: W,
    hasher: blake3::Hasher,
    len: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// blake3 and length of a file, read in chunks.
pub(crate) fn hash_file(path: &Path) -> std::io::Result<(String, u64)> {
    hash_reader(&mut std::fs::File::open(path)?)
}

/// blake3 and length of everything `f` has left to read.
fn hash_reader(f: &mut impl std::io::Read) -> std::io::Result<(String, u64)> {
    let mut hasher = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut len = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        len += n as u64;
    }
    Ok((hasher.finalize().to_hex().to_string(), len))
}

/// The hash a snapshot id ends with (`…-<blake3 hex>`).
pub(crate) fn id_hash(snapshot_id: &str) -> Option<&str> {
    snapshot_id
        .rsplit_once('-')
        .map(|(_, h)| h)
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

pub(crate) fn unique_suffix() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default()
}

/// A state exported to a file, not yet the current snapshot.
pub(crate) struct Exported {
    pub(crate) path: PathBuf,
    pub(crate) blake3: String,
    pub(crate) len: u64,
}

/// Exports the state into a new file in `dir` (synchronously, so it sees
/// exactly the applied state), synced, with its hash.
pub(crate) fn export_to_file(
    store: &StateStore,
    log: &LogStore,
    dir: &Path,
) -> Result<Exported, AnyError> {
    let path = dir.join(format!("building-{}.snap", unique_suffix()));
    let file = std::fs::File::create(&path).map_err(any)?;
    let mut out = BufWriter::new(Hashing {
        inner: file,
        hasher: blake3::Hasher::new(),
        len: 0,
    });
    store
        .export(&mut out, &mut |index| log.command(index))
        .map_err(any)?;
    out.flush().map_err(any)?;
    let hashing = out.into_inner().map_err(|e| any(e.into_error()))?;
    hashing.inner.sync_all().map_err(any)?;
    Ok(Exported {
        path,
        blake3: hashing.hasher.finalize().to_hex().to_string(),
        len: hashing.len,
    })
}

/// Whether `path` names the file `file` is open on.
pub(crate) fn same_file(path: &Path, file: &std::fs::File) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(path), file.metadata()) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

/// Copies a snapshot's bytes from `from` into a new synced file in `dir`,
/// hashing them on the way.
pub(crate) fn copy_to_file(from: &mut std::fs::File, dir: &Path) -> std::io::Result<Exported> {
    let path = dir.join(format!("incoming-{}.snap", unique_suffix()));
    let mut out = Hashing {
        inner: std::fs::File::create(&path)?,
        hasher: blake3::Hasher::new(),
        len: 0,
    };
    std::io::copy(from, &mut out)?;
    out.inner.sync_all()?;
    Ok(Exported {
        path,
        blake3: out.hasher.finalize().to_hex().to_string(),
        len: out.len,
    })
}

/// Where a snapshot being promoted came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// Exported from this node's state. openraft builds on a task of its
    /// own, so a build can finish after an install that overtook it.
    Built,
    /// Received from the leader: always newer than anything applied here.
    Installed,
}

/// The one way into a snapshots directory: promotes take turns.
///
/// openraft 0.9 runs a snapshot build beside the state machine's task, so
/// a follower can promote its own build and the leader's snapshot at the
/// same moment. Each promote deletes every data file but its own once its
/// meta is in; interleaved, each deleted the other's, and the meta was left
/// naming a file that no longer existed (seed 1796382805000 of the
/// whole-cluster simulation: openraft stopped on the read).
#[derive(Clone, Default)]
pub(crate) struct Promotions(Arc<Mutex<()>>);

impl Promotions {
    /// Makes `exported` the current snapshot, unless it is a build no newer
    /// than the snapshot already current: the log may be purged up to that
    /// one, so replacing it with an older one would leave a node that
    /// rebuilds its state from disk with a gap. Returns whether it was
    /// promoted; an export not promoted is deleted.
    pub(crate) fn promote(
        &self,
        dir: &Path,
        exported: &Exported,
        meta: &Meta,
        source: Source,
    ) -> Result<bool, AnyError> {
        // Held across blocking I/O on purpose: promotes are rare (one per
        // few thousand entries) and run on the blocking pool.
        let _turn = crate::lock(&self.0);
        if source == Source::Built {
            if let Some(current) = on_disk(dir) {
                if meta.last_log_id <= Some(current) {
                    let _ = std::fs::remove_file(&exported.path);
                    return Ok(false);
                }
            }
        }
        promote(dir, exported, meta)?;
        Ok(true)
    }
}

/// Makes an exported file the current snapshot. The data keeps a name of
/// its own (`snap-….snap`); `current.meta` is written beside it, synced and
/// renamed over the old one, and the directory synced, so the meta never
/// names data other than its own, whatever moment a crash comes. Older data
/// files are removed afterwards. Only through [`Promotions`], which keeps
/// two promotes from deleting each other's data.
fn promote(dir: &Path, exported: &Exported, meta: &Meta) -> Result<(), AnyError> {
    let name = format!("snap-{}.snap", unique_suffix());
    std::fs::rename(&exported.path, dir.join(&name)).map_err(any)?;
    let current = Current {
        meta: meta.clone(),
        data: name.clone(),
        len: exported.len,
        blake3: exported.blake3.clone(),
    };
    let tmp = dir.join(format!("building-{}.meta", unique_suffix()));
    let raw = bincode::serialize(&current).map_err(any)?;
    let mut f = std::fs::File::create(&tmp).map_err(any)?;
    f.write_all(&raw).map_err(any)?;
    f.sync_all().map_err(any)?;
    std::fs::rename(&tmp, dir.join(CURRENT_META)).map_err(any)?;
    firstseen_store::disk::sync_dir(dir).map_err(any)?;
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with("snap-") && n != name {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    Ok(())
}

/// The last entry of the current snapshot in `dir`, from its meta alone
/// (the data is checked against it where it is read). `None` when there is
/// none or its meta cannot be read; the first read of it reports that.
pub(crate) fn on_disk(dir: &Path) -> Option<LogId> {
    let raw = std::fs::read(dir.join(CURRENT_META)).ok()?;
    decode_current_meta(&raw).ok()?
}

/// The last log id `current.meta` names. Public, like the other decoders of
/// what a node reads from disk, for the fuzz target `stored`.
pub fn decode_current_meta(raw: &[u8]) -> Result<Option<LogId>, bincode::Error> {
    Ok(bincode::deserialize::<Current>(raw)?.meta.last_log_id)
}

/// Loads the current snapshot in `dir`, checked against its meta, into an
/// empty `store` and records it as applied: what a rebuilt state starts
/// from. Returns the snapshot's last log id, or `None` when the node never
/// had one (the log then still holds every entry: nothing is purged before
/// a snapshot exists).
pub async fn restore_current(store: &StateStore, dir: &Path) -> Result<Option<LogId>, RaftError> {
    let damaged = |reason: String| RaftError::Damaged {
        path: dir.join(CURRENT_META),
        reason,
    };
    let Some(snapshot) = open_current(dir)
        .await
        .map_err(|e| damaged(format!("cannot rebuild the state from it: {e}")))?
    else {
        return Ok(None);
    };
    let (meta, file) = snapshot;
    let file = file.into_std().await;
    let marker = bincode::serialize(&(meta.last_log_id, meta.last_membership.clone()))
        .map_err(RaftError::Codec)?;
    let store = store.clone();
    let id = meta.snapshot_id.clone();
    tokio::task::spawn_blocking(move || {
        store.import_with_progress(&mut BufReader::new(file), |n| {
            tracing::info!(snapshot = %id, records = n, "rebuilding the state");
        })?;
        store.apply(None, 0, &marker)?;
        store.flush()
    })
    .await
    .map_err(|source| RaftError::Task {
        what: "rebuilding the state",
        source,
    })??;
    Ok(meta.last_log_id)
}

/// The current snapshot as openraft takes it.
pub(crate) async fn current_snapshot(dir: &Path) -> StorageResult<Option<Snapshot>> {
    Ok(open_current(dir).await?.map(|(meta, file)| Snapshot {
        meta: meta.openraft(),
        snapshot: file,
    }))
}

/// The current snapshot, after checking its data file against the meta.
pub(crate) async fn open_current(dir: &Path) -> StorageResult<Option<(Meta, tokio::fs::File)>> {
    // A snapshot built or installed meanwhile renames its file in, rewrites
    // the meta and deletes the file the old meta named. Read between the
    // two, that name is gone: read the meta again, which names the newer
    // one. A name that is still current and still missing is an error.
    let mut replaced = 0;
    loop {
        match open_current_once(dir).await? {
            Opened::Current(snapshot) => return Ok(*snapshot),
            Opened::Replaced(_) if replaced < 8 => replaced += 1,
            Opened::Replaced(e) => return Err(e),
        }
    }
}

enum Opened {
    Current(Box<Option<(Meta, tokio::fs::File)>>),
    /// The data file the meta named is gone; the error if it stays so.
    Replaced(std::io::Error),
}

async fn open_current_once(dir: &Path) -> StorageResult<Opened> {
    let meta_path = dir.join(CURRENT_META);
    let raw = match tokio::fs::read(&meta_path).await {
        Ok(raw) => raw,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Opened::Current(Box::new(None)))
        }
        Err(e) => return Err(e),
    };
    let current: Current = bincode::deserialize(&raw).map_err(|e| {
        std::io::Error::other(RaftError::Damaged {
            path: meta_path.clone(),
            reason: format!("undecodable: {e}"),
        })
    })?;
    let data = dir.join(&current.data);
    let io_error = |e: std::io::Error| {
        std::io::Error::other(RaftError::Io {
            path: data.clone(),
            source: e,
        })
    };
    // Opened once and hashed through the same handle, which is what goes
    // to openraft: a later promote may delete the name, not the file.
    let opened = {
        let data = data.clone();
        tokio::task::spawn_blocking(move || -> std::io::Result<_> {
            let mut file = std::fs::File::open(&data)?;
            let checked = hash_reader(&mut file)?;
            std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(0))?;
            Ok((file, checked))
        })
        .await
        .map_err(std::io::Error::other)?
    };
    let (file, (hash, len)) = match opened {
        Ok(opened) => opened,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Opened::Replaced(io_error(e)))
        }
        Err(e) => return Err(io_error(e)),
    };
    if hash != current.blake3 || len != current.len {
        return Err(std::io::Error::other(RaftError::Damaged {
            path: data,
            reason: format!(
                "{len} bytes that do not hash to what {} recorded ({} bytes)",
                meta_path.display(),
                current.len
            ),
        }));
    }
    Ok(Opened::Current(Box::new(Some((
        current.meta,
        tokio::fs::File::from_std(file),
    )))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exported(dir: &Path, i: u32) -> Exported {
        let path = dir.join(format!("export-{i}.tmp"));
        std::fs::write(&path, vec![i as u8; 256 * 1024]).unwrap();
        let (blake3, len) = hash_file(&path).unwrap();
        Exported { path, blake3, len }
    }

    fn meta(i: u32) -> Meta {
        Meta {
            snapshot_id: format!("s{i}"),
            ..Default::default()
        }
    }

    /// Seed 11000095 of the whole-cluster simulation (with pauses): a
    /// follower resuming from a pause built a snapshot while it installed
    /// the leader's, and openraft, reading the current snapshot between the
    /// two, found the file its meta named already deleted ("No such file or
    /// directory"): a storage error, which stops openraft for good. Reads
    /// racing promotes must always find a whole snapshot.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_snapshot_read_while_a_newer_one_is_promoted_is_found() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        promote(&dir, &exported(&dir, 0), &meta(0)).unwrap();
        let writer = {
            let dir = dir.clone();
            std::thread::spawn(move || {
                for i in 1..300 {
                    promote(&dir, &exported(&dir, i), &meta(i)).unwrap();
                }
            })
        };
        let mut reads = 0u32;
        while !writer.is_finished() {
            let found = open_current(&dir).await;
            assert!(
                matches!(found, Ok(Some(_))),
                "read {reads}: {:?}",
                found.err()
            );
            reads += 1;
        }
        writer.join().unwrap();
        eprintln!("{reads} reads while 299 snapshots were promoted");
    }

    fn meta_at(index: u64) -> Meta {
        Meta {
            last_log_id: Some(LogId::new(
                crate::CommittedLeaderId {
                    term: 1,
                    node_id: 1,
                },
                index,
            )),
            snapshot_id: format!("at{index}"),
            ..Default::default()
        }
    }

    /// Seed 1796382805000 of the whole-cluster simulation, in CI: a follower
    /// built a snapshot while it installed the leader's, both promoted at
    /// once, and each one's clean-up deleted the other's data file. The meta
    /// named the install's file, which was gone for good, and openraft
    /// stopped. Promotes racing each other must leave the newest snapshot
    /// whole, and a build finishing after a newer install must not replace it.
    #[test]
    fn promotes_racing_each_other_leave_the_newest_snapshot_whole() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let promotions = Promotions::default();
        let racer = |from: u32, source: Source| {
            let (dir, promotions) = (dir.clone(), promotions.clone());
            std::thread::spawn(move || {
                for i in (from..200).step_by(2) {
                    let e = exported(&dir, i);
                    promotions
                        .promote(&dir, &e, &meta_at(u64::from(i)), source)
                        .unwrap();
                }
            })
        };
        let installs = racer(1, Source::Installed);
        let builds = racer(0, Source::Built);
        installs.join().unwrap();
        builds.join().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let current = rt.block_on(open_current(&dir)).unwrap().unwrap();
        assert_eq!(current.0.last_log_id.map(|l| l.index), Some(199));
        let built = exported(&dir, 7);
        let kept = promotions
            .promote(&dir, &built, &meta_at(7), Source::Built)
            .unwrap();
        assert!(!kept, "an older build replaced the current snapshot");
        assert!(!built.path.exists(), "the unused export was left behind");
        assert_eq!(on_disk(&dir).map(|l| l.index), Some(199));
    }
}
