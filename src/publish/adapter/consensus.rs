//! The publisher's [`Consensus`] over openraft: leadership, the lease,
//! the read barrier, and what it commits through the node's proposer.

use std::sync::Arc;
use std::time::Duration;

use firstseen_raft::{Raft, TypeConfig};
use openraft::metrics::RaftServerMetrics;
use tokio::sync::watch;

use crate::cluster::liveness::Liveness;
use crate::propose::Proposer;
use crate::publish::port::Consensus;
use crate::Error;

/// The Raft group through openraft, with receipts proposed through the
/// node's proposer.
pub struct RaftGroup {
    pub raft: Raft,
    pub proposer: Proposer,
    /// Lease confirmations are recorded here, for readiness.
    pub liveness: Arc<Liveness>,
    /// Longest wait for a quorum to confirm the lease: below the election
    /// timeout, so a leader cut off lets go before a successor can exist.
    pub lease_timeout: Duration,
    /// A confirmation younger than this (by the publisher or the lease
    /// watch) stands for a new one (`Timing::lease_fresh`).
    pub lease_fresh: Duration,
    /// openraft's server metrics: vote, role, leader and membership. They
    /// change with leadership only, not with every apply or replication
    /// ack as the full metrics do, so `changed` wakes the publisher for
    /// what it means; `Outbox::grown` wakes it for new messages.
    pub metrics: watch::Receiver<RaftServerMetrics<TypeConfig>>,
}

impl Consensus for RaftGroup {
    fn leadership(&mut self) -> (u64, Option<u64>) {
        // Marked seen: `changed` then waits for the next change instead of
        // returning at once for one the publisher has already acted on (an
        // idle publisher confirms its lease on each wake-up).
        let m = self.metrics.borrow_and_update();
        (m.vote.leader_id().term, m.current_leader)
    }

    async fn changed(&mut self) {
        // Once openraft's core stopped (a storage error) nothing changes any
        // more, and the storage watchdog stops the node; this waits rather
        // than let the publisher spin until it does.
        crate::propose::metrics_changed(&mut self.metrics).await;
    }

    async fn confirm_lease(&self) -> bool {
        // Confirmed by a quorum in a check begun less than half an election
        // timeout ago (`Timing::lease_fresh`): no successor can exist yet
        // (followers wait an election timeout after the leader last reached
        // them before they campaign), and a quorum round per batch put a
        // follower's append-and-fsync in front of every batch. G2 does not
        // rest on the lease: the exclusive producer and the tail read do
        // (docs/exactly-once.md, "The stale-producer hazard").
        if self
            .liveness
            .lease_age()
            .is_some_and(|age| age < self.lease_fresh)
        {
            return true;
        }
        let asked = tokio::time::Instant::now();
        let ok = matches!(
            tokio::time::timeout(
                self.lease_timeout,
                self.raft
                    .ensure_linearizable(openraft::raft::ReadPolicy::ReadIndex)
            )
            .await,
            Ok(Ok(_))
        );
        if ok {
            self.liveness.lease_confirmed(asked);
        }
        ok
    }

    async fn read_barrier(&self) -> bool {
        // Never the lease's fast path: it must wait for the apply.
        let barrier = async {
            self.raft
                .ensure_linearizable(openraft::raft::ReadPolicy::ReadIndex)
                .await
                .ok()?;
            // openraft's read index is not enough on its own for a leader
            // it restored at start (a node whose own vote was committed
            // resumes as leader without an election): it is the larger of
            // that leader's first entry, perhaps long ago, and the commit
            // index read from disk, which is not synced on its own and
            // after a power cut lags what was committed and published
            // before it. The tail then held sequences beyond what the
            // outbox had assigned, they counted as foreign, and the
            // publisher sent them again (a power cut of every node in CI:
            // 36 keys twice). Every entry in a leader's log gets
            // committed while it leads, so waiting for all of them to be
            // applied covers whatever any predecessor can have published.
            let last = self.raft.metrics().borrow().last_log_index;
            self.raft
                .wait(None)
                .applied_index_at_least(last, "read barrier")
                .await
                .ok()
        };
        let asked = tokio::time::Instant::now();
        let ok = matches!(
            tokio::time::timeout(self.lease_timeout, barrier).await,
            Ok(Some(_))
        );
        if ok {
            self.liveness.lease_confirmed(asked);
        }
        ok
    }

    fn watermark(&self, topic: String, seq: u64) {
        self.proposer.watermark(topic, seq);
    }

    async fn set_aside(
        &self,
        record: firstseen_store::SetAside,
    ) -> Result<(), crate::publish::Error> {
        self.proposer
            .coalescer
            .append(firstseen_store::Command::SetAside(Box::new(record)))
            .await
            .map_err(crate::publish::Error::SetAside)
    }

    async fn rebase(&self, rebase: firstseen_store::Rebase) -> Result<(), crate::publish::Error> {
        self.proposer
            .coalescer
            .append(firstseen_store::Command::Rebase(Box::new(rebase)))
            .await
            .map_err(|e| Error::raft("commit a rebase", e).into())
    }
}
