//! What a node says of itself: `/status` (one type for the server and the
//! `firstseen status` client) and `/readyz`, with the reason it is not
//! ready.

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::AppState;

/// What `GET /status` answers, and what `firstseen status` reads back: one
/// type for the server and the CLI. Fields a node of another version leaves
/// out read as their defaults.
#[derive(Serialize, Deserialize, Debug, Default)]
#[serde(default)]
pub struct Status {
    pub node: u64,
    pub zone: String,
    /// The leader this node can vouch for: itself if a quorum confirmed its
    /// leadership recently, the leader it hears from if it heard recently,
    /// otherwise none.
    pub leader: Option<u64>,
    /// The leader openraft last knew of, even if this node cannot vouch for
    /// it now.
    pub known_leader: Option<u64>,
    /// True only while this node leads and a quorum confirmed it recently.
    pub is_leader: bool,
    /// `leader`, `leader_unconfirmed` (leads in its own eyes, but no quorum
    /// confirmed it recently: cut off, or the others moved on), `follower`,
    /// `follower_without_leader`, `candidate`, `learner` or `shutdown`.
    pub role: String,
    /// Since the last accepted append from a leader, in milliseconds.
    pub leader_contact_ms: Option<u64>,
    /// Since this node, as leader, began the last check in which a quorum
    /// confirmed it.
    pub lease_confirmed_ms: Option<u64>,
    pub term: u64,
    pub last_applied: Option<u64>,
    pub members: Vec<MemberStatus>,
    pub upstreams: Vec<UpstreamView>,
    pub totals: firstseen_store::Totals,
    pub topics: Vec<TopicView>,
    pub coverage: Vec<CoverageView>,
    /// Both databases: the state and the Raft log.
    pub disk_bytes: u64,
    /// The state machine's database alone: what the window costs.
    pub state_disk_bytes: u64,
    /// Free space on the data directory's filesystem, against the reserve.
    pub disk: DiskView,
    pub ready: bool,
    pub not_ready_reason: Option<String>,
    /// How long the group's published watermark has stood still while
    /// messages wait in the outbox; none while it moves or nothing waits.
    /// On the leader, past `publish::stall::STALL_AFTER` it is not ready.
    pub publishing_stalled_ms: Option<u64>,
    /// This node's wall clock when it answered, in ms since the epoch.
    /// Beside `totals.clock_ms` (the window clock) it shows how far the
    /// window clock is behind this node's clock: it never runs ahead of
    /// real time, so it falls behind after whole-cluster outages
    /// (docs/architecture.md, "The window clock").
    pub clock_ms: u64,
    /// The last warnings and errors this node logged, newest first.
    pub recent_errors: Vec<crate::telemetry::LoggedEvent>,
    /// The cluster level, this node's release, and on the leader each
    /// member's release and why the level does not rise yet.
    pub level: crate::propose::level::LevelView,
}

#[derive(Serialize, Deserialize, Debug, Default)]
#[serde(default)]
pub struct DiskView {
    pub free_bytes: u64,
    pub reserve_bytes: u64,
    /// True while free space is below the reserve: nothing is written, acks
    /// are held.
    pub low: bool,
}

#[derive(Serialize, Deserialize, Debug, Default, Clone)]
#[serde(default)]
pub struct MemberStatus {
    pub id: u64,
    pub zone: String,
    pub addr: String,
    pub http: String,
    /// Voter, or learner still catching up.
    pub voter: bool,
    /// Since the last peer frame exchanged with this member, in
    /// milliseconds (none for this node itself, or never).
    pub last_contact_ms: Option<u64>,
    /// On the leader: the last log index replicated to this member.
    pub matched_index: Option<u64>,
    /// On the leader: entries this member is behind the leader's log.
    pub lag: Option<u64>,
}

#[derive(Serialize, Deserialize, Debug, Default)]
#[serde(default)]
pub struct UpstreamView {
    pub name: String,
    pub connected: bool,
    pub received: u64,
    pub last_error: Option<String>,
}

#[derive(Serialize, Deserialize, Debug, Default)]
#[serde(default)]
pub struct TopicView {
    pub topic: String,
    pub last_seq: u64,
    pub published_seq: u64,
    pub backlog: u64,
}

