//! `[cluster]`: the Raft group, its members, its peer link and timing.
//! Types, defaults and the checks that need nothing but the values (the
//! secret and TLS files are checked by `crate::config`).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::problem::Problems;
pub use crate::tls::config::TlsConfig;

impl UpgradeMode {
    pub fn is_auto(&self) -> bool {
        *self == UpgradeMode::Auto
    }
}

/// Whether the leader raises the level on its own (`cluster.upgrade`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UpgradeMode {
    /// As soon as every member runs a release that has the next level.
    #[default]
    Auto,
    /// Only when an operator says so (`firstseen upgrade`), so that a node
    /// can be taken back to the previous release until then.
    Manual,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// Initial members. Every node starts with the same list; bootstrap is
    /// idempotent. Empty means a group of one made of this node. A node not
    /// in the list starts empty and waits to be added (`firstseen members add`).
    #[serde(default)]
    pub members: Vec<MemberConfig>,
    /// Address the peer protocol (Raft RPC, forwarding) listens on. Required
    /// when there are members. If it names a specific IP, outgoing peer
    /// connections are made from that IP too.
    #[serde(default)]
    pub listen: Option<SocketAddr>,
    /// File holding the cluster secret that peers authenticate each other
    /// with. Required when there are members; the same file on every node.
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
    /// The secrets the cluster had before the current one: messages proven
    /// under them are still its own (a rotation while messages wait
    /// unpublished). Remove them once the outbox has drained.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub previous_secret_files: Vec<PathBuf>,
    /// A snapshot is taken after this many log entries; the log before it is
    /// then purged.
    #[serde(default = "default_snapshot_logs")]
    pub snapshot_logs: u64,
    /// TLS for the peer protocol. Without it, peers authenticate with the
    /// secret but talk in the clear.
    #[serde(default)]
    pub tls: Option<TlsConfig>,
    /// Lets a node whose `listen` is not a loopback address run without
    /// `tls`: peers then authenticate but talk in the clear, and anyone on the
    /// path reads every message. Off by default.
    #[serde(default)]
    pub allow_plaintext: bool,
    /// The round trip between the two members farthest apart, in
    /// milliseconds (what `ping` says between their zones): the distance
    /// the timing below is made for when it is not set.
    /// Left out when written at its default, so that a config written by
    /// this release (the tests' harness does) still reads in a release from
    /// before the setting, as a rolling upgrade needs.
    #[serde(
        default = "default_round_trip_ms",
        skip_serializing_if = "is_default_round_trip"
    )]
    pub round_trip_ms: u64,
    /// How often the leader sends heartbeats, in milliseconds. openraft
    /// also gives a whole AppendEntries (the round trip and the follower's
    /// write) one heartbeat, so it must stay well above `round_trip_ms`.
    /// Unset: [`ClusterConfig::heartbeat_ms`] derives it from the round trip.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_ms: Option<u64>,
    /// Elections: a follower that hears no leader for a random time between
    /// `election_timeout_max_ms` and twice that minus the minimum asks its
    /// peers for a pre-vote, and campaigns only if a majority agrees. The
    /// maximum is also how long a voter that heard from a leader refuses
    /// to vote for another (openraft's leader lease). Unset: four and eight
    /// heartbeats.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub election_timeout_min_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub election_timeout_max_ms: Option<u64>,
    /// When the cluster level rises once every member runs a release that
    /// has the next one: `"auto"` (at once) or `"manual"` (when an operator
    /// runs `firstseen upgrade`; until then a node can go back to the
    /// previous release). See docs/operations.md, "Upgrading".
    // Written only when set: a config a test writes for a release from
    // before levels must not name it (every key is checked there).
    #[serde(default, skip_serializing_if = "UpgradeMode::is_auto")]
    pub upgrade: UpgradeMode,
    /// Whether a leader sends a follower its next append before the
    /// previous one is answered (openraft 0.10's pipelined replication):
    /// one round trip less per commit between zones. Unset: once the
    /// cluster level is 4 ([`firstseen_store::level::PIPELINED`]), when
    /// every member's peer server hands a connection's appends to Raft in
    /// order (`cluster::lane`). `false` keeps it off; `true` turns it on
    /// before that (a member of an older release then refuses appends that
    /// overtook each other, and the leader starts its stream again: safe,
    /// and slow).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline_appends: Option<bool>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            members: Vec::new(),
            listen: None,
            secret_file: None,
            previous_secret_files: Vec::new(),
            snapshot_logs: default_snapshot_logs(),
            tls: None,
            allow_plaintext: false,
            round_trip_ms: default_round_trip_ms(),
            heartbeat_ms: None,
            election_timeout_min_ms: None,
            election_timeout_max_ms: None,
            upgrade: Default::default(),
            pipeline_appends: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MemberConfig {
    pub id: u64,
    pub zone: String,
    /// Peer protocol address (host:port) other nodes reach it at.
    pub addr: String,
    /// HTTP API address (host:port), for operators and the CLI.
    #[serde(default)]
    pub http: String,
}

/// Zones of one region are a few milliseconds apart at most; 20 ms leaves
/// room, and keeps the timing that suits them (100 ms heartbeats).
fn is_default_round_trip(ms: &u64) -> bool {
    *ms == default_round_trip_ms()
}

fn default_round_trip_ms() -> u64 {
    20
}

/// What a heartbeat leaves beside the round trip for the follower's write
/// of an append (an fsync) and the queues on the way.
const WRITE_ALLOWANCE_MS: u64 = 40;

