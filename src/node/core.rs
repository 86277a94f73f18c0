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

use firstseen_raft::Raft;
use firstseen_store::StateStore;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::batch::{self, port::Acks};
use crate::clock::SharedClock;
use crate::cluster::answer::PeerService;
use crate::cluster::liveness::Liveness;
use crate::cluster::peers::Call;
use crate::cluster::services;
use crate::config::Config;
use crate::diskspace::DiskSpace;
use crate::ingest::Received;
use crate::propose::{self, Proposer};
use crate::publish::{self, port::Broker};
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
    /// Which messages at the end of a topic are this cluster's.
    pub ours: crate::publish::tail::Ours,
    /// Where the peer server names the snapshot it receives.
    pub incoming: firstseen_raft::state_machine::Incoming,
}

/// When each task stops. The node cancels them in this order; a simulated
/// crash cancels none and drops the tasks instead.
pub struct Stops {
    /// The batcher: its last batch is committed and acked first.
    pub batch: CancellationToken,
    /// The publisher.
    pub publish: CancellationToken,
    /// The elections, the lease watch and the level gate.
    pub services: CancellationToken,
    /// The coalescer, last: the batcher's last batch, the publisher's last
    /// receipts and the forwards still being served all go through it.
    pub proposals: CancellationToken,
}

/// Which of [`Stops`] ends a task: where the node runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopsAt {
    Batch,
    Publish,
    Services,
    Proposals,
}

/// The core's handles and its tasks, not yet running.
pub struct Core {
    pub proposer: Proposer,
    /// What the peer listener (or the simulated network) serves.
    pub peer_service: Arc<PeerService>,
    /// The cluster level's gate; the status and the admin API hold it.
    pub level_gate: crate::propose::level::LevelGate,
    /// Each Pulsar topic's format, shared with the publisher: a reload
    /// replaces it.
    pub formats: crate::publish::format::Formats,
    /// Every task of the core, named, with the stop that ends it: the node
    /// runs each in its layer of the stop order, the simulation runs them all alike.
    pub tasks: Vec<(StopsAt, &'static str, Task)>,
}

impl Core {
    /// Wires the core of node `config.node.id`: the propose, cluster,
    /// publish and batch stages, each built from its own section.
    /// `received` is where ingest (or the broker's model) hands over
    /// messages.
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
        let cx = config.node.cx();
        let propose = propose::build(
            propose::Settings {
                me: cx.id,
                window: config.dedup.window(),
                max_entry_bytes: config.batch.max_bytes,
                upgrade: config.cluster.upgrade,
            },
            propose::Links {
                raft: parts.raft.clone(),
                state: parts.state.clone(),
                log: parts.outbox.log().clone(),
                clock: ports.clock,
                call: ports.call.clone(),
                disk: parts.disk.clone(),
            },
            stops.proposals,
            stops.services.clone(),
        );
        let services = services::build(
            &config.cluster,
            &cx,
            services::Links {
                raft: parts.raft.clone(),
                key: parts.key,
                forwarded: Arc::new(propose.proposer.clone()),
                tls: parts.tls,
                disk: parts.disk.clone(),
                liveness: parts.liveness.clone(),
                call: ports.call,
                incoming: parts.incoming.clone(),
            },
            stops.services,
        );
        let formats = config.formats();
        let publisher = publish::build(
            &config.pulsar,
            &config.outbox,
            &cx,
            publish::Links {
                broker: ports.broker,
                raft: parts.raft.clone(),
                proposer: propose.proposer.clone(),
                liveness: parts.liveness,
                timing: crate::cluster::timing(&config.cluster),
                state: parts.state.clone(),
                outbox: parts.outbox,
                disk: parts.disk.clone(),
                formats: formats.clone(),
                ours: parts.ours,
            },
            stops.publish,
        );
        let batcher = batch::build(
            &config.batch,
            batch::Links {
                proposer: Arc::new(propose.proposer.clone()),
                acks: ports.acks,
                state: parts.state,
                disk: parts.disk,
                outbox_quota_bytes: config.outbox.quota_bytes,
            },
            received,
            stops.batch,
        );
        let tasks: Vec<(StopsAt, &'static str, Task)> = vec![
            (StopsAt::Proposals, "coalescer", propose.coalescer),
            (StopsAt::Services, "elections", services.elections),
            (StopsAt::Services, "cluster level", propose.levels),
            (StopsAt::Services, "lease", services.lease),
            (StopsAt::Publish, "publisher", Box::pin(publisher)),
            (StopsAt::Batch, "batcher", Box::pin(batcher)),
        ];
        Core {
            proposer: propose.proposer,
            peer_service: services.peer_service,
            level_gate: propose.level_gate,
            formats,
            tasks,
        }
    }
}
