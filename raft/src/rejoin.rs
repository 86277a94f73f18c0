//! A node whose Raft log is damaged sets it aside and rejoins with an empty
//! one, without voting until the group has brought it up to date.
//!
//! sled 0.34 does not always come back from a power cut: after every node
//! lost power at once, one log database in about 25 tries under load
//! panicked on its first read ("cannot find pid 7 in view_for_key", a known
//! sled bug). Refusing to start is safe but leaves the group one node short
//! for good, and two such nodes stop it. So the node repairs itself, in a
//! way that keeps Raft's guarantees:
//!
//! - Nothing it lost is needed from it: every committed entry is also on a
//!   majority, and a leader elected without this node holds all of them.
//! - What it must not do is vote with the shorter log: it could elect a
//!   candidate that lacks an entry this node had acknowledged and that was
//!   committed on the strength of that acknowledgement. So it keeps its last
//!   vote (from the guard, synced before every vote is returned; the vote
//!   never goes back, so it cannot vote twice in a term), refuses every vote
//!   and pre-vote and never campaigns until it has caught up.
//! - Caught up means: once it has taken an append from the leader (so the
//!   leader has found where its log now ends and no longer counts what it
//!   acknowledged before), it asks the leader for its read index: the
//!   leader's last log index once a quorum confirmed it, which is at or
//!   above every entry ever committed (not openraft's read index, whose
//!   commit index can lag after a power cut of every node:
//!   `src/cluster/elect.rs`, `read_index`); when it has applied up to
//!   there, its log holds every entry committed before the damage, and it
//!   votes normally again (the election driver in the node does this).
//!
//! The damaged log is kept beside the new one as `log.damaged` (the newest
//! only) for a post-mortem; the state database, which refers into the log,
//! is rebuilt from the current snapshot like any damaged state. A file,
//! `rejoin`, records that the node is abstaining, so a crash before it has
//! caught up does not end the abstention. A node whose guard cannot be read
//! does not know its last vote and is refused instead, as before.
//!
//! The leader notices that the follower's log went back and starts its
//! replication over (openraft's `Config::allow_log_reversion`, set in
//! `cluster::raft_config`; 0.9's feature `loosen-follower-log-revert`).

use std::path::Path;

use crate::guard::{Guard, Marks};
use crate::{LogId, RaftError, Vote};

/// The file that says the node is rejoining, beside `log/`.
pub const MARKER: &str = "rejoin";
/// Where the damaged log is kept, beside `log/`.
pub const SET_ASIDE: &str = "log.damaged";

/// Whether the node in `dir` is rejoining after its log was set aside.
pub fn pending(dir: &Path) -> bool {
    dir.join(MARKER).exists()
}

/// Whether a node that has applied up to `applied` holds every entry up to
/// `target`, the leader's read index asked after the node took an append.
/// A leader with no read index has nothing committed, so nothing to hold.
pub fn caught_up(applied: Option<&LogId>, target: Option<&LogId>) -> bool {
    match target {
        None => true,
        Some(t) => applied.is_some_and(|a| a.index >= t.index),
    }
}

