//! The node's core, built once for the process and for the simulation.
//!
//! The core is what decides: the coalescer, the proposer, the peer service,
//! the elections and the lease watch, the publisher and the batcher. What it
//! reaches outside goes through [`Ports`]: the peer network, the wall clock,
//! Pulsar and the upstream sessions' acks. `node::run` passes the real
//! adapters and runs the tasks under its supervisor, in its stop order;
//! `tests/simulate_cluster.rs` passes models and runs the same tasks on a
//! paused clock. One builder, so that the simulation tests the wiring the
//! node runs, not a copy of it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use firstseen_raft::{NodeId, Raft};
use firstseen_store::StateStore;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::batch::port::Acks;
use crate::batch::{self, BatchPolicy, Batcher};
use crate::clock::SharedClock;
use crate::cluster::liveness::{Liveness, Timing};
use crate::cluster::peers::Call;
use crate::cluster::server::PeerService;
use crate::cluster::{self, elect};
use crate::config::Config;
use crate::diskspace::DiskSpace;
use crate::ingest::Received;
use crate::propose::coalesce::{self, Coalescer};
use crate::propose::Proposer;
use crate::publish::adapter::{RaftGroup, StateOutbox};
use crate::publish::port::Broker;
use crate::publish::Publisher;
use crate::secret::ClusterKey;
use crate::tls::PeerTls;

/// A task of the core, to run until its stop token (or forever, in a
/// simulated crash).
pub type Task = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// The outside world, as the core sees it.
pub struct Ports<B> {
    /// The peer network: forwards, pre-votes and openraft's RPCs (openraft
    /// got its own handle when the group was opened).
    pub call: Arc<dyn Call>,
    /// This node's wall clock, for the leader's stamps.
    pub clock: SharedClock,
    /// Pulsar.
    pub broker: B,
    /// The upstream sessions' acks.
    pub acks: Arc<dyn Acks>,
}

/// What the core runs on: the opened group and the node's own parts.
pub struct Parts {
    pub raft: Raft,
    pub state: StateStore,
    pub outbox: firstseen_raft::Outbox,
    pub liveness: Arc<Liveness>,
    pub key: ClusterKey,
    pub tls: Option<PeerTls>,
    pub disk: Arc<DiskSpace>,
    /// Where the publisher keeps a message it sends as a marker while the
    /// cluster level is 1 (from level 2 the replicated state keeps it).
    pub set_aside_local: crate::deadletter::DeadLetter,
    /// Which messages at the end of a topic are this cluster's.
    pub ours: crate::publish::tail::Ours,
}

/// When each task stops. The node cancels them in this order; a simulated
/// crash cancels none and drops the tasks instead.
pub struct Stops {
    /// The batcher: its last batch is committed and acked first.
    pub batch: CancellationToken,
    /// The publisher.
    pub publish: CancellationToken,
    /// The elections and the lease watch.
    pub services: CancellationToken,
    /// The coalescer, last: the batcher's last batch, the publisher's last
    /// receipts and the forwards still being served all go through it.
    pub proposals: CancellationToken,
}

/// The core's handles and its tasks, not yet running.
pub struct Core {
    pub proposer: Proposer,
    /// What the peer listener (or the simulated network) serves.
    pub peer_service: Arc<PeerService>,
    pub coalescer: Task,
    pub elections: Task,
    pub lease: Task,
    pub publisher: Task,
    /// Ends once every sender of `received` is gone and the last batch is
    /// acked, or at `Stops::batch`.
    pub batcher: Task,
    /// Raises the cluster level when every member can run the next one
    /// (`cluster::level`); the status and the admin API hold its handle.
    pub level_gate: crate::propose::level::LevelGate,
    pub levels: Task,
    /// Each Pulsar topic's format, shared with the publisher: a reload
    /// replaces it.
    pub formats: crate::publish::format::Formats,
}

