//! Durability: the one place that decides when bytes are on stable storage.
//!
//! A node keeps two sled databases: the Raft log (`log/`) and the state
//! machine (`sled/`). sled 0.34 "flushes" with `sync_file_range` on Linux
//! (`pagecache/iobuf.rs`), which starts and waits for writeback of a range
//! but neither flushes the drive's volatile write cache nor the file's
//! metadata (its size grows as segments are added). It writes values above
//! a quarter of a segment (128 KiB by default) to files of their own under
//! `blobs/` and never syncs those at all. After a power cut such a flush
//! can be gone. So [`Db::sync`] runs sled's flush and then makes it stable
//! itself:
//!
//! 1. every blob file created or written since the last sync is
//!    `fdatasync`ed (inotify names them, `watch.rs`; a listing when it
//!    cannot), then the `blobs/` directory is `fsync`ed so new names survive
//!    too;
//! 2. the database file is `fdatasync`ed (data and size);
//! 3. the database directory is `fsync`ed when its listing changed since the
//!    last sync (sled renames its own snapshot files into it).
//!
//! Blobs go first: a record in the database file that points at a blob must
//! never be stable while the blob is not.
//!
//! The orderings the contract rests on (G4, G6 in the design), each kept by
//! the caller named, all through this module:
//! - an append is reported durable only after a [`Db::sync`] of the log that
//!   began after the append was written (the log store's group commit);
//! - a vote is saved, and synced, before it is returned;
//! - a state checkpoint is written only after a sync of the log, so the state
//!   on stable storage never refers to an entry the log could still lose
//!   ([`crate::StateStore`] does this through [`Disk::log`]);
//! - log entries are purged only after a sync of the state.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::StoreError;

mod watch;

/// One sled database and the files behind it.
#[derive(Clone)]
pub struct Db {
    inner: Arc<Inner>,
}

struct Inner {
    db: sled::Db,
    /// Which database this is, for metrics and errors: `log` or `state`.
    name: &'static str,
    /// The database directory; `None` for a database without files (tests).
    dir: Option<PathBuf>,
    /// `dir/db`, opened once: fsync through any descriptor of a file flushes
    /// all of its dirty pages.
    file: Option<File>,
    /// Names already made stable, so a sync only touches what is new.
    known: Mutex<Known>,
    /// Syncs in progress, and when one last began with none running or
    /// ended (ms after `born`). Read by the node's storage watchdog: after a
    /// failed write (a full disk), sled 0.34 can wait forever for the write
    /// to become stable, and such a node held its peers' connections and
    /// said nothing (nemesis seed 21).
    syncs_running: std::sync::atomic::AtomicU64,
    sync_progress_ms: std::sync::atomic::AtomicU64,
    born: Instant,
}

/// Files beside the database file, with the length each had when it was
/// last synced. A file seen again with another length is synced again: a
/// listing can catch sled halfway through writing a blob for a later entry,
/// and a blob synced only then, and never again, was torn by a power cut
/// although the log record that points at it was durable. sled then cut its
/// log at that blob and lost entries the node had promised (the soak: "blob
/// … failed crc check", then "the log ends at … but it held … durably").
#[derive(Default)]
struct Known {
    top: BTreeMap<OsString, Seen>,
    /// The blobs as the last listing left them: kept up to date only while
    /// `watch` cannot say what changed.
    blobs: BTreeMap<OsString, Seen>,
    /// Which blobs changed since the last sync, without listing `blobs/`.
    watch: Option<watch::BlobWatch>,
    /// Blob files synced, over the database's life (the tests read it).
    blob_syncs: u64,
}

/// A file as the last sync left it.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Seen {
    /// Its length when synced.
    len: u64,
    /// Not written for [`SETTLE`] before a sync that found it at that same
    /// length: sled writes a blob once and never again, so a settled blob is
    /// not looked at any more. Only unsettled files are statted.
    ///
    /// Why: statting every blob on every sync took 30% of the three nodes'
    /// CPU at the benchmark's peak (`perf`, about a thousand blobs, a hundred
    /// syncs a second), for files that cannot change.
    settled: bool,
}

