//! What this node knows of who is alive, from the traffic it sees, and the
//! Raft timing it judges that by.
//!
//! - the last time a leader's append reached this node and was accepted
//!   (a follower's evidence that the leader lives);
//! - the last time this node, as leader, confirmed its leadership with a
//!   quorum (a leader's evidence that it still leads);
//! - the last frame exchanged with each peer, for `/status`.
//!
//! It also holds whether this node may take part in elections at all: not
//! while it rejoins with an empty log after its damaged one was set aside
//! (`firstseen_raft::rejoin`).
//!
//! The election driver ([`super::elect`]), readiness and `/status` all read
//! it; the peer server, the peer client, the lease watch and the publisher
//! write it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use firstseen_raft::NodeId;
// tokio's clock: the same as std's in a node, and the simulated one in the
// whole-cluster simulation, where elections must see simulated silence.
use tokio::time::Instant;

/// Raft timing, from `cluster.heartbeat_ms` and `cluster.election_timeout_*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    pub heartbeat: Duration,
    pub election_min: Duration,
    pub election_max: Duration,
}

impl Timing {
    /// How long a voter that heard from a leader refuses to vote for anyone
    /// else: openraft's leader lease, which is `election_max`.
    pub fn lease(&self) -> Duration {
        self.election_max
    }

    /// How long a quorum confirmation may take before the leader counts it
    /// as failed: less than the lease, so that a leader cut off from its
    /// peers lets go before the others can have elected a successor.
    pub fn confirm_timeout(&self) -> Duration {
        self.election_min
    }

    /// A quorum confirmation younger than this stands for a new one: the
    /// publisher asks for none (`publish::adapter`, `lease_fresh`). Its age
    /// counts from when the check began ([`Liveness::lease_confirmed`]), and
    /// every follower that vouched did so after that; none campaigns before
    /// an election timeout without hearing from the leader. So half of
    /// `election_min` (at least one and a half heartbeats, since
    /// `election_min` is at least three) leaves the other half for clocks
    /// that run at different rates. It used to be one heartbeat counted
    /// from the answer, which let a slow round stretch it.
    pub fn lease_fresh(&self) -> Duration {
        self.election_min / 2
    }

    /// How often the lease watch confirms the leadership, so that a
    /// healthy leader always holds a fresh confirmation and no publish batch
    /// pays a round trip for one: a round that takes up to the freshness
    /// minus this period still lands before the last one goes stale. Half
    /// the freshness, and never so long that this margin falls below a
    /// heartbeat, which every accepted timing fits a round into (with
    /// `election_min` at three heartbeats half would leave three quarters of
    /// one). When the watch ran every half `election_min` against a
    /// freshness of one heartbeat, about half of the batches asked a quorum
    /// first.
    pub fn lease_watch(&self) -> Duration {
        (self.lease_fresh() / 2).min(self.lease_fresh().saturating_sub(self.heartbeat))
    }

    /// Evidence older than this means the node cannot vouch for its role:
    /// it says so on `/readyz` and `/status`.
    pub fn stale(&self) -> Duration {
        self.election_max * 2
    }
}

/// Never happened.
const NEVER: u64 = u64::MAX;

/// Shared evidence of liveness.
#[derive(Debug)]
pub struct Liveness {
    started: Instant,
    /// Milliseconds after `started`, or [`NEVER`].
    leader_contact: AtomicU64,
    lease_confirmed: AtomicU64,
    /// Microseconds, or [`NEVER`].
    quorum_round_us: AtomicU64,
    peers: Mutex<BTreeMap<NodeId, Instant>>,
    /// Refusing every vote and pre-vote, and not campaigning.
    abstaining: AtomicBool,
}

impl Default for Liveness {
    fn default() -> Self {
        Self::new()
    }
}

impl Liveness {
    pub fn new() -> Self {
        Self {
            started: Instant::now(),
            leader_contact: AtomicU64::new(NEVER),
            lease_confirmed: AtomicU64::new(NEVER),
            quorum_round_us: AtomicU64::new(NEVER),
            peers: Mutex::new(BTreeMap::new()),
            abstaining: AtomicBool::new(false),
        }
    }

    fn now(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn age(&self, at: &AtomicU64) -> Option<Duration> {
        match at.load(Ordering::Acquire) {
            NEVER => None,
            t => Some(Duration::from_millis(self.now().saturating_sub(t))),
        }
    }

    /// A leader's append was accepted here.
    pub fn leader_contact(&self) {
        self.leader_contact.store(self.now(), Ordering::Release);
    }

    /// Since the last accepted append from a leader, if any.
    pub fn leader_contact_age(&self) -> Option<Duration> {
        self.age(&self.leader_contact)
    }

    /// This node, as leader, confirmed its leadership with a quorum, in a
    /// check that began at `asked`. The lease runs from then, not from the
    /// answer: every vote that confirmed it was given after `asked`, but a
    /// slow round (a follower's fsync, a lost packet resent) could otherwise
    /// stretch the lease past what the quorum vouched for by as long as the
    /// round took. A check that began earlier and ended later never moves
    /// it back.
    pub fn lease_confirmed(&self, asked: Instant) {
        let at = asked.saturating_duration_since(self.started).as_millis() as u64;
        let _ = self
            .lease_confirmed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |was| match was {
                NEVER => Some(at),
                was => Some(was.max(at)),
            });
    }

