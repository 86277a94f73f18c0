//! Publish: the leader moves outbox messages into Pulsar, exactly once.
//!
//! The protocol (docs/exactly-once.md has the argument):
//! 1. Only the Raft leader publishes, and it confirms its lease with a quorum
//!    (`ensure_linearizable`) before every batch.
//! 2. Each topic gets a producer in `Exclusive` access mode, named after this
//!    node and term. A second exclusive producer is refused by the broker.
//! 3. After acquiring it, the publisher reads the topic's last
//!    `firstseen-seq` and resumes after max(tail, Raft watermark).
//! 4. Up to [`MAX_IN_FLIGHT`] batches are in flight per topic, each sent
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
//! The pieces: `policy` its decisions without I/O (resume point, watermark
//! cadence, retry backoff, what is set aside); `port` its outside world as
//! traits, whose errors are the publisher's own (`SendError`), and
//! `adapter` the node's implementations over `producer` (our batched,
//! exclusive producer) and `client` (the crate's client for lookups and
//! reads, and the admin API, with `auth`); `tail` the read of a topic's
//! end, `proof` the cluster's mark on its messages, `props` and `format`
//! how a message is written; `stall` whether publishing is stuck;
//! `config` the `[pulsar]` and `[outbox]` sections.

pub mod adapter;
pub mod auth;
pub mod client;
pub mod config;
pub mod format;
pub mod policy;
pub mod port;
pub mod producer;
pub mod proof;
pub mod props;
pub mod stall;
pub mod tail;

pub use client::{connect, Admin};

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use futures::FutureExt;

// Tokio's clock, not the system's: it is the same in a node, and it is the
// simulated clock in the simulation.
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::telemetry::{self, Leg};
use crate::{Error, TopicProblem};
use policy::{held_elsewhere, retry_policy};
use port::{Broker, Consensus, Outbox, Receipt, Sending, Session};

/// Batches sent per topic before the oldest one's receipts are awaited. With
/// one, every batch waited out a broker round trip (and a bookie fsync)
/// before the next could leave, and messages committed meanwhile queued
/// behind it: at 2,000 msg/s that wait was most of the p99. A producer's
/// messages are persisted in send order, so a batch can only succeed after
/// every batch sent before it, which is what the tail read relies on.
const MAX_IN_FLIGHT: usize = 4;

/// A batch sent and not yet confirmed.
struct InFlight {
    /// Receipts not yet come back, oldest first.
    receipts: VecDeque<Receipt>,
    /// The sequence of the oldest receipt not yet come back.
    front: u64,
    /// The sequence whose receipt came back with an error.
    failed: Option<u64>,
    /// Last sequence in the batch.
    last: u64,
    messages: u64,
    started: Instant,
}

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
            lease_fresh: links.timing.heartbeat,
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

/// Why a leadership term's publishing ended.
enum TermEnd {
    /// Not (or no longer) the leader, or the lease could not be confirmed.
    LostLease,
    /// The topics were renamed (cluster level 3): lead again at once.
    Renamed,
    Shutdown,
}

/// Publishing state of one topic within a term.
struct TopicPublisher<P> {
    topic: String,
    producer: Option<P>,
    /// Next sequence to send; valid only while `producer` is `Some`.
    next_seq: u64,
    /// Sent batches, oldest first.
    in_flight: VecDeque<InFlight>,
    retry_at: Option<Instant>,
    backoff: Duration,
    /// Last sequence whose receipt came back, and the last one proposed as
    /// the watermark, with when.
    confirmed: u64,
    proposed: u64,
    proposed_at: Option<Instant>,
    /// The broker's refusals of one message in a row.
    refusals: policy::Refusals,
    /// The largest message the broker takes on this topic, when it said.
    limit: Option<usize>,
    /// The late message whose send failed, for [`TopicPublisher::fail`].
    late_failed: Option<u64>,
    /// How this topic's messages are written.
    format: format::Format,
    /// The cluster's generation, as applied when the producer was taken.
    generation: u64,
}

