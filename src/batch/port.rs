//! What the batcher needs of the world, as traits: the group that commits
//! its batches, and the upstream sessions its acks go to.
//!
//! The node plugs in the [`Proposer`] and its [`AckGate`]s;
//! `tests/simulate_ack.rs` plugs in models of a Raft group and of an MQTT
//! broker's persistent session, and checks on every ack that what it acks
//! is committed (G4).

use std::sync::Arc;
use std::time::Duration;

use firstseen_raft::NodeId;
use firstseen_store::{Batch, Outcome};
use futures::future::BoxFuture;

use crate::ingest::ack::{AckGate, AckStats, AckToken};
use crate::propose::{ProposeError, Proposer};

/// The group, as the batcher sees it.
pub trait Commit: Send + Sync {
    /// Commits `batch` as one entry; returns once it is committed, with one
    /// outcome per observation. An error means it may or may not be: the
    /// batcher proposes it again (copies come back as duplicates).
    fn propose(&self, batch: Batch) -> BoxFuture<'_, Result<Vec<Outcome>, ProposeError>>;

    /// The leader this node knows.
    fn leader(&self) -> Option<NodeId>;

    /// Returns once the leader is no longer `from` (or, for `None`, once some
    /// leader is known, giving up after `limit`): when a retry is worth it
    /// before its backoff ends.
    fn leader_moves(&self, from: Option<NodeId>, limit: Duration) -> BoxFuture<'_, ()>;
}

/// The upstream sessions, as the batcher's acks see them.
pub trait Acks: Send + Sync {
    /// How many upstreams there are; tokens name them by index.
    fn upstreams(&self) -> usize;

    /// Acks `tokens` (all of upstream `upstream`) in order.
    fn ack(&self, upstream: usize, tokens: &[AckToken]) -> AckStats;
}

impl Commit for Proposer {
    fn propose(&self, batch: Batch) -> BoxFuture<'_, Result<Vec<Outcome>, ProposeError>> {
        Box::pin(Proposer::propose(self, batch))
    }

    fn leader(&self) -> Option<NodeId> {
        Proposer::leader(self).0
    }

    fn leader_moves(&self, from: Option<NodeId>, limit: Duration) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            match from {
                Some(l) => {
                    let mut rx = self.raft.metrics();
                    while rx.borrow_and_update().current_leader == Some(l) {
                        crate::propose::metrics_changed(&mut rx).await;
                    }
                }
                None => self.wait_for_leader(limit).await,
            }
        })
    }
}

impl Acks for Vec<Arc<AckGate>> {
    fn upstreams(&self) -> usize {
        self.len()
    }

    fn ack(&self, upstream: usize, tokens: &[AckToken]) -> AckStats {
        self.get(upstream)
            .map(|gate| gate.ack(tokens))
            .unwrap_or_default()
    }
}
