//! Ends the process when its storage can no longer be trusted.
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
//! openraft 0.9 also stops its core on an error it makes itself: a leader
//! that asks a replication stream for a snapshot just after the stream
//! ended on a higher vote reports "Read Snapshot(None): replication channel
//! closed" (0.9.25's `raft_core.rs`, `Command::Replicate`; 0.10 ignores
//! the closed stream). The disk is sound then, but the core is gone all the
//! same and only a restart brings a new one, so the exit is the same; the
//! reason gives openraft's words, and docs/operations.md tells the two
//! apart for the operator.

use std::time::Duration;

use firstseen_raft::Raft;
use firstseen_store::disk::Db;
use tokio_util::sync::CancellationToken;

/// A sync running this long without any sync finishing means the database
/// is wedged. A healthy sync on these machines takes about 0.5 ms (1 s at
/// the worst seen under load, docs/benchmarks.md); a slower disk than that
/// cannot keep a Raft member anyway.
pub const STUCK_LIMIT: Duration = Duration::from_secs(20);

/// Exit status of a node whose storage failed (`EX_IOERR` in sysexits.h).
pub const EXIT_STORAGE: i32 = 74;

const EVERY: Duration = Duration::from_secs(1);

/// Why the node must stop, if it must: the pure rule.
pub fn verdict(
    raft_failure: Option<String>,
    stuck: &[(&str, Option<Duration>)],
    limit: Duration,
) -> Option<String> {
    if let Some(r) = raft_failure {
        return Some(format!("openraft stopped its core: {r}"));
    }
    stuck.iter().find_map(|(db, running)| {
        running.filter(|d| *d >= limit).map(|d| {
            format!(
                "the {db} database has not completed a sync for {} s",
                d.as_secs()
            )
        })
    })
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
pub async fn watch(raft: Raft, log: Db, state: Db, stop: CancellationToken) {
    let checks = tokio::task::spawn_blocking(move || {
        while !stop.is_cancelled() {
            std::thread::sleep(EVERY);
            let stuck = [
                ("log", log.sync_stuck_for()),
                ("state", state.sync_stuck_for()),
            ];
            if let Some(reason) = verdict(raft_failure(&raft), &stuck, STUCK_LIMIT) {
                tracing::error!(
                    reason = %reason,
                    exit_code = EXIT_STORAGE,
                    "storage can no longer be trusted: exiting now so that the supervisor restarts the node from what is on stable storage"
                );
                std::process::exit(EXIT_STORAGE);
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
        assert_eq!(verdict(None, &[("log", None), ("state", ok)], limit), None);
        let stuck = verdict(
            None,
            &[("log", Some(Duration::from_secs(21))), ("state", None)],
            limit,
        );
        assert_eq!(
            stuck.as_deref(),
            Some("the log database has not completed a sync for 21 s")
        );
        let dead = verdict(Some("disk full".into()), &[], limit).unwrap();
        assert!(dead.contains("disk full"), "{dead}");
        // openraft 0.9's own race stops the node too: only a restart gives
        // it a new core.
        assert!(verdict(Some("replication channel closed".into()), &[], limit).is_some());
    }
}