impl<P> TopicPublisher<P> {
    fn new(topic: String, format: format::Format) -> Self {
        Self {
            topic,
            producer: None,
            next_seq: 0,
            in_flight: VecDeque::new(),
            retry_at: None,
            backoff: Duration::from_millis(200),
            confirmed: 0,
            proposed: 0,
            proposed_at: None,
            refusals: policy::Refusals::default(),
            limit: None,
            late_failed: None,
            format,
            generation: 0,
        }
    }

    /// Proposes the confirmed watermark through Raft if it moved, and, unless
    /// `now` is set, if the last proposal is [`policy::WATERMARK_EVERY`] old.
    fn propose_watermark(&mut self, consensus: &impl Consensus, now: bool) {
        let since_last = self.proposed_at.map(|t| t.elapsed());
        if !policy::watermark_due(self.confirmed, self.proposed, since_last, now) {
            return;
        }
        self.proposed = self.confirmed;
        self.proposed_at = Some(Instant::now());
        // Committed in the background: the next batch need not wait for it.
        // Apply keeps the larger of two watermarks whatever their order.
        consensus.watermark(self.topic.clone(), self.confirmed);
    }

    /// Drops the producer and its pending queue; the next attempt re-reads
    /// the tail.
    async fn fail(&mut self, error: &Error) {
        metrics::counter!("firstseen_publish_errors_total").increment(1);
        let failed = self
            .in_flight
            .iter()
            .find_map(|b| b.failed)
            .or(self.late_failed.take());
        let judged = policy::judged(error);
        let refused = judged != policy::Judged::Not;
        self.refusals.record(failed, judged);
        if refused {
            metrics::counter!("firstseen_publish_refusals_total").increment(1);
        }
        self.hear_out().await;
        let (delay, next) = retry_policy(self.backoff, held_elsewhere(error));
        tracing::warn!(topic = %self.topic, %error, seq = ?failed, refused_by_broker = refused, retry_in_ms = delay.as_millis() as u64, "publisher dropped its producer");
        self.producer = None;
        self.in_flight.clear();
        self.retry_at = Some(Instant::now() + delay);
        self.backoff = next;
    }

    /// Awaits the answers to everything still in flight before the producer
    /// goes. The broker answers each entry on its own: one it refused does
    /// not stop the ones after it from landing, and one of those may be
    /// refused too. Each refused message is held back to go late; dropping
    /// the producer unheard left a later refusal unknown while the tail
    /// passed it. Every answer comes soon: a refusal ends the producer for
    /// new sends, a lost connection fails the rest at once, and a receipt
    /// waits at most the operation timeout.
    async fn hear_out(&mut self) {
        for batch in &mut self.in_flight {
            while let Some(receipt) = batch.receipts.pop_front() {
                let seq = batch.front;
                batch.front += 1;
                if let Err(e) = receipt.await {
                    let judged = policy::judged(&Error::Broker(e));
                    if self.refusals.heard(seq, judged) {
                        metrics::counter!("firstseen_publish_refusals_total").increment(1);
                    }
                }
            }
        }
    }
}

impl InFlight {
    /// Awaits the receipts still outstanding. Cancel-safe: a receipt leaves
    /// the queue only once it has resolved, so a wait cut short (a new
    /// commit to send) resumes where it was, and no resolved receipt is
    /// polled again.
    async fn received(&mut self) -> Result<(), Error> {
        while let Some(r) = self.receipts.front_mut() {
            let result = r.await;
            self.receipts.pop_front();
            if result.is_err() {
                self.failed = Some(self.front);
            }
            self.front += 1;
            result?;
        }
        Ok(())
    }
}

