//! The publisher's ports as a node has them: Pulsar through our own
//! producer (`producer`) for sending and the `pulsar` crate for lookups and
//! the tail read, the group through openraft and the proposer, the outbox
//! through the replicated state and the Raft log.

use std::sync::Arc;
use std::time::Duration;

use firstseen_raft::{Member, Raft};
use firstseen_store::{OutboxMessage, StateStore, TopicState};
use openraft::metrics::{RaftDataMetrics, RaftServerMetrics};
use openraft::LogId;
use pulsar::{Pulsar, TokioExecutor};
use tokio::sync::watch;

use super::port::{Broker, Consensus, Outbox, Receipt, SendError, Sending, Session};
use super::producer::{self, entry::Outgoing, Producer, Producers};
use super::{connect, props, tail, Admin};
use crate::cluster::liveness::Liveness;
use crate::propose::Proposer;
use crate::publish::config::PulsarConfig;
use crate::Error;

/// Pulsar, as configured in `[pulsar]`.
pub struct PulsarBroker {
    pub config: PulsarConfig,
    /// The topics whose broker-side deduplication is checked at connect.
    pub state: StateStore,
    /// Which producers' messages the tail read counts as this cluster's.
    pub ours: tail::Ours,
}

impl Broker for PulsarBroker {
    type Session = PulsarSession;

    async fn connect(&self) -> Result<PulsarSession, SendError> {
        let client = connect(&self.config).await.map_err(|e| match e {
            Error::Pulsar(p) => sort(&p),
            other => SendError::Lost(other.to_string()),
        })?;
        let admin = self.admin().await;
        let limit = match &admin {
            Some(admin) => self.check_broker(admin).await,
            None if self.config.admin_url.is_some() => {
                // Configured, so the fence before the tail read is expected
                // (`PulsarSession::settled`); a term without it could resume
                // under a predecessor's writes. The term is tried again.
                return Err(SendError::Lost(
                    "the admin API (pulsar.admin_url) could not be set up; it is needed to wait out a predecessor's writes".into(),
                ));
            }
            None => {
                tracing::warn!(
                    "pulsar.admin_url is not set: a new leader cannot wait for writes a predecessor left pending at the broker before it reads the topic's end, and may publish those messages again (see docs/exactly-once.md, \"Writes in flight when a connection drops\")"
                );
                None
            }
        };
        let operation_timeout = self.config.operation_timeout();
        let unusable = |e: Error| SendError::Lost(e.to_string());
        let auth = match super::auth::provider(&self.config).map_err(unusable)? {
            Some(mut a) => {
                a.initialize()
                    .await
                    .map_err(|e| unusable(Error::Credentials(e)))?;
                Some(Arc::new(tokio::sync::Mutex::new(a)))
            }
            None => None,
        };
        let producers = Producers::new(producer::conn::Target {
            url: String::new(),
            proxy_to: None,
            tls: self.tls().map_err(unusable)?,
            auth,
            timeout: operation_timeout,
        });
        Ok(PulsarSession {
            client,
            producers,
            operation_timeout,
            ours: self.ours.clone(),
            admin,
            limit,
            max_message_bytes: self.config.max_message_bytes,
        })
    }
}

impl PulsarBroker {
    /// TLS for `pulsar+ssl://` brokers (none for `pulsar://`).
    fn tls(&self) -> Result<Option<Arc<rustls::ClientConfig>>, Error> {
        if !self.config.url.starts_with("pulsar+ssl://") {
            return Ok(None);
        }
        crate::tls::pulsar::client_config(
            self.config.ca_file.as_deref(),
            self.config.tls_hostname_verification,
        )
        .map(Some)
        .map_err(|e| Error::setting(e.key, e.problem.to_string()))
    }

    /// The admin API for this term, when it is configured: one client and
    /// one token for every call (with OAuth2 each token is a request to the
    /// issuer).
    async fn admin(&self) -> Option<Admin> {
        self.config.admin_url.as_ref()?;
        match Admin::new(&self.config).await {
            Ok(a) => Some(a),
            Err(e) => {
                tracing::warn!(error = %e, "could not reach the admin API to check the broker");
                None
            }
        }
    }

