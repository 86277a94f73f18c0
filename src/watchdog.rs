//! Ends the process when its storage can no longer be trusted, or when
//! openraft has stopped its core.
//!
//! Two things leave a node running but useless, and both were found under
//! faults rather than imagined:
//! - openraft stops its core for good after a storage error (a failed
//!   append or sync); the process stays up, holds its peer port and its
//!   upstream session, and commits nothing;
//! - after a write that failed for lack of space, sled 0.34 can wait forever
//!   for that write to become stable: every later sync blocks, and the node
//!   answered no RPC for the rest of a campaign while saying nothing
//!   (nemesis seed 21, a full disk during a log purge).
//!
//! Neither heals in place: the page cache's state after a failed write or
//! fsync is unknown, so the only trustworthy state is what is on stable
//! storage. The node therefore exits at once with [`EXIT_STORAGE`], without
//! the graceful shutdown (which would wait on the wedged database), and its
//! supervisor restarts it (`Restart=on-failure`, a Kubernetes restart): the
//! recovery that every power-loss test exercises. Nothing acked is lost by
//! exiting, since an ack waits for a completed sync.
//!
//! openraft 0.9 also stops its core on an error of its own (a leader asking
//! a replication stream that has just ended for a snapshot; see
//! `firstseen_raft::faults`). The storage is sound then, but the core is
//! gone all the same, and a restart is the only way to a new one: the node
//! exits with [`EXIT_RAFT`] instead, and says that the disk is not in doubt.
//! The storage's error count ([`StoreFaults`]) tells the two apart.

use std::time::Duration;

use firstseen_raft::{Raft, StoreFaults};
use firstseen_store::disk::Db;
use tokio_util::sync::CancellationToken;

/// A sync running this long without any sync finishing means the database
/// is wedged. A healthy sync on these machines takes about 0.5 ms (1 s at
/// the worst seen under load, docs/benchmarks.md); a slower disk than that
/// cannot keep a Raft member anyway.
pub const STUCK_LIMIT: Duration = Duration::from_secs(20);

/// Exit status of a node whose storage failed (`EX_IOERR` in sysexits.h).
pub const EXIT_STORAGE: i32 = 74;

/// Exit status of a node whose openraft core stopped on an error of its own
/// while the storage reported none (`EX_SOFTWARE` in sysexits.h).
pub const EXIT_RAFT: i32 = 70;

/// Why the node must stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// The storage failed or is wedged: restart from stable storage.
    Storage(String),
    /// openraft stopped its core with the storage sound: restart for a new
    /// core.
    Raft(String),
}

impl Stop {
    pub fn exit_code(&self) -> i32 {
        match self {
            Stop::Storage(_) => EXIT_STORAGE,
            Stop::Raft(_) => EXIT_RAFT,
        }
    }
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stop::Storage(r) | Stop::Raft(r) => f.write_str(r),
        }
    }
}

const EVERY: Duration = Duration::from_secs(1);

/// Why the node must stop, if it must: the pure rule. `store_errors` is how
/// many storage errors openraft had been handed when `raft_failure` was
/// read; read after it, so an error that stopped the core is counted.
pub fn verdict(
    raft_failure: Option<String>,
    store_errors: u64,
    stuck: &[(&str, Option<Duration>)],
    limit: Duration,
) -> Option<Stop> {
    let wedged = stuck.iter().find_map(|(db, running)| {
        running.filter(|d| *d >= limit).map(|d| {
            format!(
                "the {db} database has not completed a sync for {} s",
                d.as_secs()
            )
        })
    });
    match (raft_failure, wedged) {
        (Some(r), _) if store_errors > 0 => Some(Stop::Storage(format!(
            "raft stopped on a storage failure: {r}"
        ))),
        // A wedged disk puts the disk in doubt whatever else happened.
        (_, Some(w)) => Some(Stop::Storage(w)),
        (Some(r), None) => Some(Stop::Raft(format!(
            "raft stopped on an error of its own, with no storage error reported (the disk is not in doubt): {r}"
        ))),
        (None, None) => None,
    }
}

