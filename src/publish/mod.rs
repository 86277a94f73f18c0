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
//!    after its own lease confirmation; receipts are awaited oldest first. On
//!    any error the producer — and the crate's queue of pending messages with
//!    it — is dropped with every batch in flight, and step 3 runs again. The
//!    crate's own retries are capped at zero.
//! 5. After each batch it commits `Published{topic, seq}` through Raft, in
//!    the background, so
//!    every node trims its outbox.

pub mod auth;
pub mod policy;
pub mod props;
pub mod tail;

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use firstseen_raft::Raft;
use firstseen_store::{OutboxMessage, StateStore};
use pulsar::producer::ProducerOptions;
use pulsar::{ConnectionRetryOptions, OperationRetryOptions, Producer, Pulsar, TokioExecutor};
use tokio_util::sync::CancellationToken;

use crate::config::PulsarConfig;
use crate::propose::Proposer;
use crate::{Error, TopicProblem};
use policy::{held_elsewhere, retry_policy};

/// Pulsar's `ProducerAccessMode::Exclusive`. Never `Shared`; and not
/// `ExclusiveWithFencing`, because a paused old leader's automatic
/// re-creation would then fence the true leader.
const ACCESS_EXCLUSIVE: i32 = 1;

/// Batches sent per topic before the oldest one's receipts are awaited. With
/// one, every batch waited out a broker round trip (and a bookie fsync)
/// before the next could leave, and messages committed meanwhile queued
/// behind it: at 2,000 msg/s that wait was most of the p99. A producer's
/// messages are persisted in send order, so a batch can only succeed after
/// every batch sent before it, which is what the tail read relies on.
const MAX_IN_FLIGHT: usize = 4;

/// A batch sent and not yet confirmed.
struct InFlight {
    receipts: Vec<pulsar::producer::SendFuture>,
    /// Last sequence in the batch.
    last: u64,
    messages: u64,
    started: Instant,
}

/// The leader-only publisher task.
pub struct Publisher {
    pub raft: Raft,
    /// Appends the receipts (`Published{topic, seq}`).
    pub proposer: Proposer,
    pub state: StateStore,
    /// Reads unpublished messages, payloads from the Raft log.
    pub outbox: firstseen_raft::Outbox,
    pub node_id: u64,
    pub config: PulsarConfig,
    pub shutdown: CancellationToken,
    /// A leader whose disk is low stops publishing, so that it stops
    /// confirming its lease and the others elect one with room.
    pub disk: std::sync::Arc<crate::diskspace::DiskSpace>,
    /// Lease confirmations are recorded here, for readiness.
    pub liveness: std::sync::Arc<crate::cluster::liveness::Liveness>,
    /// Longest wait for a quorum to confirm the lease: below the election
    /// timeout, so a leader cut off lets go before a successor can exist.
    pub lease_timeout: Duration,
}

/// Builds a Pulsar client whose own retries cannot resend behind our back.
pub async fn connect(config: &PulsarConfig) -> Result<Pulsar<TokioExecutor>, Error> {
    let timeout = Duration::from_millis(config.operation_timeout_ms);
    let mut builder = Pulsar::builder(config.url.clone(), TokioExecutor)
        .with_operation_retry_options(OperationRetryOptions {
            operation_timeout: timeout,
            retry_delay: Duration::from_millis(100),
            // Zero: producer (re-)creation is retried in our loop, where the
            // lease is checked, never inside the crate.
            max_retries: Some(0),
        })
        .with_connection_retry_options(ConnectionRetryOptions {
            min_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(500),
            max_retries: 1,
            connection_timeout: timeout,
            ..Default::default()
        });
    if let Some(credentials) = auth::provider(config)? {
        builder = builder.with_auth_provider(credentials);
    }
    if let Some(ca) = &config.ca_file {
        // Read here rather than by the crate, so that a bad file is named
        // with its config key.
        let pem = std::fs::read(ca).map_err(|source| Error::SettingFile {
            key: "pulsar.ca_file".into(),
            path: ca.clone(),
            source,
        })?;
        builder = builder.with_certificate_chain(pem);
    }
    builder = builder.with_tls_hostname_verification_enabled(config.tls_hostname_verification);
    Ok(builder.build().await?)
}