/// How long a file must have gone unwritten, before a sync that finds it
/// unchanged, to count as complete. Far longer than a blob write takes
/// (one `write_all` from memory); were a write to pause longer than this
/// halfway through, its tail would not be synced by this module.
const SETTLE: std::time::Duration = std::time::Duration::from_secs(1);

/// How one database is opened.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// sled's page cache.
    pub cache_bytes: u64,
    /// sled's own background flush, if any. sled's flusher thread ends each
    /// round with an fsync of the database file but never syncs `blobs/`,
    /// which breaks the order [`Db::sync`] keeps: neither of the node's
    /// databases uses it.
    pub flush_every_ms: Option<u64>,
}

fn io_at(path: &Path, source: io::Error) -> StoreError {
    StoreError::File {
        path: path.to_path_buf(),
        source,
    }
}

/// What [`sync_changed`] found.
struct Synced {
    /// Every wanted file, as synced.
    listed: BTreeMap<OsString, Seen>,
    /// A name was new: the directory needs a sync too.
    new_name: bool,
    /// Files synced this time.
    files: usize,
}

/// Syncs every regular file of `dir` that `wanted` names and that is new
/// or has another length than in `known`. Settled files are listed but not
/// statted. `started` is when the sync began, by the clock file times use.
fn sync_changed(
    dir: &Path,
    known: &BTreeMap<OsString, Seen>,
    wanted: impl Fn(&std::ffi::OsStr) -> bool,
    started: std::time::SystemTime,
) -> Result<Synced, StoreError> {
    let mut out = Synced {
        listed: BTreeMap::new(),
        new_name: false,
        files: 0,
    };
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(io_at(dir, e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| io_at(dir, e))?;
        let name = entry.file_name();
        if !wanted(&name) {
            continue;
        }
        if let Some(seen) = known.get(&name).filter(|s| s.settled) {
            out.listed.insert(name, *seen);
            continue;
        }
        let path = entry.path();
        // A stat, not an open: this runs on every sync, over every file
        // not yet settled.
        let meta = match entry.metadata() {
            Ok(m) => m,
            // Removed by sled's own cleanup since the listing.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_at(&path, e)),
        };
        if meta.is_dir() {
            continue;
        }
        let len = meta.len();
        let unchanged = known.get(&name).is_some_and(|s| s.len == len);
        if !unchanged {
            match File::open(&path) {
                Ok(f) => f.sync_data().map_err(|e| io_at(&path, e))?,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_at(&path, e)),
            }
            out.new_name |= !known.contains_key(&name);
            out.files += 1;
        }
        // Settled only once a sync found it at the length an earlier sync
        // synced, and unwritten since well before this sync began.
        let quiet = meta
            .modified()
            .ok()
            .and_then(|m| started.duration_since(m).ok())
            .is_some_and(|age| age >= SETTLE);
        out.listed.insert(
            name,
            Seen {
                len,
                settled: unchanged && quiet,
            },
        );
    }
    Ok(out)
}

/// Syncs the files of `dir` named in `written` (those still there), then
/// `dir` itself if a name is new. Returns how many files it synced.
fn sync_named(
    dir: &Path,
    written: &std::collections::BTreeSet<OsString>,
    created: bool,
) -> Result<usize, StoreError> {
    let mut files = 0;
    for name in written {
        let path = dir.join(name);
        match File::open(&path) {
            Ok(f) => f.sync_data().map_err(|e| io_at(&path, e))?,
            // Removed by sled's own cleanup since it was written.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_at(&path, e)),
        }
        files += 1;
    }
    if created {
        sync_dir(dir)?;
    }
    Ok(files)
}

/// Bytes available to this process on the filesystem holding `path`
/// (`statvfs`).
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated and `s` is a valid place to write to.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((s.f_bavail as u64).saturating_mul(s.f_frsize as u64))
}

/// `fsync` of a directory, so that names created, renamed or removed in it
/// are stable.
pub fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_at(dir, e))
}

/// Creates `dir` and every missing parent, and makes each new name stable
/// by syncing the directory that holds it.
pub fn create_dir_durable(dir: &Path) -> Result<(), StoreError> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_dir_durable(parent)?;
    }
    match std::fs::create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_at(dir, e)),
    }
    match dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(parent) => sync_dir(parent),
        None => Ok(()),
    }
}

