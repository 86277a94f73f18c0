//! Proposing: the one door to the Raft log.
//!
//! Everything the node appends goes through here: a batch of observations
//! from the batcher ([`Proposer::propose`]), a batch a follower forwarded
//! (served by the peer listener through [`crate::cluster::answer::Forwarded`]),
//! and the publisher's receipts ([`Proposer::watermark`]). On the leader the
//! [`coalesce`] task merges what waits into one entry and stamps it; a
//! follower forwards its batch to the leader and waits for the commit there.
//!
//! - [`clocks`]: the pure rule for the leader's stamp inputs (which clock
//!   readings count);
//! - [`coalesce`]: the leader's merging task, with its pure grouping rule.
//! - [`level`]: the leader raises the cluster level once every member's
//!   release has the next one.
//! - [`spacing`]: the pure rule for how many proposals may be in flight (the
//!   batcher's batches, the coalescer's entries).

pub mod clocks;
pub mod coalesce;
pub mod level;
pub mod slim;
pub mod spacing;

use std::sync::Arc;
use std::time::Duration;

use firstseen_raft::{NodeId, Raft};
use firstseen_store::{Batch, Outcome};
use futures::future::BoxFuture;

use crate::cluster::peers::{self, Call};
use crate::cluster::wire::{ForwardError, Reply, Request};

/// How long a follower waits for the leader to commit a forwarded batch,
/// unless the leader changes or the connection drops first (both end the
/// wait at once).
const FORWARD_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a batch was not committed.
#[derive(Debug, thiserror::Error)]
pub enum ProposeError {
    #[error("no leader elected yet")]
    NoLeader,
    /// The leader changed while the batch was on its way: it is sent to the
    /// new one at once (repeating it is safe, copies come back duplicates).
    #[error("leader {from} was replaced while the batch was in flight")]
    LeaderChanged { from: NodeId },
    #[error("leader {leader} has no peer address")]
    NoAddress { leader: NodeId },
    #[error("forward to leader {leader}: {source}")]
    Forward {
        leader: NodeId,
        source: peers::CallError,
    },
    #[error("leader {leader}: {source}")]
    Leader {
        leader: NodeId,
        source: ForwardError,
    },
    #[error("leader {leader}: reply of the wrong kind")]
    WrongReply { leader: NodeId },
}

/// What the propose stage works with: the group, this node's wall clock,
/// the peers it forwards to, and the disk that holds proposals back.
pub struct Links {
    pub raft: Raft,
    pub state: firstseen_store::StateStore,
    /// The Raft log, read for the window's time when the applied state is
    /// behind it.
    pub log: firstseen_raft::LogStore,
    pub clock: crate::clock::SharedClock,
    pub call: Arc<dyn Call>,
    pub disk: Arc<crate::diskspace::DiskSpace>,
}

/// The propose stage, running.
pub struct Proposing {
    /// The door every proposal goes through.
    pub proposer: Proposer,
    /// The cluster level's gate (`level`): the status and the admin API
    /// hold it.
    pub level_gate: level::LevelGate,
    /// The leader's coalescer: stops last, after everything that proposes.
    pub coalescer: BoxFuture<'static, ()>,
    /// Raises the level when every member can run the next one.
    pub levels: BoxFuture<'static, ()>,
}

/// What the propose stage takes from the config. It has no section of its
/// own: `node::core` gathers these from three.
pub struct Settings {
    /// This node (`node.id`).
    pub me: NodeId,
    /// `[dedup]`'s window ([`crate::dedup::DedupConfig::window`]), stamped
    /// into every entry the coalescer appends, which is where the store's
    /// apply reads it.
    pub window: firstseen_store::Window,
    /// Bounds a merged entry like a batch (`batch.max_bytes`).
    pub max_entry_bytes: usize,
    /// `cluster.upgrade`: whether the level gate raises the level.
    pub upgrade: crate::cluster::config::UpgradeMode,
}