/// An HTTP client for the admin REST API, trusting `pulsar.ca_file` too.
fn admin_client(config: &PulsarConfig) -> Result<reqwest::Client, Error> {
    let mut b =
        reqwest::Client::builder().timeout(Duration::from_millis(config.operation_timeout_ms));
    if let Some(ca) = &config.ca_file {
        let pem = std::fs::read(ca).map_err(|source| Error::SettingFile {
            key: "pulsar.ca_file".into(),
            path: ca.clone(),
            source,
        })?;
        for cert in reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| Error::setting("pulsar.ca_file", format!("{}: {e}", ca.display())))?
        {
            b = b.add_root_certificate(cert);
        }
    }
    if !config.tls_hostname_verification {
        b = b.danger_accept_invalid_hostnames(true);
    }
    b.build().map_err(Error::Admin)
}

/// Why a leadership term's publishing ended.
enum TermEnd {
    /// Not (or no longer) the leader, or the lease could not be confirmed.
    LostLease,
    Shutdown,
}

/// Publishing state of one topic within a term.
struct TopicPublisher {
    topic: String,
    producer: Option<Producer<TokioExecutor>>,
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
}

impl TopicPublisher {
    fn new(topic: String) -> Self {
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
        }
    }

    /// Proposes the confirmed watermark through Raft if it moved, and, unless
    /// `now` is set, if the last proposal is [`policy::WATERMARK_EVERY`] old.
    fn propose_watermark(&mut self, proposer: &Proposer, now: bool) {
        let since_last = self.proposed_at.map(|t| t.elapsed());
        if !policy::watermark_due(self.confirmed, self.proposed, since_last, now) {
            return;
        }
        self.proposed = self.confirmed;
        self.proposed_at = Some(Instant::now());
        // Committed in the background: the next batch need not wait for it.
        // Apply keeps the larger of two watermarks whatever their order.
        proposer.watermark(self.topic.clone(), self.confirmed);
    }

    /// Drops the producer and its pending queue; the next attempt re-reads the tail.
    fn fail(&mut self, error: &Error) {
        metrics::counter!("firstseen_publish_errors_total").increment(1);
        let text = error.to_string();
        let (delay, next) = retry_policy(self.backoff, held_elsewhere(&text));
        tracing::warn!(topic = %self.topic, error = %text, retry_in_ms = delay.as_millis() as u64, "publisher dropped its producer");
        self.producer = None;
        self.in_flight.clear();
        self.retry_at = Some(Instant::now() + delay);
        self.backoff = next;
    }
}

impl TopicPublisher {
    /// Awaits every receipt of the oldest batch in flight. Returns the last
    /// sequence now in Pulsar, or `None` if nothing was in flight.
    async fn settle_oldest(&mut self) -> Option<Result<u64, Error>> {
        let batch = self.in_flight.pop_front()?;
        for r in batch.receipts {
            if let Err(e) = r.await {
                return Some(Err(e.into()));
            }
        }
        metrics::counter!("firstseen_published_total").increment(batch.messages);
        metrics::histogram!("firstseen_publish_batch_seconds")
            .record(batch.started.elapsed().as_secs_f64());
        Some(Ok(batch.last))
    }
}