fn io(path: &Path, source: std::io::Error) -> RaftError {
    RaftError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Whether `e`, from opening the storage in `dir`, is damage to the log
/// database itself (rather than to the guard, the state or the snapshot,
/// or an I/O error that says nothing about the data).
pub fn is_log_damage(dir: &Path, e: &RaftError) -> bool {
    let log = dir.join("log");
    match e {
        RaftError::Damaged { path, .. } => path.starts_with(&log),
        RaftError::Store(firstseen_store::StoreError::Damaged { path, .. }) => {
            path.starts_with(&log)
        }
        _ => false,
    }
}

/// Sets the damaged log of `dir` aside and leaves an empty one that holds
/// only the last vote, with the guard, the state and the marker to match.
/// Blocking. Returns the vote kept; refuses (returns `damage` back) when the
/// guard cannot say what the last vote was.
pub fn set_aside(
    dir: &Path,
    damage: RaftError,
    min_free_bytes: u64,
) -> Result<Option<Vote>, RaftError> {
    // sled fails on a full disk in ways that look like damage (an
    // unfinished snapshot it then calls corrupt, panics on writes that
    // failed): the log stays, and a start with room decides.
    match firstseen_store::disk::free_bytes(dir) {
        Ok(free) if free >= min_free_bytes => {}
        free => {
            tracing::error!(error = %damage, free = ?free.map_err(|e| e.to_string()), min_free_bytes, "the Raft log looks damaged, but the disk is (nearly) full, which can explain it: not setting it aside; start again once there is room");
            return Err(damage);
        }
    }
    let guard_path = dir.join("guard");
    // The guard is the only record of the vote outside the damaged log.
    let marks = match Guard::open(&guard_path, Marks::default) {
        Ok(g) => g.marks().clone(),
        Err(e) => {
            tracing::error!(guard = %guard_path.display(), error = %e, "the log is damaged and the guard cannot be read either: refusing to start");
            return Err(damage);
        }
    };
    let vote = marks.vote;
    tracing::error!(
        error = %damage,
        vote = ?vote,
        set_aside = %dir.join(SET_ASIDE).display(),
        "the Raft log cannot be read; setting it aside and rejoining with an empty log. This node refuses every vote and does not campaign until the leader has brought it up to date (delete the damaged copy once you no longer need it)"
    );
    // The marker first: from here on, whatever state a crash leaves, the
    // next start abstains.
    let marker = dir.join(MARKER);
    // Set aside before and not yet caught up: the log now is the empty one
    // of that rejoin (a start cut short in the middle of this function
    // leaves one the guard refuses); the first damaged copy is the one
    // worth keeping.
    let again = pending(dir) && dir.join(SET_ASIDE).exists();
    write_synced(&marker, &format!("{damage}\n"))?;
    let log = dir.join("log");
    let aside = dir.join(SET_ASIDE);
    if again {
        if log.exists() {
            std::fs::remove_dir_all(&log).map_err(|e| io(&log, e))?;
        }
    } else {
        if aside.exists() {
            std::fs::remove_dir_all(&aside).map_err(|e| io(&aside, e))?;
        }
        if log.exists() {
            std::fs::rename(&log, &aside).map_err(|e| io(&log, e))?;
        }
    }
    firstseen_store::disk::sync_dir(dir)?;
    // The state refers to log entries by index: rebuilt from the snapshot.
    crate::damage::mark_state_damaged(dir, "the Raft log it refers to was set aside");
    // The new log holds the vote before the guard lowers its other marks:
    // a crash in between leaves a guard that refuses the log, and the next
    // start sets it aside again.
    let fresh = firstseen_store::disk::Disk::open_log(dir)?;
    if let Some(v) = &vote {
        crate::log_store::seed_vote(&fresh, v)?;
    }
    drop(fresh);
    let mut guard = Guard::open(&guard_path, Marks::default)?;
    guard.write(Marks {
        vote,
        ..Marks::default()
    })?;
    metrics::counter!("firstseen_log_set_aside_total").increment(1);
    Ok(vote)
}

/// Ends the abstention of the node in `dir`: removes the marker. Blocking.
pub fn finish(dir: &Path) -> Result<(), RaftError> {
    let marker = dir.join(MARKER);
    match std::fs::remove_file(&marker) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io(&marker, e)),
    }
    firstseen_store::disk::sync_dir(dir)?;
    Ok(())
}

fn write_synced(path: &Path, text: &str) -> Result<(), RaftError> {
    std::fs::write(path, text)
        .and_then(|()| std::fs::File::open(path)?.sync_all())
        .map_err(|e| io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(term: u64, index: u64) -> LogId {
        crate::log_id(term, 1, index)
    }

    #[test]
    fn abstains_until_the_leaders_read_index_is_applied() {
        assert!(!caught_up(None, Some(&id(5, 90))));
        assert!(!caught_up(Some(&id(5, 89)), Some(&id(5, 90))));
        assert!(caught_up(Some(&id(5, 90)), Some(&id(5, 90))));
        assert!(caught_up(Some(&id(6, 91)), Some(&id(5, 90))));
        assert!(caught_up(None, None));
    }
}
