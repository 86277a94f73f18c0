//! What a power cut takes away from the namespace: every create, mkdir,
//! unlink, rmdir and rename that no `fsync` of its directory has made
//! durable since.
//!
//! POSIX promises a new, removed or renamed name only once the directory
//! holding it has been fsynced (both directories, for a rename across two).
//! Some filesystems keep more (ext4's journal commits every earlier name
//! change with any fsync); this keeps the minimum, so that a program which
//! relies on more than the promise loses its files here, in a test, and not
//! on some other filesystem after a real power cut.
//!
//! Changes go through to the backing directory at once. Each is recorded
//! with the directories whose fsync makes it durable; a power cut undoes
//! the rest, newest first. A file that a change removed or replaced is kept
//! in the stash (a hidden directory of the backing root) until the change
//! is durable, so that it can come back.
//!
//! Not modelled: a file's data is undone by [`crate::journal`] as it was
//! when the power went; a file brought back from the stash comes back with
//! the data it had when it was removed.

use std::io;
use std::path::{Path, PathBuf};

/// Name of the stash under the backing root; never shown under the mount.
pub const STASH: &str = ".crashfs-stash";

/// One name change to undo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A file or directory was made at this path.
    Created(PathBuf),
    /// The file at `path` was removed; `stash` holds it.
    Removed { path: PathBuf, stash: PathBuf },
    /// The empty directory at this path was removed.
    RemovedDir(PathBuf),
    /// `from` was renamed to `to`; `replaced` holds what `to` was before.
    Renamed {
        from: PathBuf,
        to: PathBuf,
        replaced: Option<PathBuf>,
    },
}

impl Change {
    /// The directories whose fsync makes this change durable.
    fn dirs(&self) -> Vec<PathBuf> {
        let parent = |p: &Path| p.parent().map(Path::to_path_buf).unwrap_or_default();
        match self {
            Change::Created(p) | Change::Removed { path: p, .. } | Change::RemovedDir(p) => {
                vec![parent(p)]
            }
            Change::Renamed { from, to, .. } => {
                let (a, b) = (parent(from), parent(to));
                if a == b {
                    vec![a]
                } else {
                    vec![a, b]
                }
            }
        }
    }

    /// What the stash holds for this change, to delete once it is durable.
    fn stashed(&self) -> Option<&Path> {
        match self {
            Change::Removed { stash, .. } => Some(stash),
            Change::Renamed {
                replaced: Some(s), ..
            } => Some(s),
            _ => None,
        }
    }
}

#[derive(Debug)]
struct Pending {
    change: Change,
    /// Directories (relative to the root) not fsynced since the change.
    unsynced: Vec<PathBuf>,
}

/// The name changes not yet durable, oldest first.
#[derive(Debug, Default)]
pub struct Names {
    pending: Vec<Pending>,
    next_stash: u64,
}

impl Names {
    /// A fresh path in the stash (relative to the root) for a file that a
    /// change is about to remove or replace.
    pub fn stash_path(&mut self) -> PathBuf {
        self.next_stash += 1;
        Path::new(STASH).join(self.next_stash.to_string())
    }

    /// Records a change just made.
    pub fn record(&mut self, change: Change) {
        let unsynced = change.dirs();
        self.pending.push(Pending { change, unsynced });
    }

    /// Directory `dir` was fsynced: what changed in it is durable. Returns
    /// the stash entries (relative to the root) no longer needed.
    pub fn synced(&mut self, dir: &Path) -> Vec<PathBuf> {
        let mut done = Vec::new();
        self.pending.retain_mut(|p| {
            p.unsynced.retain(|d| d != dir);
            if p.unsynced.is_empty() {
                done.extend(p.change.stashed().map(Path::to_path_buf));
                false
            } else {
                true
            }
        });
        done
    }

    /// How many changes a power cut would undo now.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Takes the changes to undo, newest first.
    pub fn take_for_undo(&mut self) -> Vec<Change> {
        let mut changes: Vec<Change> = self.pending.drain(..).map(|p| p.change).collect();
        changes.reverse();
        changes
    }
}