#[derive(Serialize, Deserialize, Debug, Default)]
#[serde(default)]
pub struct CoverageView {
    pub node: u64,
    pub zone: String,
    pub seen: u64,
    pub first: u64,
    /// Share of the window's keys this node delivered.
    pub seen_ratio: f64,
    /// Share of the window's keys this node delivered first.
    pub first_ratio: f64,
}

impl AppState {
    /// A consistent-enough picture of this node for status and tests.
    pub fn status(&self) -> Result<Status, crate::Error> {
        let m = self.raft.metrics().borrow().clone();
        let totals = self.state.totals()?;
        let ready = self.ready();
        let state_disk = self.state.size_on_disk().unwrap_or(0);
        let window = totals.window_keys.max(1) as f64;
        let voters: Vec<u64> = m.membership_config.membership().voter_ids().collect();
        let contacts = self.liveness.peer_ages();
        let last_index = m.last_log_index;
        let members: Vec<MemberStatus> = m
            .membership_config
            .nodes()
            .map(|(id, n)| {
                let matched = m
                    .replication
                    .as_ref()
                    .and_then(|r| r.get(id).cloned())
                    .map(|l| l.map_or(0, |l| l.index));
                MemberStatus {
                    id: *id,
                    zone: n.zone.clone(),
                    addr: n.addr.clone(),
                    http: n.http.clone(),
                    voter: voters.contains(id),
                    last_contact_ms: contacts.get(id).map(|d| d.as_millis() as u64),
                    matched_index: matched,
                    lag: matched.map(|i| last_index.unwrap_or(0).saturating_sub(i)),
                }
            })
            .collect();
        let (role, trusted) = self.role(&m);
        let zone_of = |node: u64| {
            members
                .iter()
                .find(|m| m.id == node)
                .map(|m| m.zone.clone())
                .unwrap_or_else(|| "(removed)".into())
        };
        Ok(Status {
            node: self.node_id,
            zone: self.zone.clone(),
            clock_ms: crate::now_ms(),
            publishing_stalled_ms: self.publishing_stalled().map(|d| d.as_millis() as u64),
            leader: trusted,
            known_leader: m.current_leader,
            is_leader: role == "leader",
            role: role.to_string(),
            leader_contact_ms: self
                .liveness
                .leader_contact_age()
                .map(|d| d.as_millis() as u64),
            lease_confirmed_ms: self.liveness.lease_age().map(|d| d.as_millis() as u64),
            term: m.current_term,
            last_applied: m.last_applied.map(|l| l.index),
            members: Vec::new(),
            upstreams: self
                .upstreams
                .iter()
                .map(|(name, s)| UpstreamView {
                    name: name.clone(),
                    connected: s.connected.load(Ordering::Relaxed),
                    received: s.received.load(Ordering::Relaxed),
                    last_error: firstseen_store::lock::lock(&s.last_error).clone(),
                })
                .collect(),
            totals,
            topics: self
                .state
                .topics()?
                .into_iter()
                .map(|(topic, t)| TopicView {
                    topic,
                    last_seq: t.last_seq,
                    published_seq: t.published_seq,
                    backlog: t.last_seq - t.published_seq.min(t.last_seq),
                })
                .collect(),
            coverage: self
                .state
                .coverage()?
                .into_iter()
                .map(|(node, c)| CoverageView {
                    node,
                    zone: zone_of(node),
                    seen: c.seen,
                    first: c.first,
                    seen_ratio: c.seen as f64 / window,
                    first_ratio: c.first as f64 / window,
                })
                .collect(),
            disk_bytes: state_disk + self.log_db.size_on_disk().unwrap_or(0),
            state_disk_bytes: state_disk,
            disk: DiskView {
                free_bytes: self.disk.free(),
                reserve_bytes: self.disk.reserve(),
                low: self.disk.is_low(),
            },
            ready: ready.is_ok(),
            not_ready_reason: ready.err().map(|e| e.to_string()),
            recent_errors: crate::telemetry::recent_events(),
            level: self.levels.view(),
        })
        .map(|mut s: Status| {
            s.members = members;
            s
        })
    }