/// Builds the propose stage. `coalescer_stop` ends the coalescer,
/// `services_stop` the level gate.
pub fn build(
    settings: Settings,
    links: Links,
    coalescer_stop: tokio_util::sync::CancellationToken,
    services_stop: tokio_util::sync::CancellationToken,
) -> Proposing {
    let (coalescer, coalescing) = coalesce::Coalescer::new(
        links.raft.clone(),
        links.state.clone(),
        coalesce::Settings {
            window: settings.window,
            max_bytes: settings.max_entry_bytes,
            clock: links.clock.clone(),
            log: links.log,
        },
        links.disk,
        coalescer_stop,
    );
    let level_gate = level::LevelGate::new(
        links.raft.clone(),
        settings.me,
        links.call.clone(),
        links.state.clone(),
        coalescer.clone(),
        settings.upgrade,
    );
    let levels = level_gate.clone().run(services_stop);
    let proposer = Proposer {
        raft: links.raft,
        node_id: settings.me,
        peers: links.call,
        coalescer,
        clock: links.clock,
        level: links.state.level_cell(),
    };
    Proposing {
        proposer,
        level_gate,
        coalescer: Box::pin(coalescing),
        levels: Box::pin(levels),
    }
}

/// Proposes observation batches to the group.
#[derive(Clone)]
pub struct Proposer {
    pub raft: Raft,
    pub node_id: NodeId,
    /// The peer network, for forwards to the leader.
    pub peers: Arc<dyn Call>,
    /// Merges batches into entries on the leader; it stamps the window.
    pub coalescer: coalesce::Coalescer,
    /// This node's wall clock: each forward carries a reading of it.
    pub clock: crate::clock::SharedClock,
    /// The applied cluster level: it says how a forward is written. Not
    /// the state itself: a forward in flight must not keep the storage open.
    pub level: firstseen_store::level::LevelCell,
}

/// Sets this node's clock reading on its observations in a batch about to
/// be forwarded.
///
/// Why: the leader takes a follower's newest reading as evidence of that
/// clock now, for [`clocks::FRESH`] after it arrives. A reading taken at
/// receipt can be minutes old on arrival: the batch waited in the ingest
/// queue, out a cut, or in the batcher's retries. A node whose clock was a
/// day ahead while its batches queued would then still count as a day
/// ahead after its clock was right again, and with one more wrong clock in
/// that time the two would outvote the right one and move the window. Read
/// at each forward, a reading is at most the forward's timeout old on
/// arrival. `received_ms` has no other reader: the window is stamped by the
/// leader.
pub fn restamp(batch: &mut Batch, node: NodeId, now_ms: u64) {
    for o in batch.observations.iter_mut().filter(|o| o.node == node) {
        o.received_ms = now_ms;
    }
}

/// Waits until the leader is no longer `leader`. Never returns once Raft
/// has stopped: its last metrics still name the leader, and returning made
/// every caller retry at once, forever (see [`metrics_changed`]).
async fn leader_changes(raft: &Raft, leader: NodeId) {
    let mut rx = raft.metrics();
    while rx.borrow_and_update().current_leader == Some(leader) {
        metrics_changed(&mut rx).await;
    }
}

