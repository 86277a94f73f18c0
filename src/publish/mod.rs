//! Publish: the leader moves outbox messages into Pulsar, exactly once.
//!
//! The protocol (docs/exactly-once.md has the argument):
//! 1. Only the Raft leader publishes, and it confirms its lease with a quorum
//!    (`ensure_linearizable`) before every batch.
//! 2. Each topic gets a producer in `Exclusive` access mode, named after this
//!    node and term. A second exclusive producer is refused by the broker.
//! 3. After acquiring it, the publisher reads the topic's last
//!    `firstseen-seq` and resumes after max(tail, Raft watermark).
//! 4. Up to `inflight::MAX_IN_FLIGHT` batches are in flight per topic, each sent
//!    after its own lease confirmation; receipts are settled oldest first,
//!    and a batch committed meanwhile is sent without waiting for them. On
//!    any error the rest in flight is heard out (the broker may have refused
//!    more of it), then the producer is dropped with every batch in flight,
//!    and step 3 runs again; what the broker refused goes first, late. The
//!    producer (`producer`, the project's own) never sends an entry twice.
//! 5. After each batch it proposes `Published{topic, seq}` through the
//!    proposer, without waiting for the commit, so every node trims its
//!    outbox.
//!
//! The pieces, in the order a message goes: `term` the term loop (lead,
//! confirm the lease, send each topic's next batch, settle receipts);
//! `take` taking a topic (exclusive producer, tail read, resume point);
//! `rebase` what a recovered cluster finds at a topic's end; `inflight` the
//! per-topic window of entries in flight and how a failure ends it;
//! `aside` messages sent as markers and kept; `late` refused messages sent
//! again after later ones. `policy` its decisions without I/O (resume
//! point, watermark cadence, retry backoff, refusals, what is set aside);
//! `port` its outside world as traits, whose errors are the publisher's
//! own (`SendError`), and `adapter` the node's implementations (a file
//! each: the broker, a term's session, the consensus, the outbox) over
//! `producer` (our batched, exclusive producer) and `client` (the crate's
//! client for lookups and reads, and the admin API, with `auth`); `error`
//! the publish path's own errors (`Error`, `TopicProblem`); `tail`
//! the read of a topic's end, with `ours` (which messages are the
//! cluster's) and `landed` (what the topic lacks below its tail), `proof`
//! the cluster's mark on its messages, `props` and `format` how a message
//! is written; `stall` whether publishing is stuck; `config` the
//! `[pulsar]` and `[outbox]` sections.

pub mod adapter;
mod aside;
pub mod auth;
pub mod client;
pub mod config;
pub mod error;
pub mod format;
mod inflight;
mod landed;
mod late;
pub mod ours;
pub mod policy;
pub mod port;
pub mod producer;
pub mod proof;
pub mod props;
mod rebase;
pub mod stall;
pub mod tail;
mod take;
mod term;

pub use client::{connect, Admin};
pub use error::{Error, TopicProblem};

use tokio_util::sync::CancellationToken;

use port::{Broker, Consensus, Outbox};

/// The leader-only publisher task, over the broker, the group and the
/// outbox it is given ([`adapter`] has the node's; the simulation has
/// models).
pub struct Publisher<B: Broker, C: Consensus, O: Outbox> {
    pub broker: B,
    pub consensus: C,
    pub outbox: O,
    pub node_id: u64,
    /// Messages per batch (`pulsar.publish_batch`).
    pub batch: usize,
    pub shutdown: CancellationToken,
    /// A leader whose disk is low stops publishing, so that it stops
    /// confirming its lease and the others elect one with room.
    pub disk: std::sync::Arc<crate::diskspace::DiskSpace>,
    /// What the broker accepts (`pulsar.max_message_bytes`); a larger
    /// message goes as a marker ([`policy::set_aside_reason`]).
    pub max_message_bytes: usize,
    /// Where a message sent as a marker is kept below cluster level 2 (a
    /// directory of this node's own, apart from the dead letters), before
    /// the marker is sent. `None` in the models, which keep nothing on
    /// disk. From level 2 it is kept in the replicated state instead.
    pub set_aside_local: Option<crate::deadletter::DeadLetter>,
    /// The replicated set-aside store's bound (`outbox.set_aside_max_bytes`).
    pub set_aside_max_bytes: u64,
    /// How this cluster names its producers.
    pub ours: tail::Ours,
    /// How each topic's messages are written (`routes[].format`).
    pub formats: format::Formats,
}

/// What the publish stage works with besides its sections.
pub struct Links<B> {
    /// Pulsar (or its model).
    pub broker: B,
    pub raft: firstseen_raft::Raft,
    /// Where receipts and set-aside records are proposed.
    pub proposer: crate::propose::Proposer,
    pub liveness: std::sync::Arc<crate::cluster::liveness::Liveness>,
    /// The group's timing (`cluster::timing`): the lease's bounds.
    pub timing: crate::cluster::liveness::Timing,
    pub state: firstseen_store::StateStore,
    pub outbox: firstseen_raft::Outbox,
    pub disk: std::sync::Arc<crate::diskspace::DiskSpace>,
    /// Each topic's format, shared with the reloader.
    pub formats: format::Formats,
    pub ours: tail::Ours,
}

/// The publish stage of node `cx.id`, built from `[pulsar]` and
/// `[outbox]`: the publisher's task, until `stop`. Below cluster level 2 a
/// message sent as a marker is kept in `<data_dir>/set-aside/` first.
pub fn build<B: Broker + 'static>(
    pulsar: &config::PulsarConfig,
    outbox: &config::OutboxConfig,
    cx: &crate::context::NodeCx,
    links: Links<B>,
    stop: CancellationToken,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let set_aside_local = crate::deadletter::DeadLetter::open(
        cx.data_dir.join("set-aside"),
        crate::deadletter::Bounds {
            max_bytes: outbox.set_aside_max_bytes,
            // Kept until the bound says otherwise: no age by clock.
            retention_ms: u64::MAX,
            unrouted_max_bytes: 0,
        },
    );
    Publisher {
        broker: links.broker,
        consensus: adapter::RaftGroup {
            raft: links.raft.clone(),
            proposer: links.proposer,
            liveness: links.liveness,
            lease_timeout: links.timing.confirm_timeout(),
            lease_fresh: links.timing.lease_fresh(),
            metrics: links.raft.server_metrics(),
        },
        outbox: adapter::StateOutbox {
            state: links.state,
            outbox: links.outbox,
            applied: links.raft.data_metrics(),
            seen: None,
        },
        node_id: cx.id,
        batch: pulsar.publish_batch,
        shutdown: stop,
        disk: links.disk,
        max_message_bytes: pulsar.max_message_bytes,
        set_aside_local: Some(set_aside_local),
        set_aside_max_bytes: outbox.set_aside_max_bytes,
        formats: links.formats,
        ours: links.ours,
    }
    .run()
}
