//! The guard: what this node's log has promised, kept apart from the log.
//!
//! sled 0.34 treats a damaged record as the end of its log and opens the
//! database without complaint, everything after the damage gone (tried
//! here: one flipped byte in the middle of a log of 20,000 entries opened
//! with 5,022 and no error). A Raft node that comes back with fewer entries
//! than it acknowledged, or an older vote than it cast, breaks Raft's safety
//! quietly: it can vote for a candidate that lacks committed entries, or
//! vote twice in one term. Jepsen found this class of bug in NATS 2.12.1.
//!
//! So a small file beside the log, `guard`, records lower bounds of what the
//! log made durable: the vote, the last durable log id, and how far entries
//! were deleted from the front. [`Guard::check`] compares the log with it at
//! start-up, and the node refuses to start, naming the file, when the log
//! has less.
//!
//! The file holds two slots of `SLOT` bytes, each `MAGIC ‖ seq ‖ len ‖
//! payload ‖ blake3(seq ‖ len ‖ payload)`, written alternately and synced.
//! A torn write damages at most the slot being written; the other still
//! holds the previous record. The vote, purges and truncations are written
//! and synced before the log call returns. The durable log id is written
//! after every log sync but synced only every [`Guard::EVERY`] (by the
//! group commit while busy, by the log's reaper within a tick once idle,
//! and when the log closes): a process crash or a clean stop leaves the
//! exact position in the page cache, a power cut leaves one at most a
//! second or so old, and it
//! costs no second `fdatasync` per group commit. Since the guard is written
//! after the log's own sync, whatever part of it survives a power cut is
//! still a lower bound.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{LogId, RaftError, Vote};

const MAGIC: &[u8; 8] = b"FSGUARD1";
/// Bytes per slot: far above the record, so a slot never needs two writes.
const SLOT: usize = 512;

/// The lower bounds the log must meet.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Marks {
    /// The last vote saved and synced.
    pub vote: Option<Vote>,
    /// Every entry up to this one was durable in the log.
    pub durable: Option<LogId>,
    /// The log's purge point.
    pub purged: Option<LogId>,
    /// Entries below this index were deleted: a state whose outbox still
    /// reads from below it cannot have been the one the node ran with.
    pub deleted_below: u64,
}

/// The guard file of one node.
pub struct Guard {
    path: PathBuf,
    file: File,
    seq: u64,
    marks: Marks,
    /// Records written since the last sync.
    unsynced: bool,
}