/// What openraft's metrics say about its core: a stop for any reason other
/// than a shutdown is a failure.
fn raft_failure(raft: &Raft) -> Option<String> {
    match &raft.metrics().borrow().running_state {
        Ok(()) | Err(openraft::error::Fatal::Stopped) => None,
        Err(e) => Some(e.to_string()),
    }
}

/// Checks every second until `stop`; exits the process on a failure.
///
/// The checks run on a thread of the blocking pool, not on a runtime
/// worker: a wedged database blocks the workers that call into it (apply's
/// checkpoint syncs the log in place, and the reaper waits for the state's
/// lock behind it), and with both of a 2-core node's workers stuck, a
/// watchdog task is never polled again. That is the likely reading, not a
/// reproduction, of a node that ran on for 90 s after openraft had stopped
/// on a full disk (`tests/durability.rs`,
/// `a_node_whose_storage_fails_exits_for_its_supervisor_and_recovers`, once
/// in a clean-clone run).
pub async fn watch(raft: Raft, faults: StoreFaults, log: Db, state: Db, stop: CancellationToken) {
    let checks = tokio::task::spawn_blocking(move || {
        while !stop.is_cancelled() {
            std::thread::sleep(EVERY);
            let stuck = [
                ("log", log.sync_stuck_for()),
                ("state", state.sync_stuck_for()),
            ];
            let failure = raft_failure(&raft);
            match verdict(failure, faults.count(), &stuck, STUCK_LIMIT) {
                None => {}
                Some(stop @ Stop::Storage(_)) => {
                    tracing::error!(
                        reason = %stop,
                        exit_code = stop.exit_code(),
                        "storage can no longer be trusted: exiting now so that the supervisor restarts the node from what is on stable storage"
                    );
                    std::process::exit(stop.exit_code());
                }
                Some(stop @ Stop::Raft(_)) => {
                    tracing::error!(
                        reason = %stop,
                        exit_code = stop.exit_code(),
                        "openraft stopped its core: exiting now so that the supervisor restarts the node with a new one"
                    );
                    std::process::exit(stop.exit_code());
                }
            }
        }
    });
    // The pool's thread ends within a second of `stop`.
    let _ = checks.await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wedged_sync_or_a_dead_core_stops_the_node_and_nothing_else_does() {
        let limit = Duration::from_secs(20);
        let ok = Some(Duration::from_secs(3));
        assert_eq!(
            verdict(None, 0, &[("log", None), ("state", ok)], limit),
            None
        );
        let stuck = verdict(
            None,
            0,
            &[("log", Some(Duration::from_secs(21))), ("state", None)],
            limit,
        );
        assert_eq!(
            stuck,
            Some(Stop::Storage(
                "the log database has not completed a sync for 21 s".into()
            ))
        );
        let stop = verdict(Some("disk full".into()), 1, &[], limit).unwrap();
        assert_eq!(stop.exit_code(), EXIT_STORAGE);
        assert!(stop.to_string().contains("disk full"));
    }

    /// openraft 0.9 stops its core on its own replication race with no
    /// storage error behind it: the node still exits (only a restart gives
    /// it a new core), but not as a storage failure.
    #[test]
    fn a_core_stopped_with_no_storage_error_is_not_called_a_storage_failure() {
        let limit = Duration::from_secs(20);
        let stop = verdict(
            Some("when Read Snapshot(None): replication channel closed".into()),
            0,
            &[],
            limit,
        )
        .unwrap();
        assert!(matches!(stop, Stop::Raft(_)), "{stop:?}");
        assert_eq!(stop.exit_code(), EXIT_RAFT);
        assert!(stop.to_string().contains("not in doubt"), "{stop}");
        // A wedged sync beside it puts the disk in doubt after all.
        let stuck = [("log", Some(Duration::from_secs(30)))];
        assert!(matches!(
            verdict(Some("x".into()), 0, &stuck, limit),
            Some(Stop::Storage(_))
        ));
    }
}