/// Waits for Raft's metrics to change; forever, once Raft has stopped.
///
/// Why not return then: the batcher retries a batch at once when the leader
/// changed, and sooner than its backoff when a leader moves. A node whose
/// Raft stopped (a fatal storage error; the storage watchdog then stops the
/// node) answered both at once, forever, so its batcher spun on one batch at
/// full speed and logged "leader changed" two million times a minute (the
/// whole-cluster simulation found it). Waiting leaves each caller to its
/// other branch: the forward's own timeout, the backoff, the limit.
pub async fn metrics_changed<T: Send + Sync>(rx: &mut tokio::sync::watch::Receiver<T>) {
    if rx.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

impl Proposer {
    /// The leader this node knows, and its peer address.
    pub fn leader(&self) -> (Option<NodeId>, Option<String>) {
        let m = self.raft.metrics();
        let m = m.borrow();
        let leader = m.current_leader;
        let addr = leader.and_then(|l| {
            m.membership_config
                .nodes()
                .find(|(id, _)| **id == l)
                .map(|(_, n)| n.addr.clone())
        });
        (leader, addr)
    }

    /// Commits one batch as one entry and returns once it is committed, with
    /// one outcome per observation. On a follower the batch is forwarded to
    /// the leader, whose reply also comes only after commit (G4). A forward
    /// in flight ends at once when the leader changes or its connection
    /// drops, so that no timeout stands between an election and the next
    /// commit.
    pub async fn propose(&self, batch: Batch) -> Result<Vec<Outcome>, ProposeError> {
        let (leader, addr) = self.leader();
        match leader {
            None => Err(ProposeError::NoLeader),
            Some(l) if l == self.node_id => self
                .commit_here(batch)
                .await
                .map_err(|source| ProposeError::Leader { leader: l, source }),
            Some(l) => {
                let addr = addr
                    .filter(|a| !a.is_empty())
                    .ok_or(ProposeError::NoAddress { leader: l })?;
                let mut batch = batch;
                restamp(&mut batch, self.node_id, self.clock.now_ms());
                // From level 2 every member reads the kinds; below it the
                // leader may be of a release from before them.
                let request = if self.level.get() >= firstseen_store::level::KINDS {
                    let kinds = (0..batch.len()).map(|i| batch.kind(i)).collect();
                    Request::ForwardKinds { batch, kinds }
                } else {
                    Request::Forward(batch)
                };
                let call = self.peers.call(l, &addr, &request, FORWARD_TIMEOUT);
                let sent = std::time::Instant::now();
                tokio::select! {
                    r = call => match r {
                        Ok(Reply::Forward(Ok(outcomes))) => {
                            metrics::histogram!("firstseen_commit_leg_seconds", "leg" => "forward")
                                .record(sent.elapsed().as_secs_f64());
                            Ok(outcomes)
                        }
                        Ok(Reply::Forward(Err(source))) => Err(ProposeError::Leader { leader: l, source }),
                        Ok(_) => Err(ProposeError::WrongReply { leader: l }),
                        Err(source) => Err(ProposeError::Forward { leader: l, source }),
                    },
                    _ = leader_changes(&self.raft, l) => Err(ProposeError::LeaderChanged { from: l }),
                }
            }
        }
    }

    /// Commits a batch on this node, which must be the leader, possibly in
    /// one entry with other batches waiting at the same time.
    pub async fn commit_here(&self, batch: Batch) -> Result<Vec<Outcome>, ForwardError> {
        self.coalescer.commit(batch).await
    }

    /// Appends the publisher's receipt for `topic` up to `seq`, without
    /// waiting for its commit.
    pub fn watermark(&self, topic: String, seq: u64) {
        self.coalescer.watermark(topic, seq);
    }

    /// Waits (at most `limit`) until some leader is known.
    pub async fn wait_for_leader(&self, limit: Duration) {
        let mut rx = self.raft.metrics();
        let _ = tokio::time::timeout(limit, async {
            while rx.borrow_and_update().current_leader.is_none() {
                metrics_changed(&mut rx).await;
            }
        })
        .await;
    }
}

impl crate::cluster::answer::Forwarded for Proposer {
    fn commit(&self, batch: Batch) -> BoxFuture<'_, Result<Vec<Outcome>, ForwardError>> {
        Box::pin(self.commit_here(batch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use firstseen_store::Observation;

    /// An observation that only says who received it and when.
    pub(crate) fn seen(node: NodeId, received_ms: u64) -> Observation {
        Observation {
            key: [0; 32],
            mqtt_topic: "t".into(),
            pulsar_topic: "p".into(),
            payload: vec![],
            qos: 1,
            retain: false,
            node,
            received_ms,
        }
    }

    #[test]
    fn a_forward_carries_the_clock_now_not_at_receipt() {
        let mut batch = Batch::default();
        batch.push(seen(2, 1_000), None);
        batch.push(seen(2, 1_500), None);
        restamp(&mut batch, 2, 90_000);
        let readings: Vec<u64> = batch.observations.iter().map(|o| o.received_ms).collect();
        assert_eq!(readings, vec![90_000, 90_000]);
        // Another node's reading is that node's evidence, not this one's.
        let mut batch = Batch::default();
        batch.push(seen(3, 1_000), None);
        restamp(&mut batch, 2, 90_000);
        assert_eq!(batch.observations[0].received_ms, 1_000);
    }
}