    /// Once per term, through the admin API: warns when the namespace does
    /// not deduplicate (a second guard for consumers that rely on it; the
    /// producer itself never resends), and returns the
    /// broker's `maxMessageSize`. A broker that takes less than
    /// `pulsar.max_message_bytes` closes the connection on a larger message,
    /// which the publisher would send again after every reconnect; knowing
    /// the broker's bound, it sends such a message as a marker instead.
    async fn check_broker(&self, admin: &Admin) -> Option<usize> {
        let limit = match admin.max_message_size().await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "could not read the broker's maxMessageSize");
                None
            }
        };
        if let Some(l) = limit.filter(|l| *l < self.config.max_message_bytes) {
            tracing::warn!(
                broker_max_message_size = l,
                configured = self.config.max_message_bytes,
                "the broker takes smaller messages than pulsar.max_message_bytes; larger ones go as markers"
            );
        }
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
        limit
    }
}

/// Pulsar for one leadership term: the crate's client for lookups and the
/// tail read, and our producers' connections.
pub struct PulsarSession {
    client: Pulsar<TokioExecutor>,
    producers: Producers,
    /// `pulsar.operation_timeout_ms`: the longest wait for the tail's last
    /// message.
    operation_timeout: Duration,
    ours: tail::Ours,
    /// The admin API, when configured.
    admin: Option<Admin>,
    /// The broker's `maxMessageSize`, when the admin API said.
    limit: Option<usize>,
    /// `pulsar.max_message_bytes`: no entry is larger.
    max_message_bytes: usize,
}

impl PulsarSession {
    /// What a tail read of `topic` is told: a few operation timeouts for
    /// the whole read, enough for a busy topic's last ledger and bounded
    /// whatever is in it.
    fn tail_query<'a>(&self, topic: &'a str, assigned: u64, strict: bool) -> tail::TailQuery<'a> {
        tail::TailQuery {
            topic,
            assigned,
            strict,
            budget: self.operation_timeout.saturating_mul(3),
        }
    }

    /// Waits, holding `topic`'s exclusive producer, until the broker holds
    /// no write of the topic it has taken and not yet persisted, at most
    /// one operation timeout; fails with [`SendError::WritesPending`] after
    /// that, or when the admin API cannot tell.
    ///
    /// Why: a producer whose connection dropped (a leader killed, cut off,
    /// or paused until the broker gave up on it) is closed by the broker at
    /// once, and exclusive access goes to the next producer, while that
    /// producer's writes can still sit in the managed ledger, waiting for
    /// slow bookies. The broker's last message id is the last one the
    /// bookies confirmed, so a tail read then resumes before those writes,
    /// and they land after all, beside the same messages sent again. Only
    /// once nothing is pending is the topic's end final: no other producer
    /// can add to it while this one holds exclusive access.
    ///
    /// Without `pulsar.admin_url` this cannot be checked; such acquisitions
    /// are counted in `firstseen_publish_unfenced_total` (and `connect`
    /// warned once for the term).
    async fn settled(&self, topic: &str) -> Result<(), SendError> {
        let Some(admin) = &self.admin else {
            metrics::counter!("firstseen_publish_unfenced_total").increment(1);
            return Ok(());
        };
        let started = tokio::time::Instant::now();
        let deadline = started + self.operation_timeout;
        let mut pause = Duration::from_millis(20);
        let mut waited = false;
        loop {
            let why = match tokio::time::timeout_at(deadline, admin.pending_adds(topic)).await {
                Ok(Ok(Some(0))) => {
                    if waited {
                        tracing::info!(
                            topic,
                            waited_ms = started.elapsed().as_millis() as u64,
                            "writes an earlier producer left pending have settled; reading the topic's end"
                        );
                    }
                    return Ok(());
                }
                Ok(Ok(Some(n))) => format!("{n} writes still pending at the broker"),
                Ok(Ok(None)) => {
                    "the broker's internal stats have no pendingAddEntriesCount".to_string()
                }
                Ok(Err(e)) => format!("could not read the topic's internal stats: {e}"),
                Err(_) => "the topic's internal stats did not come in time".to_string(),
            };
            if !waited {
                tracing::info!(topic, why = %why, "waiting for writes an earlier producer left pending before reading the topic's end");
                waited = true;
            }
            if tokio::time::Instant::now() + pause >= deadline {
                metrics::counter!("firstseen_publish_writes_pending_total").increment(1);
                return Err(SendError::WritesPending(format!(
                    "{topic}: {why} after {} ms",
                    started.elapsed().as_millis()
                )));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(250));
        }
    }
}

