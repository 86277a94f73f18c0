//! What the snapshot on disk covers, shared by the state machine (which
//! promotes snapshots) and the log (which purges behind them).
//!
//! The rule it enforces: **the log's purge point never passes the current
//! snapshot on disk.** A node whose state database is damaged rebuilds it
//! from that snapshot and re-applies the log after it; a purge point beyond
//! the snapshot leaves a gap nothing on the node can fill, and the node can
//! never start again (finding 16 in docs/reliability.md).
//!
//! openraft 0.9 breaks that rule on its own for one moment: a follower that
//! accepts a leader's snapshot queues the install to the state machine's
//! task and, in the same step, a purge up to the snapshot's end, which the
//! core runs without waiting for the install. So a purge beyond the
//! snapshot on disk waits here while a received snapshot is being
//! installed, and fails if that install failed.

use std::sync::Arc;

use tokio::sync::watch;

use crate::LogId;

/// Where a snapshot install stands, as far as a purge cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Install {
    /// No received snapshot is on its way into the state.
    Idle,
    /// A snapshot is being received or installed.
    Underway,
    /// The last install failed: the purge that came with it must not run.
    Failed,
}

#[derive(Clone, Copy, Debug)]
struct Cover {
    /// The last entry the current snapshot on disk holds.
    on_disk: Option<LogId>,
    install: Install,
}

/// Why a purge was refused.
#[derive(Debug, thiserror::Error)]
#[error(
    "refusing to purge the log up to {upto}: the snapshot on disk ends at {on_disk:?} and the install of a newer one failed"
)]
pub struct Uncovered {
    pub upto: LogId,
    pub on_disk: Option<LogId>,
}

/// The shared record; cheap to clone.
#[derive(Clone)]
pub struct SnapshotCover(Arc<watch::Sender<Cover>>);

impl SnapshotCover {
    /// Starts from the snapshot found on disk at open.
    pub fn new(on_disk: Option<LogId>) -> Self {
        let (tx, _) = watch::channel(Cover {
            on_disk,
            install: Install::Idle,
        });
        Self(Arc::new(tx))
    }

    /// A snapshot is on its way in (openraft asked for a file to receive it).
    pub fn receiving(&self) {
        self.0.send_modify(|c| c.install = Install::Underway);
    }

    /// A snapshot this node built, ending at `last`, is now the current one
    /// on disk. An install under way stays under way: builds and installs
    /// take turns on the state machine's task.
    pub fn built(&self, last: Option<LogId>) {
        self.0.send_modify(|c| c.on_disk = c.on_disk.max(last));
    }

    /// The received snapshot, ending at `last`, is now the current one on
    /// disk (its import into the state comes next).
    pub fn installed(&self, last: Option<LogId>) {
        self.0.send_modify(|c| {
            c.on_disk = c.on_disk.max(last);
            c.install = Install::Idle;
        });
    }

    /// The install under way failed before its snapshot reached the disk.
    pub fn install_failed(&self) {
        self.0.send_modify(|c| c.install = Install::Failed);
    }

    /// Returns once purging up to `upto` keeps the rule above: at once when
    /// the snapshot on disk covers it or no install is under way (nothing
    /// is coming that could: openraft's conformance suite purges without
    /// snapshots, and so did data directories written before this rule);
    /// otherwise when the install under way has put its snapshot on disk.
    pub async fn wait_until_covered(&self, upto: LogId) -> Result<(), Uncovered> {
        let mut rx = self.0.subscribe();
        loop {
            let c = *rx.borrow_and_update();
            if c.on_disk >= Some(upto) {
                return Ok(());
            }
            match c.install {
                Install::Idle => return Ok(()),
                Install::Failed => {
                    return Err(Uncovered {
                        upto,
                        on_disk: c.on_disk,
                    })
                }
                Install::Underway => {}
            }
            // The sender lives in `self`, so this cannot end while we wait.
            if rx.changed().await.is_err() {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    use super::*;

    fn id(index: u64) -> LogId {
        crate::log_id(1, 1, index)
    }

    #[tokio::test]
    async fn a_purge_past_the_snapshot_waits_for_the_install_under_way() {
        let cover = SnapshotCover::new(Some(id(10)));
        // Covered, and nothing under way: immediate.
        cover.wait_until_covered(id(10)).await.unwrap();
        cover.wait_until_covered(id(50)).await.unwrap();
        cover.receiving();
        // Polled by hand, so "still waiting" is a fact, not a timing.
        let mut cx = Context::from_waker(Waker::noop());
        let mut waiting = pin!(cover.wait_until_covered(id(50)));
        assert!(waiting.as_mut().poll(&mut cx).is_pending());
        cover.built(Some(id(40)));
        assert!(waiting.as_mut().poll(&mut cx).is_pending());
        cover.installed(Some(id(50)));
        assert!(matches!(
            waiting.as_mut().poll(&mut cx),
            Poll::Ready(Ok(()))
        ));
    }

    #[tokio::test]
    async fn a_failed_install_refuses_its_purge() {
        let cover = SnapshotCover::new(Some(id(10)));
        cover.receiving();
        cover.install_failed();
        let err = cover.wait_until_covered(id(50)).await.unwrap_err();
        assert_eq!(err.on_disk, Some(id(10)));
        // A purge the snapshot on disk covers is still fine.
        cover.wait_until_covered(id(10)).await.unwrap();
    }
}