/// Removes the snapshot files sled began and never finished in `dir`.
///
/// sled 0.34 writes its page-table snapshot to `snap.<lsn>.generating`, syncs
/// it and only then renames it to `snap.<lsn>`; but at open it takes the
/// newest file whose name starts with `snap.`, `.generating` included, and
/// calls the database corrupt when that one is short or fails its checksum.
/// A write that failed halfway (a full disk: the soak's node 2 was started
/// again while its disk was still full) leaves such a file behind, and from
/// then on every start was refused as "sled reports corruption" although no
/// byte sled had finished was damaged. An unfinished snapshot holds nothing
/// that is not also in the log sled replays from the last finished one (or
/// from its start), so removing it loses nothing; a finished snapshot is
/// never touched, nor is any other file.
pub fn discard_unfinished_snapshots(dir: &Path) -> Result<usize, StoreError> {
    // Only with the database to ourselves: another process that holds it
    // (a second node started on the same directory, or one still stopping)
    // may be writing that very file. sled takes an exclusive lock on `db`
    // when it opens; holding the same lock while we look means no live
    // instance is mid-write, and without it we leave everything to sled,
    // which then refuses the open for the lock.
    let db = match File::open(dir.join("db")) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io_at(&dir.join("db"), e)),
    };
    if db.try_lock().is_err() {
        return Ok(0);
    }
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io_at(dir, e)),
    };
    let mut removed = 0;
    for entry in entries {
        let entry = entry.map_err(|e| io_at(dir, e))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !(name.starts_with("snap.") && name.ends_with(".generating")) {
            continue;
        }
        let path = entry.path();
        let len = entry.metadata().map(|m| m.len()).unwrap_or_default();
        std::fs::remove_file(&path).map_err(|e| io_at(&path, e))?;
        tracing::warn!(
            file = %path.display(),
            bytes = len,
            "removed a snapshot file sled began and never finished (a write that failed, such as on a full disk); sled would otherwise refuse the database as corrupt"
        );
        removed += 1;
    }
    if removed > 0 {
        sync_dir(dir)?;
    }
    // Released before sled opens the database and takes it again.
    drop(db);
    Ok(removed)
}