impl Session for PulsarSession {
    type Producer = Producer;

    async fn exclusive(&self, topic: &str, name: &str) -> Result<Self::Producer, SendError> {
        let at = self
            .client
            .lookup_topic(topic)
            .await
            .map_err(|e| sort(&e))?;
        // Entries stay under what the broker takes for this topic.
        let limit = self
            .message_limit(topic)
            .await
            .map_or(self.max_message_bytes, |l| l.min(self.max_message_bytes));
        let proxy_to = at.proxy.then_some(at.broker_url);
        let producer = self
            .producers
            .exclusive(at.url.as_str(), proxy_to, topic, name, limit)
            .await?;
        // Exclusive access is no fence on its own: the broker hands it over
        // as soon as the holder's connection drops, with that holder's
        // writes still pending. On an error the producer is dropped here.
        self.settled(topic).await?;
        Ok(producer)
    }

    async fn message_limit(&self, topic: &str) -> Option<usize> {
        let own = match &self.admin {
            Some(admin) => match admin.topic_max_message_size(topic).await {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(topic, error = %e, "could not read the topic's maxMessageSize policy");
                    None
                }
            },
            None => None,
        };
        if let Some(l) = own {
            tracing::info!(
                topic,
                max_message_size = l,
                "the topic sets its own maxMessageSize; larger messages go as markers"
            );
        }
        match (own, self.limit) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    async fn last_seq(
        &self,
        topic: &str,
        assigned: u64,
        strict: bool,
    ) -> Result<tail::Tail, super::Error> {
        tail::last_seq(
            &self.client,
            &self.ours,
            self.tail_query(topic, assigned, strict),
        )
        .await
    }

    async fn read_tail(
        &self,
        topic: &str,
        assigned: u64,
        watermark: u64,
        strict: bool,
    ) -> Result<tail::Tail, super::Error> {
        let q = self.tail_query(topic, assigned, strict);
        tail::landed(&self.client, &self.ours, q, watermark).await
    }

    async fn send(
        &self,
        producer: &mut Self::Producer,
        seq: u64,
        message: OutboxMessage,
        how: Sending,
    ) -> Result<Receipt, SendError> {
        let alone = how.alone;
        let outgoing = outgoing(producer.topic(), seq, message, how, self.ours.proofs());
        producer.push(outgoing, alone).await
    }

    async fn flush(&self, producer: &mut Self::Producer) -> Result<(), SendError> {
        producer.flush().await
    }
}