impl<P> TopicPublisher<P> {
    /// Settles, oldest first, every batch whose receipts have all come back,
    /// without waiting for any. Returns the last sequence now known to be
    /// in Pulsar, or `None` if no batch completed.
    fn settle_ready(&mut self) -> Result<Option<u64>, Error> {
        let mut upto = None;
        while let Some(batch) = self.in_flight.front_mut() {
            match batch.received().now_or_never() {
                None => break,
                Some(Err(e)) => return Err(e),
                Some(Ok(())) => {}
            }
            let batch = self.in_flight.pop_front().expect("front exists");
            metrics::counter!("firstseen_published_total").increment(batch.messages);
            let spent = batch.started.elapsed();
            metrics::histogram!("firstseen_publish_batch_seconds").record(spent.as_secs_f64());
            telemetry::leg(Leg::Receipt, spent, batch.messages);
            upto = Some(batch.last);
        }
        Ok(upto)
    }

    /// Resolves once the oldest batch in flight has every receipt back (or
    /// one failed); never, when nothing is in flight.
    async fn oldest_received(&mut self) -> Result<(), Error> {
        match self.in_flight.front_mut() {
            Some(batch) => batch.received().await,
            None => std::future::pending().await,
        }
    }
}

/// Waits for the first topic whose oldest batch has come back, and names it.
async fn first_received<P: Send>(
    topics: &mut BTreeMap<String, TopicPublisher<P>>,
) -> (String, Result<(), Error>) {
    let waits: Vec<_> = topics
        .iter_mut()
        .filter(|(_, t)| !t.in_flight.is_empty())
        .map(|(name, t)| Box::pin(async move { (name.clone(), t.oldest_received().await) }))
        .collect();
    if waits.is_empty() {
        return std::future::pending().await;
    }
    futures::future::select_all(waits).await.0
}

