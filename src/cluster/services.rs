//! The group's running services, built from `[cluster]`: what the peer
//! listener serves, the elections and the lease watch. Opening the group
//! itself is [`super::Group::open`]; these run on the group once open.

use std::sync::Arc;

use firstseen_raft::Raft;
use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::answer::{Forwarded, PeerService};
use super::config::ClusterConfig;
use super::liveness::Liveness;
use super::peers::Call;
use super::{elect, timing};
use crate::context::NodeCx;
use crate::secret::ClusterKey;
use crate::tls::PeerTls;

/// What the services work with: the opened group and the node's parts.
pub struct Links {
    pub raft: Raft,
    pub key: ClusterKey,
    /// Commits the batches followers forward while this node leads (the
    /// node's proposer).
    pub forwarded: Arc<dyn Forwarded>,
    pub tls: Option<PeerTls>,
    pub disk: Arc<crate::diskspace::DiskSpace>,
    pub liveness: Arc<Liveness>,
    /// The peer network, for pre-votes.
    pub call: Arc<dyn Call>,
    /// Where the peer server names the snapshot it receives.
    pub incoming: firstseen_raft::state_machine::Incoming,
}

/// The services, not yet running.
pub struct Services {
    /// What the peer listener (or the simulated network) serves.
    pub peer_service: Arc<PeerService>,
    pub elections: BoxFuture<'static, ()>,
    pub lease: BoxFuture<'static, ()>,
}

/// Builds the services of node `cx.id`, to run until `stop`.
pub fn build(
    section: &ClusterConfig,
    cx: &NodeCx,
    links: Links,
    stop: CancellationToken,
) -> Services {
    let timing = timing(section);
    let peer_service = Arc::new(PeerService {
        node_id: cx.id,
        raft: links.raft.clone(),
        key: links.key,
        forwarded: links.forwarded,
        tls: links.tls,
        disk: links.disk.clone(),
        liveness: links.liveness.clone(),
        timing,
        snapshot: Default::default(),
        incoming: links.incoming,
    });
    // Before the peer service or the driver runs: a node whose log was set
    // aside must not grant a single vote until it has caught up.
    let raft_dir = cx.data_dir.join("raft");
    if firstseen_raft::rejoin::pending(&raft_dir) {
        tracing::warn!(
            "rejoining with an empty Raft log: refusing votes and not campaigning until the leader has brought this node up to date"
        );
        links.liveness.abstain();
    }
    let elections = elect::drive(
        links.raft.clone(),
        cx.id,
        links.call,
        links.liveness.clone(),
        timing,
        links.disk,
        raft_dir,
        stop.clone(),
    );
    let lease = elect::watch_lease(links.raft, links.liveness, timing, stop);
    Services {
        peer_service,
        elections: Box::pin(elections),
        lease: Box::pin(lease),
    }
}