impl Db {
    /// Opens (or creates) the sled database in `dir`.
    ///
    /// sled 0.34 can panic on some damaged files instead of returning an
    /// error; the panic is caught here and reported as [`StoreError::Damaged`]
    /// naming the directory, so that a node refuses to start with a reason
    /// instead of a backtrace.
    pub fn open(name: &'static str, dir: &Path, options: Options) -> Result<Self, StoreError> {
        create_dir_durable(dir)?;
        discard_unfinished_snapshots(dir)?;
        let config = sled::Config::new()
            .path(dir)
            .cache_capacity(options.cache_bytes)
            .flush_every_ms(options.flush_every_ms);
        let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| config.open()));
        let db = match opened {
            Ok(Ok(db)) => db,
            Ok(Err(sled::Error::Corruption { .. })) => {
                return Err(StoreError::Damaged {
                    path: dir.join("db"),
                    reason: "sled reports corruption".into(),
                })
            }
            Ok(Err(e)) => return Err(StoreError::Sled(e)),
            Err(panic) => {
                let reason = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "sled panicked while opening it".into());
                return Err(StoreError::Damaged {
                    path: dir.join("db"),
                    reason,
                });
            }
        };
        let file_path = dir.join("db");
        let file = File::open(&file_path).map_err(|e| io_at(&file_path, e))?;
        let me = Self {
            inner: Arc::new(Inner {
                db,
                name,
                dir: Some(dir.to_path_buf()),
                file: Some(file),
                known: Mutex::new(Known {
                    watch: Some(watch::BlobWatch::new(&dir.join("blobs"))),
                    ..Known::default()
                }),
                syncs_running: Default::default(),
                sync_progress_ms: Default::default(),
                born: Instant::now(),
            }),
        };
        // Whatever sled created while opening (db, conf, blobs/) becomes
        // stable now, before anything is reported durable.
        me.sync()?;
        Ok(me)
    }

    /// A database without files of its own (sled's temporary mode, tests):
    /// [`Db::sync`] is sled's flush only.
    pub fn wrap(name: &'static str, db: sled::Db) -> Self {
        Self {
            inner: Arc::new(Inner {
                db,
                name,
                dir: None,
                file: None,
                known: Mutex::new(Known::default()),
                syncs_running: Default::default(),
                sync_progress_ms: Default::default(),
                born: Instant::now(),
            }),
        }
    }

    /// The sled database.
    pub fn sled(&self) -> &sled::Db {
        &self.inner.db
    }

    /// `log` or `state`.
    pub fn name(&self) -> &'static str {
        self.inner.name
    }

    /// The database directory, if it has one.
    pub fn dir(&self) -> Option<&Path> {
        self.inner.dir.as_deref()
    }

    /// Makes everything written to the database before this call stable.
    /// Blocking: sled's flush, then one `fdatasync` of the database file and
    /// one of each new blob (see the module docs).
    pub fn sync(&self) -> Result<(), StoreError> {
        use std::sync::atomic::Ordering;
        let started = Instant::now();
        let at = |i: Instant| i.duration_since(self.inner.born).as_millis() as u64;
        if self.inner.syncs_running.fetch_add(1, Ordering::AcqRel) == 0 {
            self.inner
                .sync_progress_ms
                .store(at(started), Ordering::Release);
        }
        let result = self.inner.db.flush().map_err(StoreError::from);
        let result = result.and_then(|_| self.sync_files());
        self.inner
            .sync_progress_ms
            .store(at(Instant::now()), Ordering::Release);
        self.inner.syncs_running.fetch_sub(1, Ordering::AcqRel);
        result?;
        metrics::counter!("firstseen_disk_syncs_total", "db" => self.inner.name).increment(1);
        metrics::histogram!("firstseen_disk_sync_seconds", "db" => self.inner.name)
            .record(started.elapsed().as_secs_f64());
        Ok(())
    }

    fn sync_files(&self) -> Result<(), StoreError> {
        let (Some(dir), Some(file)) = (&self.inner.dir, &self.inner.file) else {
            return Ok(());
        };
        let started = std::time::SystemTime::now();
        let mut known = crate::lock::lock(&self.inner.known);
        let blobs = dir.join("blobs");
        let changes = known
            .watch
            .as_mut()
            .map_or(watch::Changes::Unknown, |w| w.drain());
        match changes {
            watch::Changes::Names { written, created } => {
                let synced = sync_named(&blobs, &written, created);
                if synced.is_err() {
                    // The drained names are gone from the queue: the next
                    // sync lists instead, so none of them goes unsynced.
                    if let Some(w) = known.watch.as_mut() {
                        w.rearm();
                    }
                }
                known.blob_syncs += synced? as u64;
            }
            watch::Changes::Unknown => {
                metrics::counter!("firstseen_disk_blob_listings_total", "db" => self.inner.name)
                    .increment(1);
                let b = sync_changed(&blobs, &known.blobs, |_| true, started)?;
                if b.new_name {
                    sync_dir(&blobs)?;
                }
                known.blob_syncs += b.files as u64;
                known.blobs = b.listed;
            }
        }
        file.sync_data().map_err(|e| io_at(&dir.join("db"), e))?;
        // Files beside `db`: sled's `conf`, written once when the database is
        // created and never synced by sled (a torn `conf` makes sled refuse to
        // open the database), and its snapshot files.
        let t = sync_changed(dir, &known.top, |name| name != "db", started)?;
        if t.new_name {
            sync_dir(dir)?;
        }
        known.top = t.listed;
        Ok(())
    }

    /// How long syncs have been running without one finishing, if one is
    /// running.
    pub fn sync_stuck_for(&self) -> Option<std::time::Duration> {
        use std::sync::atomic::Ordering;
        if self.inner.syncs_running.load(Ordering::Acquire) == 0 {
            return None;
        }
        let since = self.inner.sync_progress_ms.load(Ordering::Acquire);
        let now = self.inner.born.elapsed().as_millis() as u64;
        Some(std::time::Duration::from_millis(now.saturating_sub(since)))
    }

    /// Bytes sled uses on disk for this database.
    pub fn size_on_disk(&self) -> Result<u64, StoreError> {
        Ok(self.inner.db.size_on_disk()?)
    }
}