impl Core {
    /// Wires the core of node `config.node.id`. `received` is where ingest
    /// (or the broker's model) hands over messages.
    pub fn build<B>(
        config: &Config,
        parts: Parts,
        ports: Ports<B>,
        stops: Stops,
        received: mpsc::Receiver<Received>,
    ) -> Core
    where
        B: Broker + 'static,
    {
        let id: NodeId = config.node.id;
        let timing: Timing = cluster::timing(&config.cluster);
        let (coalescer, coalescing) = Coalescer::new(
            parts.raft.clone(),
            parts.state.clone(),
            coalesce::Settings {
                window_ms: config.dedup.window_secs * 1_000,
                max_bytes: config.batch.max_bytes,
                clock: ports.clock.clone(),
                log: parts.outbox.log().clone(),
            },
            parts.disk.clone(),
            stops.proposals,
        );
        let formats = config.formats();
        let level_gate = crate::propose::level::LevelGate::new(
            parts.raft.clone(),
            id,
            ports.call.clone(),
            parts.state.clone(),
            coalescer.clone(),
            config.cluster.upgrade,
        );
        let levels = level_gate.clone().run(stops.services.clone());
        let proposer = Proposer {
            raft: parts.raft.clone(),
            node_id: id,
            peers: ports.call.clone(),
            coalescer,
            clock: ports.clock,
            level: parts.state.level_cell(),
        };
        let ours = parts.ours.clone();
        let peer_service = Arc::new(PeerService {
            node_id: id,
            raft: parts.raft.clone(),
            key: parts.key,
            forwarded: Arc::new(proposer.clone()),
            tls: parts.tls,
            disk: parts.disk.clone(),
            liveness: parts.liveness.clone(),
            timing,
            snapshot: Default::default(),
        });
        // Before the peer service or the driver runs: a node whose log was
        // set aside must not grant a single vote until it has caught up.
        let raft_dir = config.node.data_dir.join("raft");
        if firstseen_raft::rejoin::pending(&raft_dir) {
            tracing::warn!(
                "rejoining with an empty Raft log: refusing votes and not campaigning until the leader has brought this node up to date"
            );
            parts.liveness.abstain();
        }
        let elections = elect::drive(
            parts.raft.clone(),
            id,
            ports.call,
            parts.liveness.clone(),
            timing,
            parts.disk.clone(),
            raft_dir,
            stops.services.clone(),
        );
        let lease = elect::watch_lease(
            parts.raft.clone(),
            parts.liveness.clone(),
            timing,
            stops.services.clone(),
        );
        let publisher = Publisher {
            broker: ports.broker,
            group: RaftGroup {
                raft: parts.raft.clone(),
                proposer: proposer.clone(),
                liveness: parts.liveness.clone(),
                lease_timeout: timing.confirm_timeout(),
                lease_fresh: timing.heartbeat,
                metrics: parts.raft.server_metrics(),
            },
            outbox: StateOutbox {
                state: parts.state.clone(),
                outbox: parts.outbox,
                applied: parts.raft.data_metrics(),
                seen: None,
            },
            node_id: id,
            batch: config.pulsar.publish_batch,
            shutdown: stops.publish,
            disk: parts.disk.clone(),
            max_message_bytes: config.pulsar.max_message_bytes,
            set_aside_local: Some(parts.set_aside_local.clone()),
            set_aside_max_bytes: config.outbox.set_aside_max_bytes,
            formats: formats.clone(),
            ours,
        }
        .run();
        let batcher = batch::run(
            Batcher {
                policy: BatchPolicy {
                    max_messages: config.batch.max_messages,
                    max_bytes: config.batch.max_bytes,
                    linger: Duration::from_millis(config.batch.linger_ms),
                },
                group: Arc::new(proposer.clone()),
                acks: ports.acks,
                state: parts.state,
                quota_bytes: config.outbox.quota_bytes,
                disk: parts.disk,
                shutdown: stops.batch,
            },
            received,
        );
        Core {
            proposer,
            peer_service,
            coalescer: Box::pin(coalescing),
            elections: Box::pin(elections),
            lease: Box::pin(lease),
            publisher: Box::pin(publisher),
            batcher: Box::pin(batcher),
            level_gate,
            levels: Box::pin(levels),
            formats,
        }
    }
}