    /// Since the last quorum confirmation, if any.
    pub fn lease_age(&self) -> Option<Duration> {
        self.age(&self.lease_confirmed)
    }

    /// A quorum confirmation asked by the lease watch took `took`: the
    /// round trip to the nearer follower and its answer, the distance the
    /// group actually runs at (`firstseen_raft_quorum_round_seconds`).
    pub fn quorum_round(&self, took: Duration) {
        self.quorum_round_us
            .store(took.as_micros() as u64, Ordering::Release);
        metrics::gauge!("firstseen_raft_quorum_round_seconds").set(took.as_secs_f64());
    }

    /// The last quorum round the lease watch measured, if any.
    pub fn last_quorum_round(&self) -> Option<Duration> {
        match self.quorum_round_us.load(Ordering::Acquire) {
            NEVER => None,
            us => Some(Duration::from_micros(us)),
        }
    }

    /// From now on this node refuses every vote and pre-vote and does not
    /// campaign: its log was set aside and it has not caught up yet.
    pub fn abstain(&self) {
        self.abstaining.store(true, Ordering::Release);
        metrics::gauge!("firstseen_raft_abstaining").set(1.0);
    }

    /// The node caught up after rejoining: it votes and campaigns again.
    pub fn resume_voting(&self) {
        self.abstaining.store(false, Ordering::Release);
        metrics::gauge!("firstseen_raft_abstaining").set(0.0);
    }

    /// Whether this node abstains from elections (see [`Liveness::abstain`]).
    pub fn abstaining(&self) -> bool {
        self.abstaining.load(Ordering::Acquire)
    }

    /// Since this process started.
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// A frame from (or a reply by) `peer` arrived.
    pub fn peer_seen(&self, peer: NodeId) {
        firstseen_store::lock::lock(&self.peers).insert(peer, Instant::now());
    }

    /// Since the last frame exchanged with each peer.
    pub fn peer_ages(&self) -> BTreeMap<NodeId, Duration> {
        firstseen_store::lock::lock(&self.peers)
            .iter()
            .map(|(id, at)| (*id, at.elapsed()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_are_none_until_something_happened() {
        let l = Liveness::new();
        assert!(l.leader_contact_age().is_none());
        assert!(l.lease_age().is_none());
        l.leader_contact();
        l.lease_confirmed(Instant::now());
        l.peer_seen(3);
        assert!(l.leader_contact_age().unwrap() < Duration::from_secs(1));
        assert!(l.lease_age().unwrap() < Duration::from_secs(1));
        assert!(l.peer_ages().contains_key(&3));
        let t = Timing {
            heartbeat: Duration::from_millis(100),
            election_min: Duration::from_millis(400),
            election_max: Duration::from_millis(800),
        };
        assert!(t.confirm_timeout() < t.lease());
        assert!(t.lease() < t.stale());
        assert!(t.lease_watch() < t.lease_fresh());
        assert!(t.lease_fresh() >= t.heartbeat && t.lease_fresh() * 2 <= t.election_min);
        // Every timing the config accepts (election_min at least three
        // heartbeats): a round of up to a heartbeat keeps the lease fresh.
        for (heartbeat, min) in [(100, 300), (100, 400), (20, 60), (160, 1000)] {
            let t = Timing {
                heartbeat: Duration::from_millis(heartbeat),
                election_min: Duration::from_millis(min),
                election_max: Duration::from_millis(2 * min),
            };
            assert!(t.lease_watch() > Duration::ZERO, "{t:?}");
            assert!(t.lease_fresh() - t.lease_watch() >= t.heartbeat, "{t:?}");
        }
        assert!(l.last_quorum_round().is_none());
        l.quorum_round(Duration::from_millis(61));
        assert_eq!(l.last_quorum_round(), Some(Duration::from_millis(61)));
    }

    /// The lease runs from when the confirming check began: a round that
    /// took 80 ms leaves a lease already 80 ms old, and an older check
    /// answering later does not make it older again.
    #[tokio::test(start_paused = true)]
    async fn a_lease_runs_from_when_its_check_began() {
        let l = Liveness::new();
        let asked = Instant::now();
        tokio::time::advance(Duration::from_millis(80)).await;
        l.lease_confirmed(asked);
        assert_eq!(l.lease_age(), Some(Duration::from_millis(80)));
        let later = Instant::now();
        tokio::time::advance(Duration::from_millis(20)).await;
        l.lease_confirmed(later);
        l.lease_confirmed(asked);
        assert_eq!(l.lease_age(), Some(Duration::from_millis(20)));
    }
}