/// Both databases of a node: the single owner of their durability and of
/// the order between them (see the module docs).
#[derive(Clone)]
pub struct Disk {
    /// The Raft log: entries, vote, purge point.
    pub log: Db,
    /// The state machine's checkpoints.
    pub state: Db,
}

/// sled page cache of the state database: the state is served from memory,
/// and sled is read only to expire written records and to rebuild at
/// start-up, so its default 1 GiB would only hold copies.
const STATE_CACHE_BYTES: u64 = 64 * 1024 * 1024;
/// sled page cache of the log database: reads are of recent entries
/// (replication, apply, the outbox).
const LOG_CACHE_BYTES: u64 = 128 * 1024 * 1024;

impl Disk {
    /// Opens both databases under `dir` (`dir/log`, `dir/sled`).
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        create_dir_durable(dir)?;
        let state = Self::open_state(dir)?;
        let log = Self::open_log(dir)?;
        Ok(Self { log, state })
    }

    /// Where the state database of a node's storage `dir` lives.
    pub fn state_dir(dir: &Path) -> PathBuf {
        dir.join("sled")
    }

    /// Opens (or creates) the state database under `dir`.
    pub fn open_state(dir: &Path) -> Result<Db, StoreError> {
        Db::open(
            "state",
            &Self::state_dir(dir),
            Options {
                cache_bytes: STATE_CACHE_BYTES,
                // No background flush: sled's own flusher makes the database
                // file stable without syncing `blobs/` first, which breaks the
                // order `Db::sync` keeps. The state becomes stable only
                // through `Db::sync` (blobs, then the file) at every
                // `StateStore::flush`: before each purge of the log and at
                // shutdown. A crash re-applies the log from there; the log
                // still holds those entries, since a purge comes after the
                // flush.
                flush_every_ms: None,
            },
        )
    }

    /// Opens (or creates) the Raft log's database under `dir`.
    pub fn open_log(dir: &Path) -> Result<Db, StoreError> {
        Db::open(
            "log",
            &dir.join("log"),
            Options {
                cache_bytes: LOG_CACHE_BYTES,
                // Every append is synced explicitly (group commit).
                flush_every_ms: None,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a failed snapshot write leaves (the soak's disk-full finding):
    /// sled alone refuses the database, `Db::open` removes the unfinished
    /// file and opens it with every entry.
    #[test]
    fn an_unfinished_sled_snapshot_does_not_make_the_database_unreadable() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("log");
        let options = || Options {
            cache_bytes: 1 << 20,
            flush_every_ms: None,
        };
        {
            let db = Db::open("log", &dir, options()).unwrap();
            for i in 0u32..500 {
                db.sled().insert(i.to_be_bytes(), vec![3u8; 100]).unwrap();
            }
            db.sync().unwrap();
        }
        // Newer than any finished snapshot, and cut short by ENOSPC.
        let unfinished = dir.join("snap.FFFFFFFFFFFFFFF0.generating");
        std::fs::write(&unfinished, b"torn").unwrap();
        let raw = sled::Config::new().path(&dir).open();
        assert!(
            matches!(raw, Err(sled::Error::Corruption { .. })),
            "sled 0.34 reads the unfinished file; if this fails, sled changed and the workaround may go: {raw:?}"
        );
        drop(raw);
        let db = Db::open("log", &dir, options()).unwrap();
        assert!(!unfinished.exists());
        assert_eq!(db.sled().len(), 500);

        // While a database is open, the same file is its snapshot at work:
        // another open (which sled then refuses) leaves it alone.
        std::fs::write(&unfinished, b"being written").unwrap();
        assert_eq!(discard_unfinished_snapshots(&dir).unwrap(), 0);
        assert!(unfinished.exists());
    }

    #[test]
    fn a_sync_covers_blobs_and_new_names() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b/db");
        let db = Db::open(
            "log",
            &dir,
            Options {
                cache_bytes: 1 << 20,
                flush_every_ms: None,
            },
        )
        .unwrap();
        // A value above a quarter of a segment goes to a blob file.
        db.sled().insert(b"big", vec![7u8; 300 * 1024]).unwrap();
        db.sled().insert(b"small", vec![1u8; 10]).unwrap();
        db.sync().unwrap();
        let blobs: Vec<_> = std::fs::read_dir(dir.join("blobs")).unwrap().collect();
        assert!(!blobs.is_empty(), "sled wrote the large value as a blob");
        let known = db.inner.known.lock().unwrap();
        // Open listed (and armed the watch); the blob came after, so the
        // watch named it.
        assert_eq!(
            known.blob_syncs,
            blobs.len() as u64,
            "every blob was synced"
        );
        assert!(known.top.contains_key(std::ffi::OsStr::new("conf")));
    }

    /// A file caught halfway through being written (a blob sled is still
    /// writing for a later entry) is synced again once it has grown; synced
    /// only when first seen, its tail was lost to a power cut in the soak.
    #[test]
    fn a_file_that_grew_since_its_sync_is_synced_again() {
        use std::io::Write;
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("blob-1");
        std::fs::write(&path, b"half").unwrap();
        let now = std::time::SystemTime::now;
        let first = sync_changed(tmp.path(), &BTreeMap::new(), |_| true, now()).unwrap();
        assert_eq!((first.files, first.new_name), (1, true));
        let again = sync_changed(tmp.path(), &first.listed, |_| true, now()).unwrap();
        assert_eq!(again.files, 0, "unchanged: not synced again");
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b" and the rest")
            .unwrap();
        let grown = sync_changed(tmp.path(), &again.listed, |_| true, now()).unwrap();
        assert_eq!((grown.files, grown.new_name), (1, false));
        assert_eq!(grown.listed[std::ffi::OsStr::new("blob-1")].len, 17);
    }

    /// A file is left alone once a sync found it unchanged and unwritten
    /// for [`SETTLE`]; one written recently is looked at again, even at an
    /// unchanged length, so a write that resumes is still caught.
    #[test]
    fn only_a_file_unwritten_for_a_while_is_settled() {
        use std::io::Write;
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("blob-1");
        std::fs::write(&path, b"whole").unwrap();
        let now = std::time::SystemTime::now();
        let name = std::ffi::OsStr::new("blob-1");
        let first = sync_changed(tmp.path(), &BTreeMap::new(), |_| true, now).unwrap();
        assert!(!first.listed[name].settled, "just synced");
        let soon = sync_changed(tmp.path(), &first.listed, |_| true, now).unwrap();
        assert!(!soon.listed[name].settled, "written less than SETTLE ago");
        let later = now + SETTLE + std::time::Duration::from_millis(10);
        let settled = sync_changed(tmp.path(), &soon.listed, |_| true, later).unwrap();
        assert!(settled.listed[name].settled);
        // A settled file is not statted again: a change goes unseen, which
        // is why settling waits for a file to have gone quiet.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"!")
            .unwrap();
        let after = sync_changed(tmp.path(), &settled.listed, |_| true, later).unwrap();
        assert_eq!((after.files, after.listed[name].len), (0, 5));
        // The same change on a file not yet settled is synced.
        let caught = sync_changed(tmp.path(), &soon.listed, |_| true, later).unwrap();
        assert_eq!((caught.files, caught.listed[name].len), (1, 6));
    }

    #[test]
    fn a_damaged_database_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("db");
        let options = Options {
            cache_bytes: 1 << 20,
            flush_every_ms: None,
        };
        {
            let db = Db::open("state", &dir, options).unwrap();
            for i in 0u32..5_000 {
                db.sled().insert(i.to_be_bytes(), vec![3u8; 400]).unwrap();
            }
            db.sync().unwrap();
        }
        {
            // Reopen once so that sled writes its snapshot, which the
            // truncation below then contradicts.
            let db = Db::open("state", &dir, options).unwrap();
            db.sync().unwrap();
        }
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join("db"))
            .unwrap();
        let len = f.metadata().unwrap().len();
        f.set_len(len / 3).unwrap();
        match Db::open("state", &dir, options) {
            Err(StoreError::Damaged { path, .. }) => assert_eq!(path, dir.join("db")),
            Err(other) => panic!("expected Damaged, got {other}"),
            Ok(_) => panic!("a truncated database opened without complaint"),
        }
    }
}