/// Message `seq` as it goes into an entry: its body in the route's format
/// (or nothing, for a marker), firstseen's properties, and the cluster's
/// proof over both (v2: every property counts, `super::proof`).
fn outgoing(
    topic: &str,
    seq: u64,
    m: OutboxMessage,
    how: Sending,
    proofs: &super::proof::ProofKeys,
) -> Outgoing {
    let key = hex::encode(m.key);
    let (body, format_props) = match how.set_aside {
        Some(_) => (Vec::new(), Vec::new()),
        None => how.format.encode(&m.mqtt_topic, m.payload, m.first_seen_ms),
    };
    let marker = how.set_aside.is_some();
    let mut properties = vec![
        (props::SEQ.to_string(), seq.to_string()),
        (props::KEY.to_string(), key.clone()),
        (props::MQTT_TOPIC.to_string(), m.mqtt_topic),
        (props::NODE.to_string(), m.node.to_string()),
        (
            props::FIRST_SEEN_MS.to_string(),
            m.first_seen_ms.to_string(),
        ),
    ];
    properties.extend(format_props.into_iter().map(|(k, v)| (k.to_string(), v)));
    if how.late {
        properties.push((props::LATE.to_string(), "true".to_string()));
    }
    // Generation 0 writes nothing: a cluster never recovered writes what
    // it wrote before generations.
    if how.generation > 0 {
        properties.push((props::GENERATION.to_string(), how.generation.to_string()));
    }
    match how.set_aside {
        // The marker carries no MQTT 5 properties: they may be what made
        // the message too large.
        Some(reason) => properties.push((props::SET_ASIDE.to_string(), reason)),
        None => {
            if let Some(p) = &m.properties {
                properties.extend(props::mqtt5(p));
            }
        }
    }
    // Over the body and the properties as they go: a reader checks what
    // it reads.
    let view: Vec<(&str, &str)> = properties
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let proof = proofs.prove(&super::proof::Message {
        claim: super::proof::Claim {
            topic,
            seq,
            key: &m.key,
            marker,
            body: &body,
        },
        properties: &view,
    });
    properties.push((props::PROOF.to_string(), proof));
    Outgoing {
        seq,
        key,
        properties,
        event_time: m.first_seen_ms,
        body,
    }
}

/// The proof `outgoing` writes, checked as the tail read and `verify`
/// check what they read back.
#[cfg(test)]
mod proven {
    use super::*;
    use crate::publish::format::Format;
    use crate::publish::tail::{Origin, Ours};
    use crate::secret::ClusterKey;

    const TOPIC: &str = "persistent://public/default/t";

    fn ours() -> Ours {
        Ours::new(
            &ClusterKey::from_secret(b"the cluster's secret"),
            &[],
            false,
        )
    }

    /// Message 5 as the publisher writes it: in the transitdata envelope
    /// (the format's properties), with an MQTT 5 property, late or not.
    fn written(ours: &Ours, late: bool) -> (pulsar::proto::MessageMetadata, Vec<u8>) {
        written_in(ours, late, 0)
    }

    /// As `written`, by a cluster of generation `generation`.
    fn written_in(
        ours: &Ours,
        late: bool,
        generation: u64,
    ) -> (pulsar::proto::MessageMetadata, Vec<u8>) {
        let m = OutboxMessage {
            key: [7; 32],
            mqtt_topic: "sensors/1".into(),
            payload: b"21.5".to_vec(),
            node: 2,
            first_seen_ms: 1_700_000_000_000,
            properties: Some(Box::new(firstseen_store::Properties {
                user: vec![("unit".into(), "C".into())],
                ..Default::default()
            })),
        };
        let how = Sending {
            set_aside: None,
            late,
            format: Format::Transitdata,
            generation,
            alone: false,
        };
        let out = outgoing(TOPIC, 5, m, how, ours.proofs());
        let meta = pulsar::proto::MessageMetadata {
            producer_name: ours.producer_name("p"),
            properties: out
                .properties
                .into_iter()
                .map(|(key, value)| pulsar::proto::KeyValue { key, value })
                .collect(),
            ..Default::default()
        };
        (meta, out.body)
    }

    fn set(meta: &mut pulsar::proto::MessageMetadata, name: &str, value: &str) {
        match meta.properties.iter_mut().find(|kv| kv.key == name) {
            Some(kv) => kv.value = value.into(),
            None => meta.properties.push(pulsar::proto::KeyValue {
                key: name.into(),
                value: value.into(),
            }),
        }
    }

