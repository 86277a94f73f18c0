//! The FUSE side: a passthrough of one backing directory, with every data
//! change recorded in the [`Journal`] and an optional quota.
//!
//! Files are opened with `FOPEN_DIRECT_IO` and attributes are never cached,
//! so the kernel keeps no page cache of its own: after a power cut, what a
//! reader sees is what the backing file holds. `sync_file_range` never
//! reaches a FUSE filesystem, so (as on a real disk whose cache loses power)
//! it makes nothing durable here; only `fsync` and `fdatasync` do.
//!
//! Name changes (create, mkdir, rename, unlink, rmdir) pass through too, and
//! are recorded in [`Names`] until an fsync of their directory: a power cut
//! undoes file data and length since each file's last sync, and every name
//! change since its directory's last sync.
//!
//! A freeze ([`CrashFs::freeze`]) stalls the storage without losing
//! anything: writes and syncs are held, unanswered, so the process doing
//! them blocks as on a disk that stopped responding, until a thaw carries
//! them out in the order they came. Everything else (reads, lookups,
//! creates) is still answered, so only what waits on the disk stalls.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

use crate::journal::{Journal, Lost, Rng};
use crate::names::{Change, Names, STASH};

/// Attributes and names are never cached by the kernel.
const TTL: Duration = Duration::ZERO;

/// Counters for the control socket.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    pub writes: u64,
    pub write_bytes: u64,
    pub fsyncs: u64,
    pub enospc: u64,
}

struct State {
    paths: HashMap<u64, PathBuf>,
    inos: HashMap<PathBuf, u64>,
    next_ino: u64,
    handles: HashMap<u64, (u64, File)>,
    next_fh: u64,
    journal: Journal,
    names: Names,
    /// Bytes of file data under the root, for the quota.
    used: u64,
    quota: Option<u64>,
    stats: Stats,
    /// The power is off ([`CrashFs::power_off`]) until the next power cut
    /// is played out.
    off: bool,
    /// Frozen ([`CrashFs::freeze`]): writes and syncs wait here, oldest
    /// first, unanswered until the thaw.
    frozen: bool,
    held: std::collections::VecDeque<Held>,
}

/// A write or sync that came while the filesystem was frozen. Its reply is
/// kept: the caller stays blocked in its system call until the thaw.
enum Held {
    /// The handle's file is kept open here: a close that raced the freeze
    /// (from another thread) must not turn the held write into EBADF.
    Write {
        ino: u64,
        file: File,
        offset: u64,
        data: Vec<u8>,
        reply: ReplyWrite,
    },
    Fsync {
        ino: u64,
        reply: ReplyEmpty,
    },
    Fsyncdir {
        ino: u64,
        reply: ReplyEmpty,
    },
}

/// The filesystem, shared between the FUSE session and the control socket.
#[derive(Clone)]
pub struct CrashFs {
    root: PathBuf,
    state: Arc<Mutex<State>>,
}

fn errno(e: &io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

fn kind(t: std::fs::FileType) -> FileType {
    if t.is_dir() {
        FileType::Directory
    } else if t.is_symlink() {
        FileType::Symlink
    } else {
        FileType::RegularFile
    }
}

fn time(secs: i64, nsecs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs as u32)
    } else {
        UNIX_EPOCH
    }
}

fn attr(ino: u64, m: &std::fs::Metadata) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: m.len(),
        blocks: m.blocks(),
        atime: time(m.atime(), m.atime_nsec()),
        mtime: time(m.mtime(), m.mtime_nsec()),
        ctime: time(m.ctime(), m.ctime_nsec()),
        crtime: UNIX_EPOCH,
        kind: kind(m.file_type()),
        perm: (m.mode() & 0o7777) as u16,
        nlink: m.nlink() as u32,
        uid: m.uid(),
        gid: m.gid(),
        rdev: m.rdev() as u32,
        blksize: 4096,
        flags: 0,
    }
}