/// The shortest heartbeat derived from the round trip: the timing that
/// suits zones a few milliseconds apart, which failover times were
/// measured with.
const MIN_DERIVED_HEARTBEAT_MS: u64 = 100;

fn default_snapshot_logs() -> u64 {
    20_000
}
impl ClusterConfig {
    /// The heartbeat interval: `heartbeat_ms` if set, else two round trips
    /// and the write allowance, at least 100 ms. openraft cuts every append
    /// at one heartbeat, so it must hold a round trip and the follower's
    /// write; the second round trip covers a reply that waited behind
    /// another append on the link. 20 ms (the default) gives 100 ms, 60 ms
    /// (zones 30 ms apart) 160 ms.
    pub fn heartbeat_ms(&self) -> u64 {
        self.heartbeat_ms.unwrap_or_else(|| {
            (2 * self.round_trip_ms + WRITE_ALLOWANCE_MS).max(MIN_DERIVED_HEARTBEAT_MS)
        })
    }

    /// `election_timeout_min_ms` if set, else four heartbeats.
    pub fn election_timeout_min_ms(&self) -> u64 {
        self.election_timeout_min_ms
            .unwrap_or_else(|| 4 * self.heartbeat_ms())
    }

    /// `election_timeout_max_ms` if set, else eight heartbeats.
    pub fn election_timeout_max_ms(&self) -> u64 {
        self.election_timeout_max_ms
            .unwrap_or_else(|| 8 * self.heartbeat_ms())
    }

    /// Adds every problem of `[cluster]` that needs no file to `p`.
    pub fn check(&self, p: &mut Problems) {
        let mut ids = BTreeSet::new();
        for (i, m) in self.members.iter().enumerate() {
            if !ids.insert(m.id) {
                p.add(
                    format!("cluster.members[{i}].id"),
                    format!("id {} appears twice", m.id),
                );
            }
            if m.addr.parse::<SocketAddr>().is_err() && !m.addr.contains(':') {
                p.add(
                    format!("cluster.members[{i}].addr"),
                    format!("`{}` is not host:port", m.addr),
                );
            }
        }
        if self.snapshot_logs < 10 {
            p.add("cluster.snapshot_logs", "must be at least 10");
        }
        let (heartbeat, min, max) = (
            self.heartbeat_ms(),
            self.election_timeout_min_ms(),
            self.election_timeout_max_ms(),
        );
        if heartbeat < 10 {
            p.add("cluster.heartbeat_ms", "must be at least 10");
        }
        if heartbeat < self.round_trip_ms + WRITE_ALLOWANCE_MS / 2 {
            p.add(
                "cluster.heartbeat_ms",
                format!(
                    "must be at least the round trip (cluster.round_trip_ms, {}) plus {} ms: openraft gives a whole append, there and back with the follower's write, one heartbeat, and cuts it after that; leave it unset to derive it from the round trip",
                    self.round_trip_ms,
                    WRITE_ALLOWANCE_MS / 2
                ),
            );
        }
        if min < 3 * heartbeat {
            p.add(
                "cluster.election_timeout_min_ms",
                format!(
                    "must be at least three heartbeats ({} ms), so that a lost heartbeat or two does not start an election",
                    3 * heartbeat
                ),
            );
        }
        if max <= min {
            p.add(
                "cluster.election_timeout_max_ms",
                format!("must be above cluster.election_timeout_min_ms ({min})"),
            );
        }
        if let Some(listen) = self.listen {
            if !listen.ip().is_loopback() && self.tls.is_none() && !self.allow_plaintext {
                p.add(
                    "cluster.tls",
                    format!(
                        "required because cluster.listen ({listen}) is not a loopback address: without it peer traffic (every message, the Raft log) crosses the network in the clear; set [cluster.tls], or cluster.allow_plaintext = true on a network you trust"
                    ),
                );
            }
        }
        if !self.members.is_empty() {
            if self.listen.is_none() {
                p.add("cluster.listen", "required when cluster.members is set");
            }
            if self.secret_file.is_none() {
                p.add(
                    "cluster.secret_file",
                    "required when cluster.members is set",
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(c: &ClusterConfig) -> Vec<String> {
        let mut p = Problems::default();
        c.check(&mut p);
        p.into_vec().into_iter().map(|p| p.key).collect()
    }

    /// Unset, the timing follows the round trip: the timing of zones a few
    /// milliseconds apart by default, longer for zones far apart; what is
    /// set wins, and a heartbeat that cannot hold a round trip is refused.
    #[test]
    fn the_timing_follows_the_round_trip_unless_set() {
        let mut c = ClusterConfig::default();
        assert_eq!(
            (
                c.heartbeat_ms(),
                c.election_timeout_min_ms(),
                c.election_timeout_max_ms()
            ),
            (100, 400, 800)
        );
        c.round_trip_ms = 60;
        assert_eq!(
            (
                c.heartbeat_ms(),
                c.election_timeout_min_ms(),
                c.election_timeout_max_ms()
            ),
            (160, 640, 1280)
        );
        assert!(problems(&c).is_empty(), "{:?}", problems(&c));
        c.heartbeat_ms = Some(70);
        assert_eq!(c.election_timeout_min_ms(), 280);
        assert_eq!(problems(&c), vec!["cluster.heartbeat_ms".to_string()]);
        c.heartbeat_ms = Some(100);
        c.election_timeout_min_ms = Some(500);
        c.election_timeout_max_ms = Some(450);
        assert_eq!(
            problems(&c),
            vec!["cluster.election_timeout_max_ms".to_string()]
        );
    }
}