    /// Issue 48: the proof left `firstseen-late`, the MQTT topic, the
    /// first-seen time and the format out, so a copy of a real message
    /// with any of them changed was the cluster's. Each changed now makes
    /// it forged. (With `outgoing` signing v1, as before, every case but
    /// the first fails this test.)
    #[test]
    fn each_property_changed_on_a_real_message_makes_it_forged() {
        let o = ours();
        let (meta, body) = written(&o, false);
        assert_eq!(o.origin(TOPIC, &meta, &body, Some(9)), Origin::Proven(5));
        let (late, late_body) = written(&o, true);
        assert_eq!(
            o.origin(TOPIC, &late, &late_body, Some(9)),
            Origin::Proven(5)
        );
        // The late flag taken off a late message, put on another.
        let mut unlate = late.clone();
        unlate.properties.retain(|kv| kv.key != props::LATE);
        assert_eq!(o.origin(TOPIC, &unlate, &body, Some(9)), Origin::Forged);
        for (name, value) in [
            (props::LATE, "true"),
            (props::MQTT_TOPIC, "sensors/2"),
            (props::FIRST_SEEN_MS, "1"),
            (props::NODE, "3"),
            (crate::publish::format::SCHEMA, "other"),
            (crate::publish::format::SOURCE_TS, "1"),
            ("mqtt-user-unit", "F"),
            (props::SET_ASIDE, "too large"),
        ] {
            let mut changed = meta.clone();
            set(&mut changed, name, value);
            assert_eq!(
                o.origin(TOPIC, &changed, &body, Some(9)),
                Origin::Forged,
                "{name}"
            );
        }
        // The format's properties taken off (written raw, in name).
        let mut raw = meta.clone();
        raw.properties
            .retain(|kv| kv.key != crate::publish::format::SCHEMA);
        assert_eq!(o.origin(TOPIC, &raw, &body, Some(9)), Origin::Forged);
    }

    /// A recovered cluster's messages carry its generation under the
    /// proof; generation 0 writes no property (what a cluster never
    /// recovered wrote before generations), and the generation taken off
    /// or changed makes the message forged.
    #[test]
    fn the_generation_is_written_and_proven() {
        let o = ours();
        let (plain, body) = written_in(&o, false, 0);
        assert_eq!(props::get(&plain, props::GENERATION), None);
        assert_eq!(o.generation_above(TOPIC, &plain, &body, 0), None);
        let (meta, body) = written_in(&o, false, 2);
        assert_eq!(props::get(&meta, props::GENERATION), Some("2"));
        assert_eq!(o.origin(TOPIC, &meta, &body, Some(9)), Origin::Proven(5));
        assert_eq!(o.generation_above(TOPIC, &meta, &body, 1), Some(2));
        assert_eq!(o.generation_above(TOPIC, &meta, &body, 2), None);
        let mut changed = meta.clone();
        set(&mut changed, props::GENERATION, "3");
        assert_eq!(o.origin(TOPIC, &changed, &body, Some(9)), Origin::Forged);
        assert_eq!(o.generation_above(TOPIC, &changed, &body, 0), None);
        let mut taken_off = meta.clone();
        taken_off
            .properties
            .retain(|kv| kv.key != props::GENERATION);
        assert_eq!(o.origin(TOPIC, &taken_off, &body, Some(9)), Origin::Forged);
    }
}

/// Sorts the client's error into what the publisher decides on: by the
/// broker's refusal code and the client's error variant, never by text.
fn sort(e: &pulsar::Error) -> SendError {
    use pulsar::error::{ConnectionError, ProducerError};
    use pulsar::proto::ServerError;
    let text = e.to_string();
    if matches!(e, pulsar::Error::Producer(ProducerError::Fenced))
        || matches!(
            server_error(e),
            Some(ServerError::ProducerBusy | ServerError::ProducerFenced)
        )
    {
        return SendError::HeldElsewhere(text);
    }
    // The broker answered the send with an error instead of a receipt, the
    // producer and its connection still up. The client carries the code
    // only in text; the variant is what is decided on.
    if matches!(
        e,
        pulsar::Error::Producer(ProducerError::Connection(
            ConnectionError::UnexpectedResponse(_)
        ))
    ) {
        return SendError::Refused(text);
    }
    SendError::Lost(text)
}