    /// What this node can vouch for about its role, and the leader it
    /// trusts (see [`Status::role`]).
    fn role(
        &self,
        m: &openraft::RaftMetrics<firstseen_raft::TypeConfig>,
    ) -> (&'static str, Option<u64>) {
        use openraft::ServerState;
        let stale = self.timing.stale();
        let fresh = |age: Option<Duration>| age.is_some_and(|a| a <= stale);
        match m.state {
            ServerState::Leader if fresh(self.liveness.lease_age()) => {
                ("leader", Some(self.node_id))
            }
            ServerState::Leader => ("leader_unconfirmed", None),
            ServerState::Follower
                if m.current_leader.is_some() && fresh(self.liveness.leader_contact_age()) =>
            {
                ("follower", m.current_leader)
            }
            ServerState::Follower => ("follower_without_leader", None),
            ServerState::Candidate => ("candidate", None),
            ServerState::Learner if fresh(self.liveness.leader_contact_age()) => {
                ("learner", m.current_leader)
            }
            ServerState::Learner => ("learner", None),
            ServerState::Shutdown => ("shutdown", None),
        }
    }

    fn publishing_stalled(&self) -> Option<Duration> {
        firstseen_store::lock::lock(&self.publishing).stalled(tokio::time::Instant::now())
    }

    pub fn ready(&self) -> Result<(), NotReady> {
        let m = self.raft.metrics().borrow().clone();
        if m.current_leader.is_none() {
            return Err(NotReady::NoLeader);
        }
        match self.role(&m) {
            ("leader_unconfirmed", _) => {
                return Err(NotReady::LeaderUnconfirmed {
                    term: m.current_term,
                    for_ms: self.liveness.lease_age().map_or(0, |d| d.as_millis()),
                })
            }
            ("follower_without_leader", _) | ("candidate", _) => {
                return Err(NotReady::NoLeaderContact {
                    for_ms: self
                        .liveness
                        .leader_contact_age()
                        .unwrap_or_else(|| self.liveness.uptime())
                        .as_millis(),
                })
            }
            _ => {}
        }
        if let Some(reason) = self.disk.reason() {
            return Err(NotReady::DiskLow(reason));
        }
        if let Some((topic, found)) = self.superseded.all().into_iter().next() {
            return Err(NotReady::Superseded {
                topic,
                ours: found.ours,
                newer: found.newer,
            });
        }
        if let ("leader", _) = self.role(&m) {
            if let Some(stalled) = self
                .publishing_stalled()
                .filter(|d| *d >= crate::publish::stall::STALL_AFTER)
            {
                return Err(NotReady::PublishingStalled {
                    secs: stalled.as_secs(),
                });
            }
        }
        for (name, s) in &self.upstreams {
            if !s.connected.load(Ordering::Relaxed) {
                return Err(NotReady::UpstreamDown(name.clone()));
            }
        }
        Ok(())
    }
}

/// Why a node answers `/readyz` with 503 (also `not_ready_reason` in
/// `/status`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotReady {
    #[error("no Raft leader known")]
    NoLeader,
    #[error("leader of term {term} in its own eyes, but no quorum confirmed it for {for_ms} ms")]
    LeaderUnconfirmed { term: u64, for_ms: u128 },
    #[error("no contact with a leader for {for_ms} ms")]
    NoLeaderContact { for_ms: u128 },
    /// Free space below `node.disk_reserve_bytes`; the text says how much.
    #[error("{0}")]
    DiskLow(String),
    #[error("publishing has made no progress for {secs} s with messages waiting in the outbox")]
    PublishingStalled { secs: u64 },
    #[error("upstream {0} is not connected")]
    UpstreamDown(String),
    /// The publisher gave a topic up for good (`publish::tail::Superseded`).
    #[error("topic {topic} holds messages of generation {} of this cluster, newer than its own {}: a cluster recovered from this one publishes there, and this one never will again (the newer cluster is the one that lives: stop this one for good)", firstseen_raft::recover::shown(*.newer), firstseen_raft::recover::shown(*.ours))]
    Superseded {
        topic: String,
        ours: u64,
        newer: u64,
    },
}