impl<B: Broker, C: Consensus, O: Outbox> Publisher<B, C, O> {
    /// Runs until shutdown, publishing whenever this node leads.
    pub async fn run(mut self) {
        loop {
            if self.shutdown.is_cancelled() {
                break;
            }
            let (term, leader) = self.consensus.leadership();
            if leader != Some(self.node_id) {
                tokio::select! {
                    _ = self.consensus.changed() => {}
                    _ = self.shutdown.cancelled() => break,
                }
                continue;
            }
            if self.disk.is_low() {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    _ = self.shutdown.cancelled() => break,
                }
                continue;
            }
            tracing::info!(term, "leading: publisher starting");
            match self.lead(term).await {
                Ok(TermEnd::Shutdown) => break,
                Ok(TermEnd::Renamed) => {}
                Ok(TermEnd::LostLease) => {
                    tracing::info!(term, "publisher stopped: leadership lease not confirmed");
                    // Still "leader" in its own eyes but without a quorum:
                    // wait before trying again rather than grab producers.
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        _ = self.shutdown.cancelled() => break,
                    }
                }
                Err(e) => {
                    tracing::warn!(term, error = %e, "publisher could not start; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        _ = self.shutdown.cancelled() => break,
                    }
                }
            }
        }
        tracing::info!("publisher stopped");
    }

    /// Publishes for one leadership term. Everything it holds (client,
    /// producers and their pending queues) is dropped when it returns.
    async fn lead(&mut self, term: u64) -> Result<TermEnd, Error> {
        // A previous secret proves only up to its cut-off, recorded as the
        // first term after a rotation starts, every entry committed before
        // it applied, and before any tail is read (`proof::Retired`).
        let unrecorded = self.ours.proofs().unrecorded();
        if !unrecorded.is_empty() {
            if !self.consensus.read_barrier().await {
                return Ok(TermEnd::LostLease);
            }
            let topics = self.outbox.topics()?;
            self.ours.proofs().retired().record(
                &unrecorded,
                // The committed watermark, not the last assigned: what is
                // assigned and unpublished goes under the new secret
                // (`proof::Retired`).
                topics.iter().map(|(t, st)| (t.as_str(), st.published_seq)),
            )?;
            tracing::info!(secrets = ?unrecorded, topics = topics.len(), "cut-offs of the previous secrets recorded: their proofs hold up to each topic's committed watermark");
        }
        let session = self.broker.connect().await?;
        let mut topics: BTreeMap<String, TopicPublisher<<B::Session as Session>::Producer>> =
            BTreeMap::new();
        let named = self.outbox.level() >= firstseen_store::level::NAMES;
        loop {
            if self.shutdown.is_cancelled() {
                return Ok(TermEnd::Shutdown);
            }
            if self.consensus.leadership() != (term, Some(self.node_id)) {
                return Ok(TermEnd::LostLease);
            }
            if !named && self.outbox.level() >= firstseen_store::level::NAMES {
                // The rise to level 3 moved topics held under a short name
                // to their full one: a publisher of the old name would keep
                // the topic's exclusive producer from the new one. Every
                // producer goes, and the next pass starts as a new term
                // does, reading each topic's tail.
                tracing::info!(
                    term,
                    "cluster level 3: topics go by their full names; publisher starts again"
                );
                return Ok(TermEnd::Renamed);
            }
            if self.disk.is_low() {
                tracing::warn!(
                    term,
                    "disk below its reserve: publisher lets go of its producers"
                );
                return Ok(TermEnd::LostLease);
            }
            let mut worked = false;
            for (name, st) in self.outbox.topics()? {
                let tp = topics.entry(name.clone()).or_insert_with(|| {
                    let format = self.formats.of(&name);
                    TopicPublisher::new(name, format)
                });
                // Receipts that came back since the last pass.
                match tp.settle_ready() {
                    Ok(None) => {}
                    Ok(Some(upto)) => {
                        worked = true;
                        tp.backoff = Duration::from_millis(200);
                        // It may lag what is in Pulsar, which is safe: a new
                        // publisher resumes after max(tail, watermark).
                        tp.confirmed = tp.confirmed.max(upto);
                        tp.propose_watermark(&self.consensus, false);
                    }
                    Err(e) => {
                        tp.fail(&e).await;
                        continue;
                    }
                }
                if st.published_seq >= st.last_seq && tp.in_flight.is_empty() {
                    continue;
                }
                // Another cluster, recovered from this one, publishes here:
                // never again from this one (`tail::Superseded`).
                if self.ours.superseded().contains(&tp.topic) {
                    continue;
                }
                if tp.retry_at.is_some_and(|t| Instant::now() < t) {
                    continue;
                }
                let unsent = tp.producer.is_none() || tp.next_seq <= st.last_seq;
                if unsent && tp.in_flight.len() < MAX_IN_FLIGHT {
                    // The lease, confirmed with a quorum before every batch:
                    // a leader that was paused or cut off stops here.
                    if !self.consensus.confirm_lease().await {
                        return Ok(TermEnd::LostLease);
                    }
                    match self.send_batch(&session, tp, term).await {
                        Ok(sent) => worked |= sent,
                        Err(e) => tp.fail(&e).await,
                    }
                }
            }
            if worked {
                continue;
            }
            if topics.values().all(|t| t.in_flight.is_empty()) {
                // Idle: the watermarks held back while busy go now.
                for tp in topics.values_mut() {
                    tp.propose_watermark(&self.consensus, true);
                }
                // An idle publisher still holds its producers, which keeps a
                // successor's exclusive producers out. So the lease is also
                // confirmed on a timer: a leader cut off from its peers lets
                // go of Pulsar even when it has nothing to send.
                let holding = topics.values().any(|t| t.producer.is_some());
                if holding && !self.consensus.confirm_lease().await {
                    return Ok(TermEnd::LostLease);
                }
            }
            // Nothing to send and nothing settled: wait for whichever comes
            // first, a batch's receipts or a newly applied entry. Awaiting
            // the oldest batch alone made every message committed meanwhile
            // wait out Pulsar's round trip before it could leave; at the HSL
            // peak that was most of the time from commit to send.
            let woke = tokio::select! {
                r = first_received(&mut topics) => Some(r),
                _ = self.outbox.grown() => None,
                _ = self.consensus.changed() => None,
                _ = tokio::time::sleep(Duration::from_millis(200)) => None,
                _ = self.shutdown.cancelled() => return Ok(TermEnd::Shutdown),
            };
            if let Some((name, Err(e))) = woke {
                if let Some(tp) = topics.get_mut(&name) {
                    tp.fail(&e).await;
                }
            }
        }
    }

    /// Continues `topic` after `older`, the proven messages of the cluster
    /// this one was recovered from above its watermark (what the lost
    /// members published and the survivor never received): commits a
    /// rebase with the outbox's messages of their keys (in Pulsar already),
    /// then, for copies first seen meanwhile, rebases again until the
    /// outbox holds none of their keys (from then on the window has them).
    async fn rebase(
        &self,
        topic: &str,
        older: &[(u64, firstseen_store::Key)],
    ) -> Result<(), Error> {
        let keys: std::collections::HashSet<firstseen_store::Key> =
            older.iter().map(|(_, k)| *k).collect();
        let after = older.iter().map(|(s, _)| *s).max().unwrap_or(0);
        let (low, _) = older.iter().min().copied().unwrap_or_default();
        let mut first = true;
        // Each pass after the first finds only copies first seen between
        // a read and its rebase: a few at most.
        for _ in 0..8 {
            let st = self.outbox.topic(topic)?;
            let mut drop = Vec::new();
            let mut from = st.published_seq + 1;
            'read: loop {
                let batch = self.outbox.read(topic, from, self.batch.max(1))?;
                if batch.is_empty() {
                    break;
                }
                for (seq, m) in batch {
                    if seq > st.last_seq {
                        break 'read;
                    }
                    if keys.contains(&m.key) {
                        drop.push(seq);
                    }
                    from = seq + 1;
                }
            }
            if !first && drop.is_empty() {
                return Ok(());
            }
            let dropped = drop.len();
            self.consensus
                .rebase(firstseen_store::Rebase {
                    pulsar_topic: topic.to_string(),
                    assigned: st.last_seq,
                    older: if first { older.to_vec() } else { Vec::new() },
                    drop,
                })
                .await?;
            let now = self.outbox.topic(topic)?;
            if first && now.published_seq < after {
                // Apply renumbers runs and inline messages alike, so this
                // is a state that moved under the read (it is read again).
                tracing::error!(topic, watermark = now.published_seq, older_up_to = after, "the rebase left the watermark below the older cluster's messages: nothing is published to this topic until a new read and rebase put it past them");
                return Err(Error::Raft {
                    action: format!("rebase {topic}"),
                    source: "the watermark is still below the older cluster's messages".into(),
                });
            }
            metrics::counter!("firstseen_publish_rebased_total").increment(1);
            tracing::warn!(topic, older = if first { older.len() } else { 0 }, older_from = low, older_up_to = after, in_pulsar_already = dropped, watermark = now.published_seq, last_assigned = now.last_seq, "the topic holds messages the cluster this one was recovered from published and this node never received: their keys are in the window, this node's copies of them left the outbox as published, and its other messages are numbered after them");
            first = false;
        }
        Ok(())
    }

    /// Stops publishing `topic` for good: it holds proven messages of
    /// generation `newer`, above this cluster's `ours`.
    fn give_up(&self, topic: &str, ours: u64, newer: u64) {
        if self.ours.superseded().record(topic, ours, newer) {
            metrics::counter!("firstseen_publish_superseded_total").increment(1);
            tracing::error!(topic, generation = %firstseen_raft::recover::shown(ours), newer_generation = %firstseen_raft::recover::shown(newer), "this cluster stops publishing this topic: it holds messages of a newer generation of this cluster, written by a cluster recovered from this one's data (`firstseen recover --force-new-cluster` on a member this cluster was cut off from). Two clusters with one secret cannot publish one topic without losing or doubling messages, and the newer one is the one that lives: the newer generation's messages stay at the topic's end, so this cluster gives the topic up again after every restart. Stop this cluster for good (never start its members again on their data); its unpublished messages reached the newer cluster too, as far as that cluster's nodes received the same feed. This node reports not ready and publishes nothing more to this topic");
        }
    }

    /// Keeps a message that goes to Pulsar as a marker before the marker is
    /// sent: from cluster level 2 in the replicated set-aside store, on
    /// every node, committed first; below it in this node's own set-aside
    /// directory (fsynced), apart from the dead letters, with a bound of its
    /// own and no retention by clock. A failure fails the batch, which is
    /// retried like any other error.
    async fn keep_set_aside(
        &self,
        topic: &str,
        seq: u64,
        m: &firstseen_store::OutboxMessage,
        kind: &'static str,
        reason: &str,
    ) -> Result<(), Error> {
        metrics::counter!("firstseen_set_aside_total").increment(1);
        if self.outbox.level() >= firstseen_store::level::KINDS {
            self.consensus
                .set_aside(firstseen_store::SetAside {
                    pulsar_topic: topic.to_string(),
                    seq,
                    reason: reason.to_string(),
                    message: m.clone(),
                    keep_bytes: self.set_aside_max_bytes,
                })
                .await?;
            tracing::warn!(topic, seq, key = %hex::encode(m.key), reason, "message the broker would refuse sent as a marker; kept in the replicated set-aside store (GET /set-aside)");
            return Ok(());
        }
        let path = match &self.set_aside_local {
            Some(store) => Some(
                store
                    .store(kind, &m.mqtt_topic, None, None, &m.payload, m.first_seen_ms)
                    .await?,
            ),
            None => None,
        };
        tracing::warn!(topic, seq, key = %hex::encode(m.key), reason, file = ?path, "message the broker would refuse sent as a marker; kept in this node's set-aside directory");
        Ok(())
    }

    /// The largest message `tp`'s topic takes: the configured bound, or the
    /// broker's when it is smaller.
    fn limit(&self, broker: Option<usize>) -> usize {
        broker.map_or(self.max_message_bytes, |b| b.min(self.max_message_bytes))
    }

    /// Whether message `seq` goes as a marker, and why; one that does is
    /// kept in the dead-letter store first.
    async fn set_aside(
        &self,
        topic: &str,
        seq: u64,
        m: &firstseen_store::OutboxMessage,
        limit: usize,
        refusals: &policy::Refusals,
        format: format::Format,
    ) -> Result<Option<String>, Error> {
        let (reason, kind) = match policy::set_aside_reason(m, limit, format) {
            Some(r) => (Some(r), "pulsar-limit"),
            None => (refusals.set_aside(seq), "pulsar-refused"),
        };
        if let Some(reason) = &reason {
            self.keep_set_aside(topic, seq, m, kind, reason).await?;
        }
        Ok(reason)
    }

    /// Sends message `n`, which the broker refused after later messages had
    /// been queued, and waits for its receipt: the watermark proposed next
    /// covers it. A refusal again counts, and the retry after it sends a
    /// marker in its place.
    async fn send_late(
        &self,
        session: &B::Session,
        producer: &mut <B::Session as Session>::Producer,
        tp: &mut TopicPublisher<<B::Session as Session>::Producer>,
        n: u64,
    ) -> Result<(), Error> {
        // The outbox keeps every message above the committed watermark; one
        // it no longer holds is in the topic.
        let Some((_, m)) = self
            .outbox
            .read(&tp.topic, n, 1)?
            .into_iter()
            .next()
            .filter(|(seq, _)| *seq == n)
        else {
            tp.refusals.landed(n);
            return Ok(());
        };
        let limit = self.limit(tp.limit);
        let set_aside = self
            .set_aside(&tp.topic, n, &m, limit, &tp.refusals, tp.format)
            .await?;
        let marker = set_aside.is_some();
        let how = Sending {
            set_aside,
            late: true,
            format: tp.format,
            generation: tp.generation,
        };
        let receipt = session.send(producer, n, m, how).await?;
        session.flush(producer).await?;
        match receipt.await {
            Ok(()) => {
                metrics::counter!("firstseen_published_late_total").increment(1);
                tracing::warn!(topic = %tp.topic, seq = n, marker, "a message the broker refused after later ones landed was sent again, after them");
                tp.refusals.landed(n);
                Ok(())
            }
            Err(e) => {
                tp.late_failed = Some(n);
                Err(e.into())
            }
        }
    }

    /// Sends the next batch of one topic without awaiting its receipts.
    /// Returns whether there was anything to send.
    async fn send_batch(
        &self,
        session: &B::Session,
        tp: &mut TopicPublisher<<B::Session as Session>::Producer>,
        term: u64,
    ) -> Result<bool, Error> {
        if tp.producer.is_none() {
            let name = self.ours.producer_name(&format!(
                "{}-t{}-{}",
                self.node_id,
                term,
                tail::scratch_subscription("p")
            ));
            let mut producer = session.exclusive(&tp.topic, &name).await?;
            // Every entry committed before now applied: a sequence beyond
            // what the outbox has assigned is then surely not ours.
            if !self.consensus.read_barrier().await {
                return Err(Error::LeaseLost);
            }
            let assigned = self.outbox.topic(&tp.topic)?;
            // Only now, holding exclusive access, is the tail stable.
            let strict = self.outbox.level() >= firstseen_store::level::KINDS;
            let watermark = assigned.published_seq;
            let generation = self.outbox.generation();
            self.ours.set_generation(generation);
            let tail = session
                .read_tail(&tp.topic, assigned.last_seq, watermark, strict)
                .await?;
            if tail::superseded(generation, tail.generation) {
                // The producer goes (closed at the broker): the newer
                // cluster may take the topic.
                drop(producer);
                self.give_up(&tp.topic, generation, tail.generation);
                return Ok(false);
            }
            tp.generation = generation;
            if !tail.older.is_empty() {
                // Nothing is sent before the rebase is applied; the next
                // pass takes the topic again and reads it anew.
                drop(producer);
                if tail.cut_short {
                    tracing::error!(topic = %tp.topic, watermark, found = tail.older.len(), "the topic holds messages of the cluster this one was recovered from above this cluster's watermark, and the tail read reached its bounds before it had read back to the watermark: nothing is published to this topic until a read gets there (the survivor lagged too far behind)");
                    tp.retry_at = Some(Instant::now() + Duration::from_secs(5));
                    return Ok(false);
                }
                self.rebase(&tp.topic, &tail.older).await?;
                return Ok(true);
            }
            if tail.foreign > 0 {
                metrics::counter!("firstseen_foreign_messages_total").increment(tail.foreign);
                tracing::warn!(topic = %tp.topic, foreign = tail.foreign, forged = tail.forged, tail = ?tail.seq, "messages this cluster did not write found at the end of the topic; skipped");
            }
            if tail.cut_short {
                metrics::counter!("firstseen_tail_cut_short_total").increment(1);
                tracing::warn!(topic = %tp.topic, watermark, "the tail read reached its bounds before it found this cluster's last message, or what lies between the watermark and it: resuming after the committed watermark (messages published since it may go twice; none is skipped)");
            }
            let tail_seq = tail.seq;
            // What the topic lacks between the watermark and the tail is
            // what must go late, not what this leader remembers: a
            // predecessor's refusals lived in its memory only (skipped
            // after a leader change), and a late message whose receipt was
            // lost went again although it had landed.
            if let Some(missing) = &tail.missing {
                let count: u64 = missing.iter().map(|(a, b)| b - a + 1).sum();
                if count > 0 {
                    tracing::warn!(topic = %tp.topic, count, ranges = ?missing, "sequences between the watermark and the tail are missing from the topic (refused while later ones landed): they go late");
                }
                tp.refusals.found_missing(missing);
            }
            tp.limit = session.message_limit(&tp.topic).await;
            // Messages the broker refused while later ones were already on
            // their way: they landed and these did not, so the tail has
            // passed them. They go now, late, one by one, before anything
            // else (each as itself, or as a marker once refused alone
            // twice); resuming after the tail would leave them out for
            // good.
            while let Some(n) = tp.refusals.held() {
                if n <= watermark {
                    tp.refusals.landed(n);
                } else if tail_seq.is_some_and(|t| n <= t) {
                    self.send_late(session, &mut producer, tp, n).await?;
                } else {
                    tp.refusals.resumed_before();
                }
            }
            tp.next_seq = policy::resume_at(tail_seq, watermark);
            tracing::info!(topic = %tp.topic, producer = %name, tail = ?tail_seq, watermark, resume_at = tp.next_seq, "exclusive producer acquired");
            tp.producer = Some(producer);
            // A tail ahead of the watermark is in Pulsar, so it is the
            // watermark now. Without this, receipts that came back after the
            // last watermark of a term that then ended (a lost lease) were
            // never recorded while the topic stayed idle: the outbox kept
            // messages that were in Pulsar, and the log could not be purged
            // past them (the whole-cluster simulation found it).
            tp.proposed = tp.proposed.max(watermark);
            tp.confirmed = tp.confirmed.max(tail_seq.unwrap_or(0));
            tp.propose_watermark(&self.consensus, true);
        }
        let batch = self.outbox.read(&tp.topic, tp.next_seq, self.batch)?;
        let Some((first, _)) = batch.first() else {
            return Ok(false);
        };
        if *first != tp.next_seq {
            return Err(Error::topic(
                &tp.topic,
                TopicProblem::OutboxGap {
                    first: *first,
                    next: tp.next_seq,
                },
            ));
        }
        let producer = tp.producer.as_mut().expect("producer set above");
        let started = Instant::now();
        let mut receipts = VecDeque::with_capacity(batch.len());
        let mut last = tp.next_seq;
        let limit = self.limit(tp.limit);
        let mut applied = Vec::with_capacity(batch.len());
        let mut sent = Ok(());
        for (seq, m) in batch {
            applied.extend(self.outbox.applied_at(&tp.topic, seq));
            let set_aside = self
                .set_aside(&tp.topic, seq, &m, limit, &tp.refusals, tp.format)
                .await?;
            let how = Sending {
                set_aside,
                late: false,
                format: tp.format,
                generation: tp.generation,
            };
            match session.send(producer, seq, m, how).await {
                Ok(receipt) => receipts.push_back(receipt),
                Err(e) => {
                    sent = Err(e);
                    break;
                }
            }
            last = seq;
        }
        if sent.is_ok() {
            sent = session.flush(producer).await;
        }
        if receipts.is_empty() {
            return sent.map(|()| false).map_err(Error::from);
        }
        // What was handed over goes in flight even when a later send
        // failed (a refusal heard meanwhile ends the producer): the broker
        // answers each entry, and the producer's end hears them out
        // ([`TopicPublisher::hear_out`]). Dropping them left a refusal
        // among them unknown while the tail passed it.
        let handed = std::time::Instant::now();
        for at in applied {
            telemetry::leg(Leg::Publish, handed.saturating_duration_since(at), 1);
        }
        tp.in_flight.push_back(InFlight {
            messages: receipts.len() as u64,
            receipts,
            front: tp.next_seq,
            failed: None,
            last,
            started,
        });
        tp.next_seq = last + 1;
        sent.map(|()| true).map_err(Error::from)
    }
}