fn damaged(path: &Path, reason: impl Into<String>) -> RaftError {
    RaftError::Damaged {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

fn io(path: &Path, source: std::io::Error) -> RaftError {
    RaftError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A slot's record, if it is whole. Public for the fuzz target `stored`.
pub fn decode_slot(raw: &[u8]) -> Option<(u64, Marks)> {
    if raw.len() < SLOT || &raw[..8] != MAGIC {
        return None;
    }
    let seq = u64::from_be_bytes(raw[8..16].try_into().ok()?);
    let len = u32::from_be_bytes(raw[16..20].try_into().ok()?) as usize;
    if 20 + len + 32 > SLOT {
        return None;
    }
    let body = &raw[8..20 + len];
    let sum = &raw[20 + len..20 + len + 32];
    if blake3::hash(body).as_bytes() != sum {
        return None;
    }
    let marks = bincode::deserialize(&raw[20..20 + len]).ok()?;
    Some((seq, marks))
}

fn encode_slot(seq: u64, marks: &Marks) -> Result<Vec<u8>, RaftError> {
    let payload = bincode::serialize(marks)?;
    let mut out = Vec::with_capacity(SLOT);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(&payload);
    let sum = blake3::hash(&out[8..]);
    out.extend_from_slice(sum.as_bytes());
    if out.len() > SLOT {
        return Err(RaftError::GuardTooLarge(out.len()));
    }
    out.resize(SLOT, 0);
    Ok(out)
}

impl Guard {
    /// How often the durable log id is recorded while entries are appended.
    pub const EVERY: Duration = Duration::from_secs(1);

    /// Opens `path`, or creates it holding `initial` when it does not exist.
    /// `initial` is what the log holds now; a node that has a log but no
    /// guard (a data directory from before the guard) starts trusting it.
    pub fn open(path: &Path, initial: impl FnOnce() -> Marks) -> Result<Self, RaftError> {
        let existed = path.exists();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| io(path, e))?;
        if !existed || file.metadata().map_err(|e| io(path, e))?.len() == 0 {
            let mut guard = Self {
                path: path.to_path_buf(),
                file,
                seq: 0,
                marks: Marks::default(),
                unsynced: false,
            };
            guard.write(initial())?;
            if let Some(dir) = path.parent() {
                firstseen_store::disk::sync_dir(dir)?;
            }
            return Ok(guard);
        }
        let mut raw = vec![0u8; 2 * SLOT];
        let len = file.read_at(&mut raw, 0).map_err(|e| io(path, e))?;
        raw.truncate(len);
        let slots = [
            raw.get(..SLOT).and_then(decode_slot),
            raw.get(SLOT..2 * SLOT).and_then(decode_slot),
        ];
        let best = slots.into_iter().flatten().max_by_key(|(seq, _)| *seq);
        let Some((seq, marks)) = best else {
            return Err(damaged(
                path,
                "neither copy of the record is whole (truncated or overwritten)",
            ));
        };
        Ok(Self {
            path: path.to_path_buf(),
            file,
            seq,
            marks,
            unsynced: false,
        })
    }

    /// What the guard holds.
    pub fn marks(&self) -> &Marks {
        &self.marks
    }

    /// Records `marks` and syncs the file. Blocking.
    pub fn write(&mut self, marks: Marks) -> Result<(), RaftError> {
        self.write_unsynced(marks)?;
        self.sync()
    }

    /// Records `marks` in the page cache only; [`Guard::sync`] makes it
    /// durable.
    fn write_unsynced(&mut self, marks: Marks) -> Result<(), RaftError> {
        let seq = self.seq + 1;
        let raw = encode_slot(seq, &marks)?;
        let offset = (seq % 2) * SLOT as u64;
        self.file
            .write_all_at(&raw, offset)
            .map_err(|e| io(&self.path, e))?;
        self.seq = seq;
        self.marks = marks;
        self.unsynced = true;
        Ok(())
    }

    /// Syncs what was recorded since the last sync. Blocking.
    pub fn sync(&mut self) -> Result<(), RaftError> {
        if self.unsynced {
            self.file.sync_data().map_err(|e| io(&self.path, e))?;
            self.unsynced = false;
        }
        Ok(())
    }

    /// Raises the durable log id, without a sync (see the module docs).
    pub fn note_durable(&mut self, durable: Option<LogId>) -> Result<(), RaftError> {
        if durable <= self.marks.durable {
            return Ok(());
        }
        let mut next = self.marks.clone();
        next.durable = durable;
        self.write_unsynced(next)
    }

    /// Changes the marks with `f` and records them if they changed.
    pub fn update(&mut self, f: impl FnOnce(&mut Marks)) -> Result<(), RaftError> {
        let mut next = self.marks.clone();
        f(&mut next);
        if next == self.marks {
            return Ok(());
        }
        self.write(next)
    }

    /// Refuses a log that holds less than the guard says it made durable.
    /// `log_dir` names the log's files in the error.
    pub fn check(
        &self,
        log_dir: &Path,
        vote: Option<&Vote>,
        last: Option<LogId>,
    ) -> Result<(), RaftError> {
        let m = &self.marks;
        let file = log_dir.join("db");
        // Votes of one term from different candidates do not compare: that
        // too is a log that is not the one the guard saw.
        let vote_ok = matches!(
            vote.partial_cmp(&m.vote.as_ref()),
            Some(std::cmp::Ordering::Greater | std::cmp::Ordering::Equal)
        );
        if !vote_ok {
            return Err(damaged(
                &file,
                format!(
                    "its vote is {} but {} was saved before ({}); the file was truncated or corrupted",
                    vote.map_or("none".into(), |v| v.to_string()),
                    m.vote.as_ref().map_or("none".into(), |v| v.to_string()),
                    self.path.display()
                ),
            ));
        }
        if m.durable.map(|l| l.index) > last.map(|l| l.index) {
            return Err(damaged(
                &file,
                format!(
                    "the log ends at {} but it held {} durably before ({}); the file was truncated or corrupted",
                    last.map_or("(empty)".into(), |l| l.to_string()),
                    m.durable.map_or("none".into(), |l| l.to_string()),
                    self.path.display()
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_id(term: u64, index: u64) -> LogId {
        crate::log_id(term, 1, index)
    }

    #[test]
    fn survives_a_torn_slot_and_refuses_a_shorter_log() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("guard");
        {
            let mut g = Guard::open(&path, Marks::default).unwrap();
            g.update(|m| m.durable = Some(log_id(1, 10))).unwrap();
            g.update(|m| m.durable = Some(log_id(1, 20))).unwrap();
        }
        // Tear the newer slot: the older record is still there.
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        let g = Guard::open(&path, Marks::default).unwrap();
        let newer = (g.seq % 2) * SLOT as u64;
        f.write_all_at(&[0xff; 40], newer + 30).unwrap();
        let g = Guard::open(&path, Marks::default).unwrap();
        assert_eq!(g.marks().durable, Some(log_id(1, 10)));
        let dir = tmp.path();
        assert!(g.check(dir, None, Some(log_id(1, 12))).is_ok());
        let err = g.check(dir, None, Some(log_id(1, 5))).unwrap_err();
        assert!(
            err.to_string().contains("db") && err.to_string().contains("truncated"),
            "{err}"
        );
        // Both slots gone: refused, naming the guard.
        f.write_all_at(&[0u8; 2 * SLOT], 0).unwrap();
        let err = Guard::open(&path, Marks::default).err().unwrap();
        assert!(err.to_string().contains("guard"), "{err}");
    }

    #[test]
    fn an_older_vote_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let mut g = Guard::open(&tmp.path().join("guard"), Marks::default).unwrap();
        let v5 = Vote::new_committed(5, 2);
        g.update(|m| m.vote = Some(v5)).unwrap();
        assert!(g.check(tmp.path(), Some(&v5), None).is_ok());
        assert!(g
            .check(tmp.path(), Some(&Vote::new_committed(4, 2)), None)
            .is_err());
        assert!(g.check(tmp.path(), None, None).is_err());
    }
}