/// Undoes `change` under `root`. A name that is already gone (a directory
/// whose own creation was undone took it along) is not an error.
pub fn undo(root: &Path, change: &Change) -> io::Result<()> {
    let gone = |r: io::Result<()>| match r {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    };
    match change {
        Change::Created(p) => {
            let real = root.join(p);
            match std::fs::symlink_metadata(&real) {
                // A directory whose name is lost takes what it held along.
                Ok(m) if m.is_dir() => std::fs::remove_dir_all(&real),
                Ok(_) => std::fs::remove_file(&real),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(e),
            }
        }
        Change::Removed { path, stash } => {
            if let Some(dir) = root.join(path).parent() {
                std::fs::create_dir_all(dir)?;
            }
            gone(std::fs::rename(root.join(stash), root.join(path)))
        }
        Change::RemovedDir(p) => match std::fs::create_dir(root.join(p)) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            other => other,
        },
        Change::Renamed { from, to, replaced } => {
            if let Some(dir) = root.join(from).parent() {
                std::fs::create_dir_all(dir)?;
            }
            gone(std::fs::rename(root.join(to), root.join(from)))?;
            match replaced {
                Some(s) => gone(std::fs::rename(root.join(s), root.join(to))),
                None => Ok(()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names_after(root: &Path) -> Vec<String> {
        let mut out = Vec::new();
        for e in walk(root) {
            let rel = e.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            if !rel.starts_with(STASH) {
                let body = std::fs::read_to_string(&e).unwrap_or_else(|_| "/".into());
                out.push(format!("{rel}={body}"));
            }
        }
        out.sort();
        out
    }

    fn walk(dir: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            out.push(e.path());
            if e.file_type().unwrap().is_dir() {
                out.extend(walk(&e.path()));
            }
        }
        out
    }

    fn cut(root: &Path, names: &mut Names) {
        for c in names.take_for_undo() {
            undo(root, &c).unwrap();
        }
    }

    /// The write-then-rename pattern: without an fsync of the directory the
    /// old file comes back; with it, the new one stays.
    #[test]
    fn a_rename_over_a_file_holds_only_once_its_directory_is_synced() {
        for sync in [false, true] {
            let tmp = tempfile::tempdir().unwrap();
            let root = tmp.path();
            std::fs::create_dir(root.join(STASH)).unwrap();
            std::fs::write(root.join("snap"), "old").unwrap();
            let mut names = Names::default();
            std::fs::write(root.join("snap.tmp"), "new").unwrap();
            names.record(Change::Created("snap.tmp".into()));
            let stash = names.stash_path();
            std::fs::hard_link(root.join("snap"), root.join(&stash)).unwrap();
            std::fs::rename(root.join("snap.tmp"), root.join("snap")).unwrap();
            names.record(Change::Renamed {
                from: "snap.tmp".into(),
                to: "snap".into(),
                replaced: Some(stash.clone()),
            });
            if sync {
                let freed = names.synced(Path::new(""));
                assert_eq!(freed, vec![stash]);
            }
            cut(root, &mut names);
            let want = if sync { "snap=new" } else { "snap=old" };
            assert_eq!(names_after(root), vec![want.to_string()]);
        }
    }

    /// A file in a new directory is lost with the directory's own name,
    /// even when the file's directory was synced.
    #[test]
    fn a_new_directory_not_synced_in_its_parent_takes_its_files_along() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let mut names = Names::default();
        std::fs::create_dir(root.join("a")).unwrap();
        names.record(Change::Created("a".into()));
        std::fs::write(root.join("a/f"), "x").unwrap();
        names.record(Change::Created("a/f".into()));
        names.synced(Path::new("a"));
        assert_eq!(names.len(), 1);
        cut(root, &mut names);
        assert!(names_after(root).is_empty());
    }

    /// An unlink, and a rename across directories synced on one side only,
    /// come undone; a removed empty directory comes back.
    #[test]
    fn removals_and_half_synced_renames_come_undone() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        std::fs::create_dir(root.join(STASH)).unwrap();
        for d in ["x", "y", "z"] {
            std::fs::create_dir(root.join(d)).unwrap();
        }
        std::fs::write(root.join("x/f"), "f").unwrap();
        std::fs::write(root.join("x/g"), "g").unwrap();
        let mut names = Names::default();
        let stash = names.stash_path();
        std::fs::rename(root.join("x/f"), root.join(&stash)).unwrap();
        names.record(Change::Removed {
            path: "x/f".into(),
            stash,
        });
        std::fs::rename(root.join("x/g"), root.join("y/g")).unwrap();
        names.record(Change::Renamed {
            from: "x/g".into(),
            to: "y/g".into(),
            replaced: None,
        });
        std::fs::remove_dir(root.join("z")).unwrap();
        names.record(Change::RemovedDir("z".into()));
        assert!(names.synced(Path::new("y")).is_empty());
        assert_eq!(names.len(), 3);
        cut(root, &mut names);
        assert_eq!(
            names_after(root),
            vec!["x/f=f", "x/g=g", "x=/", "y=/", "z=/"]
        );
    }
}
