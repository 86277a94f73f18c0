//! What a power cut takes away: per file, every change since its last
//! `fsync`/`fdatasync`, kept as an undo record.
//!
//! Writes go through to the backing file at once, so reads need no overlay.
//! Before each write the bytes it overwrites (and the file's length) are
//! saved; a resize saves the length and whatever a shrink cut off. A sync of
//! the file forgets its records: from then on those bytes survive. A power
//! cut replays the records of every file backwards, which leaves each file
//! exactly as it was at its last sync. Optionally the last write of a file
//! is then re-applied in part, up to a random byte: a torn write, as a disk
//! that lost power in the middle of a sector run would leave it.
//!
//! The journal knows files by number only; the filesystem hands it an open
//! backing file for each operation.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// One change to undo.
#[derive(Debug)]
enum Undo {
    /// `old` was at `offset` (empty where the file ended) and the file was
    /// `old_len` long before the write.
    Write {
        offset: u64,
        old: Vec<u8>,
        old_len: u64,
    },
    /// The file went from `old_len` to another length; `tail` is what a
    /// shrink cut off, from the new length on.
    Resize {
        old_len: u64,
        new_len: u64,
        tail: Vec<u8>,
    },
}

#[derive(Debug, Default)]
struct FileJournal {
    undo: Vec<Undo>,
    /// The data of the last write, for a torn replay.
    last_write: Option<(u64, Vec<u8>)>,
    /// Bytes written since the last sync.
    pending: u64,
}

/// The unsynced changes of every file.
#[derive(Debug, Default)]
pub struct Journal {
    files: HashMap<u64, FileJournal>,
}

/// What a power cut did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Lost {
    pub files: u64,
    /// Bytes of writes undone (before any torn replay).
    pub bytes: u64,
    /// Bytes of last writes re-applied by a torn replay.
    pub torn_bytes: u64,
    /// Name changes undone (creates, removals, renames).
    pub names: u64,
}

/// A small deterministic generator, so a seed replays the same tears.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d);
        if n == 0 {
            0
        } else {
            x % n
        }
    }
}

fn read_range(f: &File, offset: u64, len: u64) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len as usize];
    let mut done = 0;
    while done < buf.len() {
        let n = f.read_at(&mut buf[done..], offset + done as u64)?;
        if n == 0 {
            buf.truncate(done);
            break;
        }
        done += n;
    }
    Ok(buf)
}

impl Journal {
    /// Records what a write of `len` bytes at `offset` will overwrite. Call
    /// it before the write.
    pub fn before_write(&mut self, ino: u64, f: &File, offset: u64, data: &[u8]) -> io::Result<()> {
        let old_len = f.metadata()?.len();
        let end = (offset + data.len() as u64).min(old_len);
        let old = if offset < end {
            read_range(f, offset, end - offset)?
        } else {
            Vec::new()
        };
        let j = self.files.entry(ino).or_default();
        j.undo.push(Undo::Write {
            offset,
            old,
            old_len,
        });
        j.last_write = Some((offset, data.to_vec()));
        j.pending += data.len() as u64;
        Ok(())
    }

    /// Records a change of length to `new_len`. Call it before the change.
    pub fn before_resize(&mut self, ino: u64, f: &File, new_len: u64) -> io::Result<()> {
        let old_len = f.metadata()?.len();
        if old_len == new_len {
            return Ok(());
        }
        let tail = if new_len < old_len {
            read_range(f, new_len, old_len - new_len)?
        } else {
            Vec::new()
        };
        let j = self.files.entry(ino).or_default();
        j.undo.push(Undo::Resize {
            old_len,
            new_len,
            tail,
        });
        j.last_write = None;
        Ok(())
    }

    /// The file was synced: what it holds now survives a power cut.
    pub fn synced(&mut self, ino: u64) {
        self.files.remove(&ino);
    }

    /// The file is gone (removed, or replaced by a rename): nothing to undo.
    pub fn forget(&mut self, ino: u64) {
        self.files.remove(&ino);
    }

    /// Files with unsynced changes.
    pub fn dirty(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.files.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Bytes written and not yet synced, over all files.
    pub fn pending_bytes(&self) -> u64 {
        self.files.values().map(|j| j.pending).sum()
    }

    /// Undoes every unsynced change of one file, through `f`. With `tear`,
    /// the last write is then re-applied up to a random byte.
    pub fn lose(&mut self, ino: u64, f: &File, tear: Option<&mut Rng>) -> io::Result<Lost> {
        let Some(j) = self.files.remove(&ino) else {
            return Ok(Lost::default());
        };
        let mut lost = Lost {
            files: 1,
            bytes: j.pending,
            ..Lost::default()
        };
        let last_is_write = matches!(j.undo.last(), Some(Undo::Write { .. }));
        for u in j.undo.into_iter().rev() {
            match u {
                Undo::Write {
                    offset,
                    old,
                    old_len,
                } => {
                    f.write_all_at(&old, offset)?;
                    f.set_len(old_len)?;
                }
                Undo::Resize {
                    old_len,
                    new_len,
                    tail,
                } => {
                    f.set_len(old_len)?;
                    if !tail.is_empty() {
                        f.write_all_at(&tail, new_len)?;
                    }
                }
            }
        }
        if let (Some(rng), true, Some((offset, data))) = (tear, last_is_write, j.last_write) {
            let keep = rng.below(data.len() as u64) as usize;
            if keep > 0 {
                f.write_all_at(&data[..keep], offset)?;
                lost.torn_bytes = keep as u64;
            }
        }
        Ok(lost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::OpenOptions;

    fn open(path: &std::path::Path) -> File {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .unwrap()
    }

    fn write(j: &mut Journal, f: &File, offset: u64, data: &[u8]) {
        j.before_write(1, f, offset, data).unwrap();
        f.write_all_at(data, offset).unwrap();
    }

    #[test]
    fn a_power_cut_leaves_each_file_as_it_was_at_its_last_sync() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("f");
        let f = open(&path);
        let mut j = Journal::default();
        write(&mut j, &f, 0, b"hello world");
        j.synced(1);
        write(&mut j, &f, 6, b"there, and more");
        j.before_resize(1, &f, 3).unwrap();
        f.set_len(3).unwrap();
        write(&mut j, &f, 10, b"x");
        j.before_resize(1, &f, 40).unwrap();
        f.set_len(40).unwrap();
        assert_eq!(j.dirty(), vec![1]);
        let lost = j.lose(1, &f, None).unwrap();
        assert_eq!(lost.files, 1);
        assert_eq!(std::fs::read(&path).unwrap(), b"hello world");
        assert!(j.dirty().is_empty());
    }

    #[test]
    fn a_torn_write_keeps_a_prefix_of_the_last_write_only() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("f");
        let f = open(&path);
        let mut j = Journal::default();
        write(&mut j, &f, 0, b"base");
        j.synced(1);
        write(&mut j, &f, 4, b"-first");
        write(&mut j, &f, 10, b"-second-write");
        let mut rng = Rng::new(7);
        let lost = j.lose(1, &f, Some(&mut rng)).unwrap();
        let got = std::fs::read(&path).unwrap();
        let keep = lost.torn_bytes as usize;
        assert!(keep < b"-second-write".len());
        if keep == 0 {
            assert_eq!(got, b"base");
        } else {
            // The first unsynced write is gone; the file has a hole where it
            // was, then a prefix of the last one.
            assert_eq!(&got[..4], b"base");
            assert_eq!(&got[10..], &b"-second-write"[..keep]);
            assert!(got[4..10].iter().all(|b| *b == 0));
        }
    }
}