/// The broker's refusal code inside a client error, wherever the client
/// put it: on the connection, on the producer's connection, or on a batch.
fn server_error(error: &pulsar::Error) -> Option<pulsar::proto::ServerError> {
    use pulsar::error::{ConnectionError, ProducerError, ServiceDiscoveryError};
    let connection = match error {
        pulsar::Error::Connection(c) => c,
        pulsar::Error::Producer(ProducerError::Connection(c)) => c,
        pulsar::Error::Producer(ProducerError::Batch(inner)) => return server_error(inner),
        pulsar::Error::ServiceDiscovery(ServiceDiscoveryError::Query(code, _)) => return *code,
        pulsar::Error::ServiceDiscovery(ServiceDiscoveryError::Connection(c)) => c,
        _ => return None,
    };
    match connection {
        ConnectionError::PulsarError(code, _) => *code,
        _ => None,
    }
}

/// The Raft group through openraft, with receipts proposed through the
/// node's proposer.
pub struct RaftGroup {
    pub raft: Raft,
    pub proposer: Proposer,
    /// Lease confirmations are recorded here, for readiness.
    pub liveness: Arc<Liveness>,
    /// Longest wait for a quorum to confirm the lease: below the election
    /// timeout, so a leader cut off lets go before a successor can exist.
    pub lease_timeout: Duration,
    /// A confirmation younger than this (by the publisher or the lease
    /// watch) stands for a new one: one heartbeat interval.
    pub lease_fresh: Duration,
    /// openraft's server metrics: vote, role, leader and membership. They
    /// change with leadership only, not with every apply or replication
    /// ack as the full metrics do, so `changed` wakes the publisher for
    /// what it means; `Outbox::grown` wakes it for new messages.
    pub metrics: watch::Receiver<RaftServerMetrics<u64, Member>>,
}

impl Consensus for RaftGroup {
    fn leadership(&mut self) -> (u64, Option<u64>) {
        // Marked seen: `changed` then waits for the next change instead of
        // returning at once for one the publisher has already acted on (an
        // idle publisher confirms its lease on each wake-up).
        let m = self.metrics.borrow_and_update();
        (m.vote.leader_id().term, m.current_leader)
    }

    async fn changed(&mut self) {
        // Once openraft's core stopped (a storage error) nothing changes any
        // more, and the storage watchdog stops the node; this waits rather
        // than let the publisher spin until it does.
        crate::propose::metrics_changed(&mut self.metrics).await;
    }

    async fn confirm_lease(&self) -> bool {
        // Confirmed by a quorum within the last heartbeat: no successor can
        // exist yet (followers wait an election timeout, four heartbeats,
        // before they campaign), and a quorum round per batch put a
        // follower's append-and-fsync in front of every batch. G2 does not
        // rest on the lease: the exclusive producer and the tail read do
        // (docs/exactly-once.md, "The stale-producer hazard").
        if self
            .liveness
            .lease_age()
            .is_some_and(|age| age < self.lease_fresh)
        {
            return true;
        }
        let ok = matches!(
            tokio::time::timeout(self.lease_timeout, self.raft.ensure_linearizable()).await,
            Ok(Ok(_))
        );
        if ok {
            self.liveness.lease_confirmed();
        }
        ok
    }

    async fn read_barrier(&self) -> bool {
        // Never the lease's fast path: it must wait for the apply.
        let barrier = async {
            self.raft.ensure_linearizable().await.ok()?;
            // openraft's read index is not enough on its own for a leader
            // it restored at start (a node whose own vote was committed
            // resumes as leader without an election): it is the larger of
            // that leader's first entry, perhaps long ago, and the commit
            // index read from disk, which is not synced on its own and
            // after a power cut lags what was committed and published
            // before it. The tail then held sequences beyond what the
            // outbox had assigned, they counted as foreign, and the
            // publisher sent them again (a power cut of every node in CI:
            // 36 keys twice). Every entry in a leader's log gets
            // committed while it leads, so waiting for all of them to be
            // applied covers whatever any predecessor can have published.
            let last = self.raft.metrics().borrow().last_log_index;
            self.raft
                .wait(None)
                .applied_index_at_least(last, "read barrier")
                .await
                .ok()
        };
        let ok = matches!(
            tokio::time::timeout(self.lease_timeout, barrier).await,
            Ok(Some(_))
        );
        if ok {
            self.liveness.lease_confirmed();
        }
        ok
    }