impl Publisher {
    /// Runs until shutdown, publishing whenever this node leads.
    pub async fn run(self) {
        let mut metrics_rx = self.raft.metrics();
        loop {
            if self.shutdown.is_cancelled() {
                break;
            }
            let (term, leader) = {
                let m = metrics_rx.borrow_and_update();
                (m.current_term, m.current_leader)
            };
            if leader != Some(self.node_id) {
                tokio::select! {
                    _ = metrics_rx.changed() => {}
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
            match self.lead(term, &mut metrics_rx).await {
                Ok(TermEnd::Shutdown) => break,
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
    async fn lead(
        &self,
        term: u64,
        metrics_rx: &mut tokio::sync::watch::Receiver<
            openraft::RaftMetrics<u64, firstseen_raft::Member>,
        >,
    ) -> Result<TermEnd, Error> {
        let pulsar = connect(&self.config).await?;
        self.check_broker_dedup().await;
        let mut topics: BTreeMap<String, TopicPublisher> = BTreeMap::new();
        loop {
            if self.shutdown.is_cancelled() {
                return Ok(TermEnd::Shutdown);
            }
            {
                let m = metrics_rx.borrow_and_update();
                if m.current_term != term || m.current_leader != Some(self.node_id) {
                    return Ok(TermEnd::LostLease);
                }
            }
            if self.disk.is_low() {
                tracing::warn!(
                    term,
                    "disk below its reserve: publisher lets go of its producers"
                );
                return Ok(TermEnd::LostLease);
            }
            let mut worked = false;
            for (name, st) in self.state.topics()? {
                let tp = topics
                    .entry(name.clone())
                    .or_insert_with(|| TopicPublisher::new(name));
                if st.published_seq >= st.last_seq && tp.in_flight.is_empty() {
                    continue;
                }
                if tp.retry_at.is_some_and(|t| Instant::now() < t) {
                    continue;
                }
                let unsent = tp.producer.is_none() || tp.next_seq <= st.last_seq;
                let mut sent = false;
                if unsent && tp.in_flight.len() < MAX_IN_FLIGHT {
                    // The lease, confirmed with a quorum before every batch:
                    // a leader that was paused or cut off stops here.
                    if !self.confirm_lease().await {
                        return Ok(TermEnd::LostLease);
                    }
                    match self.send_batch(&pulsar, tp, term).await {
                        Ok(s) => sent = s,
                        Err(e) => {
                            tp.fail(&e);
                            continue;
                        }
                    }
                }
                worked |= sent;
                // Await the oldest batch when nothing more can be sent now.
                if sent && tp.in_flight.len() < MAX_IN_FLIGHT {
                    continue;
                }
                match tp.settle_oldest().await {
                    None => {}
                    Some(Ok(upto)) => {
                        worked = true;
                        tp.backoff = Duration::from_millis(200);
                        // It may lag what is in Pulsar, which is safe: a new
                        // publisher resumes after max(tail, watermark).
                        tp.confirmed = tp.confirmed.max(upto);
                        tp.propose_watermark(&self.proposer, false);
                    }
                    Some(Err(e)) => tp.fail(&e),
                }
            }
            if !worked {
                // Idle: the watermarks held back while busy go now.
                for tp in topics.values_mut() {
                    tp.propose_watermark(&self.proposer, true);
                }
                // An idle publisher still holds its producers, which keeps a
                // successor's exclusive producers out. So the lease is also
                // confirmed on a timer: a leader cut off from its peers lets
                // go of Pulsar even when it has nothing to send.
                let holding = topics.values().any(|t| t.producer.is_some());
                if holding && !self.confirm_lease().await {
                    return Ok(TermEnd::LostLease);
                }
                tokio::select! {
                    _ = metrics_rx.changed() => {}
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    _ = self.shutdown.cancelled() => return Ok(TermEnd::Shutdown),
                }
            }
        }
    }

    /// Confirms leadership with a quorum. Without a quorum the confirmation
    /// may never answer, so it is bounded by less than an election timeout:
    /// by then a majority elsewhere may already have a new leader.
    async fn confirm_lease(&self) -> bool {
        let ok = matches!(
            tokio::time::timeout(self.lease_timeout, self.raft.ensure_linearizable()).await,
            Ok(Ok(_))
        );
        if ok {
            self.liveness.lease_confirmed();
        }
        ok
    }

    /// Sends the next batch of one topic without awaiting its receipts.
    /// Returns whether there was anything to send.
    async fn send_batch(
        &self,
        pulsar: &Pulsar<TokioExecutor>,
        tp: &mut TopicPublisher,
        term: u64,
    ) -> Result<bool, Error> {
        if tp.producer.is_none() {
            let name = format!(
                "firstseen-{}-t{}-{}",
                self.node_id,
                term,
                tail::scratch_subscription("p")
            );
            let producer = pulsar
                .producer()
                .with_topic(tp.topic.clone())
                .with_name(name.clone())
                .with_options(ProducerOptions {
                    access_mode: Some(ACCESS_EXCLUSIVE),
                    block_queue_if_full: true,
                    ..Default::default()
                })
                .build()
                .await?;
            // Only now, holding exclusive access, is the tail stable.
            let wait = Duration::from_millis(self.config.operation_timeout_ms);
            let tail_seq = tail::last_seq(pulsar, &tp.topic, wait).await?;
            let watermark = self.state.topic_state(&tp.topic)?.published_seq;
            tp.next_seq = policy::resume_at(tail_seq, watermark);
            tracing::info!(topic = %tp.topic, producer = %name, tail = ?tail_seq, watermark, resume_at = tp.next_seq, "exclusive producer acquired");
            tp.producer = Some(producer);
        }
        let batch = self
            .outbox
            .read(&tp.topic, tp.next_seq, self.config.publish_batch)?;
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
        let mut receipts = Vec::with_capacity(batch.len());
        let mut last = tp.next_seq;
        for (seq, m) in batch {
            receipts.push(send(producer, seq, m).await?);
            last = seq;
        }
        tp.in_flight.push_back(InFlight {
            receipts,
            last,
            messages: last + 1 - tp.next_seq,
            started,
        });
        tp.next_seq = last + 1;
        Ok(true)
    }

    /// Warns once per term when the namespace does not deduplicate: without
    /// it, a resend by the crate after a reconnect can duplicate a message.
    async fn check_broker_dedup(&self) {
        if self.config.admin_url.is_none() {
            return;
        }
        // One client and one token for every topic: with OAuth2 each token
        // is a request to the issuer.
        let admin = match Admin::new(&self.config).await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "could not check broker deduplication");
                return;
            }
        };
        let topics = self.state.topics().unwrap_or_default();
        for (topic, _) in topics.iter().take(8) {
            match admin.dedup_enabled(topic).await {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!(topic = %topic, "broker deduplication is off for this topic; see docs/exactly-once.md")
                }
                Err(e) => {
                    tracing::warn!(topic = %topic, error = %e, "could not check broker deduplication")
                }
            }
        }
    }
}

async fn send(
    producer: &mut Producer<TokioExecutor>,
    seq: u64,
    m: OutboxMessage,
) -> Result<pulsar::producer::SendFuture, Error> {
    let key = hex::encode(m.key);
    let mut message = producer
        .create_message()
        .with_content(m.payload)
        .with_key(key.clone())
        .with_property(props::SEQ, seq.to_string())
        .with_property(props::KEY, key)
        .with_property(props::MQTT_TOPIC, m.mqtt_topic)
        .with_property(props::NODE, m.node.to_string())
        .with_property(props::FIRST_SEEN_MS, m.first_seen_ms.to_string())
        .event_time(m.first_seen_ms);
    if let Some(p) = &m.properties {
        for (k, v) in props::mqtt5(p) {
            message = message.with_property(k, v);
        }
    }
    Ok(message.send_non_blocking().await?)
}

/// The admin REST API, with the same CA and credentials as the broker
/// connection.
pub struct Admin {
    url: String,
    client: reqwest::Client,
    token: Option<String>,
}

impl Admin {
    pub async fn new(config: &PulsarConfig) -> Result<Self, Error> {
        let url = config
            .admin_url
            .as_deref()
            .ok_or_else(|| Error::setting("pulsar.admin_url", "is not set"))?
            .trim_end_matches('/')
            .to_string();
        Ok(Self {
            url,
            client: admin_client(config)?,
            token: auth::admin_token(config).await?,
        })
    }

    /// Whether deduplication applies to `topic`.
    pub async fn dedup_enabled(&self, topic: &str) -> Result<bool, Error> {
        let path = topic
            .strip_prefix("persistent://")
            .ok_or_else(|| Error::topic(topic, TopicProblem::NotPersistent))?;
        let url = format!(
            "{}/admin/v2/persistent/{path}/deduplicationEnabled?applied=true",
            self.url
        );
        let mut request = self.client.get(&url);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let body = request
            .send()
            .await
            .map_err(Error::Admin)?
            .error_for_status()
            .map_err(Error::Admin)?
            .text()
            .await
            .map_err(Error::Admin)?;
        Ok(body.trim() == "true")
    }
}
