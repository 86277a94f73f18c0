//! The kernel's account of which blob files changed since the last sync.
//!
//! A sync must `fdatasync` every blob sled created or wrote since the last
//! one. Listing `blobs/` to find them cost about 6% of the three nodes' CPU
//! at the benchmark's peak (`perf`: `getdents64` over a thousand names, a
//! hundred syncs a second), to find the few names that changed. inotify
//! names them instead: the kernel queues the event inside the system call
//! that creates or writes the file, so a write that returned before a sync
//! drains the queue is in what that sync drains.
//!
//! Whenever that account may be incomplete (no watch could be set, the
//! queue overflowed, the directory went away), [`BlobWatch::drain`] says so
//! and the caller lists the directory instead, as it did before.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};

use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask};

/// What changed in the watched directory since the last drain.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Changes {
    /// Every name created or written since the last drain; `created` when
    /// some name is new, so the directory needs a sync too.
    Names {
        written: BTreeSet<OsString>,
        created: bool,
    },
    /// The account may be incomplete: list the directory.
    Unknown,
}

/// An inotify watch on one directory, re-armed whenever it is lost.
pub(super) struct BlobWatch {
    dir: PathBuf,
    /// `None` when this process could not get an inotify instance (the
    /// per-user limit is 128 by default): every drain is then `Unknown`.
    inotify: Option<Inotify>,
    watch: Option<WatchDescriptor>,
    buf: Vec<u8>,
}

/// Names made or written. Deletions need no sync: a blob whose deletion is
/// lost to a power cut is one sled no longer refers to.
fn mask() -> WatchMask {
    WatchMask::CREATE | WatchMask::MOVED_TO | WatchMask::MODIFY | WatchMask::CLOSE_WRITE
}

impl BlobWatch {
    pub(super) fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
            inotify: Inotify::init().ok(),
            watch: None,
            buf: vec![0; 64 * 1024],
        }
    }

    /// Makes the next drain arm the watch again and answer `Unknown`, so
    /// the caller lists: for when what was drained could not all be synced.
    pub(super) fn rearm(&mut self) {
        self.watch = None;
    }

    /// The names changed since the last drain. The first drain, and the
    /// first after the watch was lost, arms it and returns `Unknown`: the
    /// caller's listing then covers everything before the watch began.
    pub(super) fn drain(&mut self) -> Changes {
        let Some(inotify) = self.inotify.as_mut() else {
            return Changes::Unknown;
        };
        if self.watch.is_none() {
            // Armed before the caller lists, so nothing falls between.
            self.watch = inotify.watches().add(&self.dir, mask()).ok();
            // Events of an earlier watch say nothing the listing will not.
            while inotify
                .read_events(&mut self.buf)
                .is_ok_and(|mut e| e.next().is_some())
            {}
            return Changes::Unknown;
        }
        let mut written = BTreeSet::new();
        let mut created = false;
        let mut complete = true;
        loop {
            let events = match inotify.read_events(&mut self.buf) {
                Ok(events) => events,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    complete = false;
                    break;
                }
            };
            let mut any = false;
            for event in events {
                any = true;
                if event.mask.contains(EventMask::Q_OVERFLOW) {
                    complete = false;
                }
                if event
                    .mask
                    .intersects(EventMask::IGNORED | EventMask::DELETE_SELF)
                {
                    // The directory is gone or unwatched: arm again next time.
                    self.watch = None;
                    complete = false;
                }
                if event
                    .mask
                    .intersects(EventMask::CREATE | EventMask::MOVED_TO)
                {
                    created = true;
                }
                if let Some(name) = event.name {
                    written.insert(name.to_os_string());
                }
            }
            if !any {
                break;
            }
        }
        if complete {
            Changes::Names { written, created }
        } else {
            Changes::Unknown
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn names(c: &Changes) -> Vec<&str> {
        match c {
            Changes::Names { written, .. } => written.iter().map(|n| n.to_str().unwrap()).collect(),
            Changes::Unknown => panic!("expected names, got Unknown"),
        }
    }

    #[test]
    fn names_what_was_created_or_written_since_the_last_drain() {
        let tmp = tempfile::tempdir().unwrap();
        let mut w = BlobWatch::new(tmp.path());
        std::fs::write(tmp.path().join("before"), b"x").unwrap();
        assert_eq!(w.drain(), Changes::Unknown, "arming: the caller lists");
        assert_eq!(names(&w.drain()), Vec::<&str>::new());
        std::fs::write(tmp.path().join("a"), b"half").unwrap();
        let c = w.drain();
        assert_eq!(names(&c), vec!["a"]);
        assert!(matches!(c, Changes::Names { created: true, .. }));
        // A file that grows after a sync caught it halfway is named again.
        std::fs::OpenOptions::new()
            .append(true)
            .open(tmp.path().join("a"))
            .unwrap()
            .write_all(b" and the rest")
            .unwrap();
        let c = w.drain();
        assert_eq!(names(&c), vec!["a"]);
        assert!(matches!(c, Changes::Names { created: false, .. }));
        // A rename into the directory is a new name too.
        let other = tempfile::tempdir_in(tmp.path().parent().unwrap()).unwrap();
        std::fs::write(other.path().join("b"), b"y").unwrap();
        std::fs::rename(other.path().join("b"), tmp.path().join("b")).unwrap();
        let c = w.drain();
        assert_eq!(names(&c), vec!["b"]);
        assert!(matches!(c, Changes::Names { created: true, .. }));
        // Deleting needs no sync.
        std::fs::remove_file(tmp.path().join("a")).unwrap();
        assert_eq!(names(&w.drain()), Vec::<&str>::new());
    }

    /// When the account may be incomplete the caller is told to list.
    #[test]
    fn an_overflow_or_a_lost_directory_makes_the_caller_list() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("blobs");
        std::fs::create_dir(&dir).unwrap();
        let mut w = BlobWatch::new(&dir);
        assert_eq!(w.drain(), Changes::Unknown);
        let max: usize = std::fs::read_to_string("/proc/sys/fs/inotify/max_queued_events")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // Each new file queues at least two events (create, close-write).
        for i in 0..max / 2 + 10 {
            std::fs::write(dir.join(format!("f{i}")), b"z").unwrap();
        }
        assert_eq!(w.drain(), Changes::Unknown, "the queue overflowed");
        assert_eq!(names(&w.drain()), Vec::<&str>::new(), "and works again");
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(w.drain(), Changes::Unknown, "the directory went away");
        std::fs::create_dir(&dir).unwrap();
        assert_eq!(w.drain(), Changes::Unknown, "armed again: list once more");
        std::fs::write(dir.join("c"), b"w").unwrap();
        assert_eq!(names(&w.drain()), vec!["c"]);
        // After a failed sync the caller asks for a listing.
        w.rearm();
        assert_eq!(w.drain(), Changes::Unknown);
        assert_eq!(names(&w.drain()), Vec::<&str>::new());
    }
}