    fn watermark(&self, topic: String, seq: u64) {
        self.proposer.watermark(topic, seq);
    }

    async fn set_aside(&self, record: firstseen_store::SetAside) -> Result<(), super::Error> {
        self.proposer
            .coalescer
            .append(firstseen_store::Command::SetAside(Box::new(record)))
            .await
            .map_err(super::Error::SetAside)
    }

    async fn rebase(&self, rebase: firstseen_store::Rebase) -> Result<(), super::Error> {
        self.proposer
            .coalescer
            .append(firstseen_store::Command::Rebase(Box::new(rebase)))
            .await
            .map_err(|e| Error::raft("commit a rebase", e).into())
    }
}

/// The outbox in the replicated state, payloads read from the Raft log.
pub struct StateOutbox {
    pub state: StateStore,
    pub outbox: firstseen_raft::Outbox,
    /// openraft's data metrics: `last_applied` moves when apply has put
    /// new messages in the outbox.
    pub applied: watch::Receiver<RaftDataMetrics<u64>>,
    /// The `last_applied` that `grown` last returned on.
    pub seen: Option<LogId<u64>>,
}

impl Outbox for StateOutbox {
    fn topics(&self) -> Result<Vec<(String, TopicState)>, Error> {
        Ok(self.state.topics()?)
    }

    fn level(&self) -> u32 {
        self.state.level()
    }

    fn generation(&self) -> u64 {
        self.state.generation()
    }

    fn topic(&self, topic: &str) -> Result<TopicState, Error> {
        Ok(self.state.topic_state(topic)?)
    }

    fn read(
        &self,
        topic: &str,
        from: u64,
        limit: usize,
    ) -> Result<Vec<(u64, OutboxMessage)>, Error> {
        Ok(self.outbox.read(topic, from, limit)?)
    }

    fn applied_at(&self, topic: &str, seq: u64) -> Option<std::time::Instant> {
        self.state.applied_at(topic, seq)
    }

    async fn grown(&mut self) {
        loop {
            // The data metrics also change with replication progress; only
            // a new applied index can mean new messages.
            let now = self.applied.borrow_and_update().last_applied;
            if now != self.seen {
                self.seen = now;
                return;
            }
            crate::propose::metrics_changed(&mut self.applied).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pulsar::error::{ConnectionError, ProducerError};
    use pulsar::proto::ServerError;

    /// The client's errors as the publisher's policy meets them: a topic
    /// held by another producer wherever the client put the broker's code,
    /// a refusal of the one message, and anything else lost. Never by the
    /// words of a message.
    #[test]
    fn the_client_s_errors_are_sorted_by_code_and_variant() {
        let refused = |code| {
            pulsar::Error::Connection(ConnectionError::PulsarError(
                Some(code),
                Some("Exclusive access mode".into()),
            ))
        };
        assert!(matches!(
            sort(&refused(ServerError::ProducerBusy)),
            SendError::HeldElsewhere(_)
        ));
        assert!(matches!(
            sort(&refused(ServerError::ProducerFenced)),
            SendError::HeldElsewhere(_)
        ));
        assert!(matches!(
            sort(&pulsar::Error::Producer(ProducerError::Fenced)),
            SendError::HeldElsewhere(_)
        ));
        assert!(matches!(
            sort(&pulsar::Error::Producer(ProducerError::Connection(
                ConnectionError::PulsarError(Some(ServerError::ProducerBusy), None)
            ))),
            SendError::HeldElsewhere(_)
        ));
        assert!(matches!(
            sort(&pulsar::Error::Producer(ProducerError::Connection(
                ConnectionError::UnexpectedResponse("send_error".into())
            ))),
            SendError::Refused(_)
        ));
        assert!(matches!(
            sort(&refused(ServerError::AuthorizationError)),
            SendError::Lost(_)
        ));
        assert!(matches!(
            sort(&pulsar::Error::Connection(ConnectionError::Disconnected)),
            SendError::Lost(_)
        ));
    }
}