/// Bytes of file data under `dir`, the stash left out.
fn usage(dir: &Path) -> u64 {
    let mut total = 0;
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten().filter(|e| e.file_name() != STASH) {
            match e.metadata() {
                Ok(m) if m.is_dir() => total += usage(&e.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}

impl CrashFs {
    /// A filesystem over `root`, which must exist. Its stash starts empty:
    /// a mount starts with the power on and nothing pending.
    pub fn new(root: PathBuf) -> io::Result<Self> {
        let stash = root.join(STASH);
        if stash.exists() {
            std::fs::remove_dir_all(&stash)?;
        }
        std::fs::create_dir(&stash)?;
        let mut paths = HashMap::new();
        let mut inos = HashMap::new();
        paths.insert(1, PathBuf::new());
        inos.insert(PathBuf::new(), 1);
        let used = usage(&root);
        Ok(Self {
            root,
            state: Arc::new(Mutex::new(State {
                paths,
                inos,
                next_ino: 2,
                handles: HashMap::new(),
                next_fh: 1,
                journal: Journal::default(),
                names: Names::default(),
                used,
                quota: None,
                stats: Stats::default(),
                off: false,
                frozen: false,
                held: std::collections::VecDeque::new(),
            })),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn real(&self, rel: &Path) -> PathBuf {
        self.root.join(rel)
    }

    /// The power goes off now, while the process using the filesystem may
    /// still run: from here on its writes and resizes are accepted and
    /// dropped, its fsyncs keep nothing, and names cannot change (EIO).
    /// A process that is dropped rather than killed (a simulated crash)
    /// writes and fsyncs on its way out; with the power off, none of that
    /// reaches the disk. [`CrashFs::lose_power`] then undoes what was not
    /// synced before, and turns the power back on.
    pub fn power_off(&self) {
        self.lock().off = true;
    }

    /// The power goes out: every unsynced change of every file is undone,
    /// and with `tear` each file's last write survives in part. The power
    /// is on again afterwards.
    pub fn lose_power(&self, tear: Option<u64>) -> io::Result<Lost> {
        let mut st = self.lock();
        st.off = false;
        let mut rng = tear.map(Rng::new);
        let mut total = Lost::default();
        for ino in st.journal.dirty() {
            let Some(rel) = st.paths.get(&ino).cloned() else {
                st.journal.forget(ino);
                continue;
            };
            let f = match OpenOptions::new()
                .read(true)
                .write(true)
                .open(self.real(&rel))
            {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    st.journal.forget(ino);
                    continue;
                }
                Err(e) => return Err(e),
            };
            let lost = st.journal.lose(ino, &f, rng.as_mut())?;
            total.files += lost.files;
            total.bytes += lost.bytes;
            total.torn_bytes += lost.torn_bytes;
        }
        for change in st.names.take_for_undo() {
            crate::names::undo(&self.root, &change)?;
            total.names += 1;
            match &change {
                // Every name under a lost one is gone with it.
                Change::Created(p) => {
                    let under: Vec<PathBuf> = st
                        .inos
                        .keys()
                        .filter(|k| k.starts_with(p))
                        .cloned()
                        .collect();
                    for k in under {
                        Self::forget_path(&mut st, &k);
                    }
                }
                Change::Renamed { from, to, .. } => Self::renamed(&mut st, to, from),
                Change::Removed { .. } | Change::RemovedDir(_) => {}
            }
        }
        st.used = usage(&self.root);
        Ok(total)
    }

    /// The storage stops responding: from now on every write, fsync and
    /// fsyncdir is held unanswered (its caller blocks) until
    /// [`CrashFs::thaw`]. Nothing is lost.
    pub fn freeze(&self) {
        self.lock().frozen = true;
    }

    /// Carries out every held write and sync in the order they came,
    /// answers each, and lets later ones through again. Returns how many
    /// were held. Done under the state's lock with the freeze lifted in the
    /// same step, so a write arriving meanwhile goes after the held ones.
    pub fn thaw(&self) -> usize {
        let mut guard = self.lock();
        let st = &mut *guard;
        st.frozen = false;
        let held: Vec<Held> = st.held.drain(..).collect();
        let n = held.len();
        for h in held {
            match h {
                Held::Write {
                    ino,
                    file,
                    offset,
                    data,
                    reply,
                } => match Self::write_to(st, ino, &file, offset, &data) {
                    Ok(n) => reply.written(n),
                    Err(e) => reply.error(e),
                },
                Held::Fsync { ino, reply } => {
                    Self::fsync_of(st, ino);
                    reply.ok();
                }
                Held::Fsyncdir { ino, reply } => match self.fsyncdir_of(st, ino) {
                    Ok(()) => reply.ok(),
                    Err(e) => reply.error(e),
                },
            }
        }
        n
    }

    /// Whether frozen, and how many writes and syncs are held.
    pub fn frozen(&self) -> (bool, usize) {
        let st = self.lock();
        (st.frozen, st.held.len())
    }

    /// One write of `data` at `offset` into `file` (inode `ino`): journaled
    /// for a power cut, counted against the quota. Returns the bytes
    /// written.
    fn write_to(
        st: &mut State,
        ino: u64,
        f: &File,
        offset: u64,
        data: &[u8],
    ) -> Result<u32, Errno> {
        if st.off {
            return Ok(data.len() as u32);
        }
        let old = f.metadata().map_err(|e| errno(&e))?.len();
        let end = offset + data.len() as u64;
        let growth = end.saturating_sub(old);
        if let Some(q) = st.quota {
            if growth > 0 && st.used + growth > q {
                st.stats.enospc += 1;
                return Err(Errno::ENOSPC);
            }
        }
        st.journal
            .before_write(ino, f, offset, data)
            .map_err(|e| errno(&e))?;
        f.write_all_at(data, offset).map_err(|e| errno(&e))?;
        st.used += growth;
        st.stats.writes += 1;
        st.stats.write_bytes += data.len() as u64;
        Ok(data.len() as u32)
    }

    /// An fsync of inode `ino`: its writes so far survive a power cut.
    fn fsync_of(st: &mut State, ino: u64) {
        // Durable from here on. The backing file is not synced: the machine
        // under the test never loses power, only this layer pretends to.
        if !st.off {
            st.journal.synced(ino);
            st.stats.fsyncs += 1;
        }
    }

    /// An fsync of directory `ino`: its name changes so far survive a power
    /// cut.
    fn fsyncdir_of(&self, st: &mut State, ino: u64) -> Result<(), Errno> {
        st.stats.fsyncs += 1;
        if st.off {
            // Accepted and dropped, as every sync is with the power off.
            return Ok(());
        }
        let rel = st.paths.get(&ino).cloned().ok_or(Errno::ENOENT)?;
        for stash in st.names.synced(&rel) {
            let _ = std::fs::remove_file(self.real(&stash));
        }
        Ok(())
    }

    /// Name changes a power cut would undo now.
    pub fn pending_names(&self) -> usize {
        self.lock().names.len()
    }

    /// Sets (or with `None` lifts) the quota on file data.
    pub fn set_quota(&self, quota: Option<u64>) {
        self.lock().quota = quota;
    }

    /// (used bytes, quota, unsynced bytes, counters).
    pub fn report(&self) -> (u64, Option<u64>, u64, Stats) {
        let st = self.lock();
        (st.used, st.quota, st.journal.pending_bytes(), st.stats)
    }

    fn ino_for(st: &mut State, rel: PathBuf) -> u64 {
        if let Some(ino) = st.inos.get(&rel) {
            return *ino;
        }
        let ino = st.next_ino;
        st.next_ino += 1;
        st.inos.insert(rel.clone(), ino);
        st.paths.insert(ino, rel);
        ino
    }

    fn child(&self, st: &State, parent: INodeNo, name: &OsStr) -> Result<PathBuf, Errno> {
        let base = st.paths.get(&parent.0).ok_or(Errno::ENOENT)?;
        if base.as_os_str().is_empty() && name == STASH {
            // The stash is the filesystem's own, not the mount's.
            return Err(Errno::ENOENT);
        }
        Ok(base.join(name))
    }

    fn entry(&self, st: &mut State, rel: PathBuf) -> Result<FileAttr, Errno> {
        let m = std::fs::symlink_metadata(self.real(&rel)).map_err(|e| errno(&e))?;
        let ino = Self::ino_for(st, rel);
        Ok(attr(ino, &m))
    }

    fn open_file(&self, st: &mut State, ino: u64) -> Result<u64, Errno> {
        let rel = st.paths.get(&ino).cloned().ok_or(Errno::ENOENT)?;
        // Always read-write underneath: the journal reads what a write
        // overwrites.
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.real(&rel))
            .map_err(|e| errno(&e))?;
        let fh = st.next_fh;
        st.next_fh += 1;
        st.handles.insert(fh, (ino, f));
        Ok(fh)
    }

    /// Moves every known path under `from` to `to`.
    fn renamed(st: &mut State, from: &Path, to: &Path) {
        let moved: Vec<(PathBuf, u64)> = st
            .inos
            .iter()
            .filter(|(p, _)| p.starts_with(from))
            .map(|(p, i)| (p.clone(), *i))
            .collect();
        for (old, ino) in moved {
            let rest = old.strip_prefix(from).expect("prefix checked");
            // `join("")` would add a trailing slash.
            let new = if rest.as_os_str().is_empty() {
                to.to_path_buf()
            } else {
                to.join(rest)
            };
            st.inos.remove(&old);
            st.inos.insert(new.clone(), ino);
            st.paths.insert(ino, new);
        }
    }

    fn forget_path(st: &mut State, rel: &Path) {
        if let Some(ino) = st.inos.remove(rel) {
            st.paths.remove(&ino);
            st.journal.forget(ino);
        }
    }
}

impl Filesystem for CrashFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut st = self.lock();
        let r = self
            .child(&st, parent, name)
            .and_then(|rel| self.entry(&mut st, rel));
        match r {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let st = self.lock();
        let meta = match st.paths.get(&ino.0) {
            Some(rel) => std::fs::symlink_metadata(self.real(rel)),
            // Unlinked but still open: POSIX keeps the file, and its size,
            // until the last close. Answering ENOENT here made an `lseek`
            // to the end of an open snapshot fail once a newer snapshot had
            // replaced it (the leader sending it then stopped its Raft on
            // "No such file or directory", which a real disk never says).
            None => {
                let open = fh
                    .and_then(|h| st.handles.get(&h.0))
                    .or_else(|| st.handles.values().find(|(i, _)| *i == ino.0));
                match open {
                    Some((_, f)) => f.metadata(),
                    None => return reply.error(Errno::ENOENT),
                }
            }
        };
        match meta {
            Ok(m) => reply.attr(&TTL, &attr(ino.0, &m)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut guard = self.lock();
        let st = &mut *guard;
        let Some(rel) = st.paths.get(&ino.0).cloned() else {
            return reply.error(Errno::ENOENT);
        };
        let real = self.real(&rel);
        if st.off {
            // Accepted and dropped, as a write is.
            return match std::fs::symlink_metadata(&real) {
                Ok(m) => reply.attr(&TTL, &attr(ino.0, &m)),
                Err(e) => reply.error(errno(&e)),
            };
        }
        if let Some(mode) = mode {
            if let Err(e) = std::fs::set_permissions(&real, std::fs::Permissions::from_mode(mode)) {
                return reply.error(errno(&e));
            }
        }
        if let Some(size) = size {
            let r = (|| -> Result<(), Errno> {
                let f = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&real)
                    .map_err(|e| errno(&e))?;
                let old = f.metadata().map_err(|e| errno(&e))?.len();
                if size > old {
                    if let Some(q) = st.quota {
                        if st.used + (size - old) > q {
                            st.stats.enospc += 1;
                            return Err(Errno::ENOSPC);
                        }
                    }
                }
                st.journal
                    .before_resize(ino.0, &f, size)
                    .map_err(|e| errno(&e))?;
                f.set_len(size).map_err(|e| errno(&e))?;
                st.used = (st.used + size).saturating_sub(old);
                Ok(())
            })();
            if let Err(e) = r {
                return reply.error(e);
            }
        }
        match std::fs::symlink_metadata(&real) {
            Ok(m) => reply.attr(&TTL, &attr(ino.0, &m)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let mut st = self.lock();
        if st.off {
            return reply.error(Errno::EIO);
        }
        let r = self.child(&st, parent, name).and_then(|rel| {
            let real = self.real(&rel);
            std::fs::create_dir(&real).map_err(|e| errno(&e))?;
            st.names.record(Change::Created(rel.clone()));
            let _ = std::fs::set_permissions(&real, std::fs::Permissions::from_mode(mode & !umask));
            self.entry(&mut st, rel)
        });
        match r {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut st = self.lock();
        if st.off {
            return reply.error(Errno::EIO);
        }
        let r = self.child(&st, parent, name).and_then(|rel| {
            let real = self.real(&rel);
            let m = std::fs::symlink_metadata(&real).map_err(|e| errno(&e))?;
            if m.is_dir() {
                return Err(Errno::EISDIR);
            }
            // Kept in the stash, not removed, until the directory is synced.
            let stash = st.names.stash_path();
            std::fs::rename(&real, self.real(&stash)).map_err(|e| errno(&e))?;
            st.names.record(Change::Removed {
                path: rel.clone(),
                stash,
            });
            st.used = st.used.saturating_sub(m.len());
            Self::forget_path(&mut st, &rel);
            Ok(())
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut st = self.lock();
        if st.off {
            return reply.error(Errno::EIO);
        }
        let r = self.child(&st, parent, name).and_then(|rel| {
            std::fs::remove_dir(self.real(&rel)).map_err(|e| errno(&e))?;
            st.names.record(Change::RemovedDir(rel.clone()));
            Self::forget_path(&mut st, &rel);
            Ok(())
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        _flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut st = self.lock();
        if st.off {
            return reply.error(Errno::EIO);
        }
        let r = (|| -> Result<(), Errno> {
            let from = self.child(&st, parent, name)?;
            let to = self.child(&st, newparent, newname)?;
            let target = std::fs::symlink_metadata(self.real(&to)).ok();
            let replaced = target.as_ref().filter(|m| !m.is_dir()).map(|m| m.len());
            // A replaced file is linked into the stash first, so that an
            // undone rename can bring it back.
            let stash = match replaced {
                Some(_) => {
                    let stash = st.names.stash_path();
                    std::fs::hard_link(self.real(&to), self.real(&stash)).map_err(|e| errno(&e))?;
                    Some(stash)
                }
                None => None,
            };
            if let Err(e) = std::fs::rename(self.real(&from), self.real(&to)) {
                if let Some(s) = &stash {
                    let _ = std::fs::remove_file(self.real(s));
                }
                return Err(errno(&e));
            }
            if target.as_ref().is_some_and(|m| m.is_dir()) {
                // An empty directory was replaced: undone after the rename.
                st.names.record(Change::RemovedDir(to.clone()));
            }
            st.names.record(Change::Renamed {
                from: from.clone(),
                to: to.clone(),
                replaced: stash,
            });
            if let Some(len) = replaced {
                st.used = st.used.saturating_sub(len);
                Self::forget_path(&mut st, &to);
            }
            Self::renamed(&mut st, &from, &to);
            Ok(())
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let mut st = self.lock();
        match self.open_file(&mut st, ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let mut st = self.lock();
        if st.off {
            return reply.error(Errno::EIO);
        }
        let r = (|| -> Result<(FileAttr, u64), Errno> {
            let rel = self.child(&st, parent, name)?;
            let real = self.real(&rel);
            let existed = std::fs::symlink_metadata(&real).map(|m| m.len()).ok();
            let mut o = OpenOptions::new();
            o.read(true).write(true).create(true);
            if flags & libc::O_EXCL != 0 {
                o.create_new(true);
            }
            let f = o.open(&real).map_err(|e| errno(&e))?;
            if existed.is_none() {
                st.names.record(Change::Created(rel.clone()));
            }
            if flags & libc::O_TRUNC != 0 {
                if let Some(len) = existed.filter(|l| *l > 0) {
                    let ino = Self::ino_for(&mut st, rel.clone());
                    st.journal
                        .before_resize(ino, &f, 0)
                        .map_err(|e| errno(&e))?;
                    f.set_len(0).map_err(|e| errno(&e))?;
                    st.used = st.used.saturating_sub(len);
                }
            }
            let _ = std::fs::set_permissions(&real, std::fs::Permissions::from_mode(mode & !umask));
            drop(f);
            let a = self.entry(&mut st, rel)?;
            let fh = self.open_file(&mut st, a.ino.0)?;
            Ok((a, fh))
        })();
        match r {
            Ok((a, fh)) => reply.created(
                &TTL,
                &a,
                Generation(0),
                FileHandle(fh),
                FopenFlags::FOPEN_DIRECT_IO,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let st = self.lock();
        let Some((_, f)) = st.handles.get(&fh.0) else {
            return reply.error(Errno::EBADF);
        };
        let mut buf = vec![0u8; size as usize];
        let mut done = 0;
        while done < buf.len() {
            match f.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return reply.error(errno(&e)),
            }
        }
        reply.data(&buf[..done]);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut guard = self.lock();
        let st = &mut *guard;
        let Some((ino, f)) = st.handles.get(&fh.0) else {
            return reply.error(Errno::EBADF);
        };
        let ino = *ino;
        if st.frozen {
            match f.try_clone() {
                Ok(file) => st.held.push_back(Held::Write {
                    ino,
                    file,
                    offset,
                    data: data.to_vec(),
                    reply,
                }),
                Err(e) => reply.error(errno(&e)),
            }
            return;
        }
        // Out of the map for the write, which needs the rest of the state
        // mutably; back in before the lock is let go.
        let (ino, f) = st.handles.remove(&fh.0).expect("looked up above");
        let r = Self::write_to(st, ino, &f, offset, data);
        st.handles.insert(fh.0, (ino, f));
        match r {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.lock().handles.remove(&fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let mut st = self.lock();
        if st.frozen {
            st.held.push_back(Held::Fsync { ino: ino.0, reply });
            return;
        }
        Self::fsync_of(&mut st, ino.0);
        reply.ok();
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.opened(FileHandle(0), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let mut st = self.lock();
        let Some(rel) = st.paths.get(&ino.0).cloned() else {
            return reply.error(Errno::ENOENT);
        };
        let entries = match std::fs::read_dir(self.real(&rel)) {
            Ok(e) => e,
            Err(e) => return reply.error(errno(&e)),
        };
        let mut all: Vec<(u64, FileType, std::ffi::OsString)> = vec![
            (ino.0, FileType::Directory, ".".into()),
            (ino.0, FileType::Directory, "..".into()),
        ];
        let at_root = rel.as_os_str().is_empty();
        let mut names: Vec<(std::ffi::OsString, FileType)> = entries
            .flatten()
            .filter(|e| !(at_root && e.file_name() == STASH))
            .map(|e| {
                let k = e.file_type().map(kind).unwrap_or(FileType::RegularFile);
                (e.file_name(), k)
            })
            .collect();
        names.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        for (name, k) in names {
            let child = Self::ino_for(&mut st, rel.join(&name));
            all.push((child, k, name));
        }
        for (i, (child, k, name)) in all.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(child), (i + 1) as u64, k, &name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let mut st = self.lock();
        if st.frozen {
            st.held.push_back(Held::Fsyncdir { ino: ino.0, reply });
            return;
        }
        match self.fsyncdir_of(&mut st, ino.0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let st = self.lock();
        const BS: u64 = 4096;
        if let Some(q) = st.quota {
            let blocks = q / BS;
            let free = q.saturating_sub(st.used) / BS;
            return reply.statfs(
                blocks,
                free,
                free,
                1 << 20,
                1 << 20,
                BS as u32,
                255,
                BS as u32,
            );
        }
        let c = std::ffi::CString::new(self.root.as_os_str().as_bytes()).unwrap_or_default();
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: `c` is a NUL-terminated path and `s` a valid out-pointer.
        if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
            return reply.error(errno(&io::Error::last_os_error()));
        }
        reply.statfs(
            s.f_blocks as u64,
            s.f_bfree as u64,
            s.f_bavail as u64,
            s.f_files as u64,
            s.f_ffree as u64,
            s.f_bsize as u32,
            s.f_namemax as u32,
            s.f_frsize as u32,
        );
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }
}
