//! Ingest: one task per upstream MQTT broker.
//!
//! Each task holds a persistent session (clean session off, a stable client
//! id) with manual acks, turns every PUBLISH into an [`Observation`] keyed by
//! its route, and hands it to the batcher together with an [`AckToken`]. It
//! never acks anything itself: the batcher does, through the [`AckGate`],
//! after commit (G4).

pub mod ack;
pub mod adapter;
pub mod bound;
pub mod config;
pub mod filter;
pub mod port;
pub mod route;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use firstseen_store::{NodeId, Observation};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::deadletter::{self, DeadLetter};
use crate::dedup::OversizePolicy;
use ack::{AckGate, AckToken};
use config::UpstreamConfig;
use port::{Event, Message, SessionError, UpstreamClient, UpstreamSession};

pub use config::{BadUpstreamUrl, UpstreamAddr};

/// One message on its way to the batcher.
#[derive(Debug)]
pub struct Received {
    /// The copy to propose, or `None` for a message handled here (dead-letter
    /// or drop) that still needs its ack in receive order.
    pub observation: Option<Observation>,
    /// Its MQTT 5 properties, if it had any.
    pub properties: Option<Box<firstseen_store::Properties>>,
    /// Which rule made its key (the route's kind, or `topic+payload` for a
    /// field key that fell back to the bytes).
    pub kind: firstseen_store::KeyKind,
    /// `None` for QoS 0, which is never acked.
    pub ack: Option<AckToken>,
    /// When the upstream's event loop handed it over: the start of the
    /// `receive` stage of `firstseen_stage_seconds`. Tokio's clock, the
    /// batcher's.
    pub received_at: tokio::time::Instant,
}

/// Live state of one upstream, read by status and readiness.
#[derive(Debug, Default)]
pub struct UpstreamStatus {
    pub connected: AtomicBool,
    pub received: AtomicU64,
    pub last_error: std::sync::Mutex<Option<String>>,
}

/// Everything one upstream task needs.
pub struct Upstream {
    pub index: usize,
    pub config: UpstreamConfig,
    pub client_id: String,
    pub node: NodeId,
    /// The routes now: a reload replaces them while the node runs.
    pub routes: Arc<route::LiveRoutes>,
    /// The subscriptions now, (filter, qos): a reload sends new ones, and
    /// the session subscribes and unsubscribes the difference.
    pub subscriptions: LiveSubscriptions,
    /// What one message may cost; over it, `oversize` decides.
    pub limits: bound::Limits,
    pub oversize: OversizePolicy,
    pub dead_letter: DeadLetter,
    pub gate: Arc<AckGate>,
    pub status: Arc<UpstreamStatus>,
    /// No dead letter is written while the disk is below its reserve.
    pub disk: Arc<crate::diskspace::DiskSpace>,
    /// Stamps each observation: the leader's window reads these readings.
    pub clock: SharedClock,
}

impl Upstream {
    /// Builds the upstream tasks' inputs from `[[upstreams]]` and
    /// `[dedup]`, on node `cx`.
    pub fn build(
        upstreams: &[UpstreamConfig],
        dedup: &crate::dedup::DedupConfig,
        cx: &crate::context::NodeCx,
        routes: Arc<route::LiveRoutes>,
        disk: Arc<crate::diskspace::DiskSpace>,
        clock: SharedClock,
        dead_letter: DeadLetter,
    ) -> Vec<Upstream> {
        upstreams
            .iter()
            .enumerate()
            .map(|(index, u)| Upstream {
                index,
                client_id: u.client_id_on(cx.id),
                config: u.clone(),
                node: cx.id,
                routes: routes.clone(),
                subscriptions: Arc::new(tokio::sync::watch::channel(subscriptions(u)).0),
                limits: dedup.limits(),
                oversize: dedup.oversize,
                dead_letter: dead_letter.clone(),
                gate: Arc::new(AckGate::new()),
                status: Arc::new(UpstreamStatus::default()),
                disk: disk.clone(),
                clock: clock.clone(),
            })
            .collect()
    }

    /// Connects with rumqttc and runs until `shutdown`, then keeps the
    /// connection up until `acks_done` so that the batcher's last acks reach
    /// the broker.
    pub async fn run(
        self,
        tx: mpsc::Sender<Received>,
        shutdown: CancellationToken,
        acks_done: CancellationToken,
    ) -> Result<(), crate::Error> {
        let options = adapter::options(&self)?;
        if options.v5 {
            let (client, session) = adapter::v5::connect(options);
            self.drive(Arc::new(client), session, tx, shutdown, acks_done)
                .await
        } else {
            let (client, session) = adapter::v4::connect(options);
            self.drive(Arc::new(client), session, tx, shutdown, acks_done)
                .await
        }
    }

    /// [`Upstream::run`] on any session behind the port: subscribes when
    /// the broker has no session, hands each message to the batcher, and
    /// after a failed connection starts a new ack epoch and reconnects with
    /// backoff.
    pub async fn drive(
        self,
        client: Arc<dyn UpstreamClient>,
        mut session: impl UpstreamSession,
        tx: mpsc::Sender<Received>,
        shutdown: CancellationToken,
        acks_done: CancellationToken,
    ) -> Result<(), crate::Error> {
        self.gate.attach(client.clone());
        let mut live = self.subscriptions.subscribe();
        let mut filters: Vec<(String, u8)> = live.borrow_and_update().clone();
        let name = self.config.name.clone();
        let mut backoff = Duration::from_millis(100);
        let mut tx = Some(tx);
        loop {
            let event = tokio::select! {
                biased;
                _ = shutdown.cancelled(), if tx.is_some() => {
                    // Stop feeding the batcher; it flushes and acks what it has.
                    tx = None;
                    continue;
                }
                _ = acks_done.cancelled(), if tx.is_none() => break,
                Ok(()) = live.changed() => {
                    let now = live.borrow_and_update().clone();
                    let (added, removed) = subscription_changes(&filters, &now);
                    tracing::info!(upstream = %name, ?added, ?removed, "subscriptions reloaded");
                    // Queued on the session: a connection that fails before
                    // they go out subscribes to `now` when it comes back
                    // without a session; one with its session keeps the old
                    // set until the next reload.
                    if !removed.is_empty() && client.try_unsubscribe(&removed).is_err() {
                        tracing::error!(upstream = %name, "could not queue unsubscribe");
                    }
                    if !added.is_empty() && client.try_subscribe(&added).is_err() {
                        tracing::error!(upstream = %name, "could not queue subscribe");
                    }
                    filters = now;
                    continue;
                }
                event = session.poll() => event,
            };
            match event {
                Ok(Event::Connected { session_present }) => {
                    backoff = Duration::from_millis(100);
                    self.status.connected.store(true, Ordering::Relaxed);
                    metrics::gauge!("firstseen_upstream_connected", "upstream" => name.clone())
                        .set(1.0);
                    tracing::info!(upstream = %name, session_present, protocol = %self.config.protocol, "upstream connected");
                    if !session_present {
                        // A new session has no subscriptions; an existing one
                        // keeps them and its queued messages.
                        if client.try_subscribe(&filters).is_err() {
                            tracing::error!(upstream = %name, "could not queue subscribe");
                        }
                    }
                }
                Ok(Event::Subscribed { refused }) => {
                    // At a new session and after a reload only.
                    tracing::info!(upstream = %name, refused = refused.len(), "the broker acknowledged a subscribe");
                    for (i, reason) in refused {
                        let f = filters.get(i).map(|f| f.0.as_str()).unwrap_or("?");
                        tracing::error!(upstream = %name, filter = f, reason = %reason, "broker refused subscription");
                        self.note_error(format!("broker refused subscription to `{f}`: {reason}"));
                    }
                }
                Ok(Event::Message(m)) => {
                    let Some(sender) = &tx else {
                        // Shutting down: leave it unacked, the broker redelivers it.
                        continue;
                    };
                    let received = self.receive(m).await;
                    if sender.send(received).await.is_err() {
                        tracing::warn!(upstream = %name, "batcher stopped; leaving upstream");
                        break;
                    }
                }
                Ok(Event::Other) => {}
                Err(e) => {
                    self.status.connected.store(false, Ordering::Relaxed);
                    metrics::gauge!("firstseen_upstream_connected", "upstream" => name.clone())
                        .set(0.0);
                    metrics::counter!("firstseen_upstream_disconnects_total", "upstream" => name.clone()).increment(1);
                    self.gate.next_epoch(&mut session);
                    let reason = describe(&e, &self.config.url);
                    tracing::warn!(upstream = %name, error = %reason, retry_in_ms = backoff.as_millis() as u64, "upstream connection failed");
                    self.note_error(reason);
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = acks_done.cancelled() => break,
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                }
            }
        }
        client.try_disconnect();
        // Give the DISCONNECT (and any last acks) a moment to be written.
        session.flush_disconnect(Duration::from_millis(500)).await;
        self.status.connected.store(false, Ordering::Relaxed);
        // Left because the batcher is gone, not because the node is
        // stopping: its end is what the node's supervisor reports, and this
        // task ending now could be reported first, naming the wrong task.
        shutdown.cancelled().await;
        Ok(())
    }

    fn note_error(&self, e: String) {
        *firstseen_store::lock::lock(&self.status.last_error) = Some(e);
    }

    /// Turns one PUBLISH into what the batcher needs.
    async fn receive(&self, p: Message) -> Received {
        let received_at = tokio::time::Instant::now();
        let now = self.clock.now_ms();
        self.status.received.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("firstseen_messages_received_total", "upstream" => self.config.name.clone()).increment(1);
        let ack = (p.qos > 0).then(|| AckToken {
            upstream: self.index,
            epoch: self.gate.epoch(),
            pkid: p.pkid,
            qos: p.qos,
        });
        let qos_level = p.qos;
        let routes = self.routes.current();
        let Some(route) = route::route_for(&routes, &p.topic) else {
            self.set_aside("unrouted", &p, now).await;
            return Received {
                observation: None,
                properties: None,
                kind: firstseen_store::KeyKind::Unknown,
                ack,
                received_at,
            };
        };
        if let Err(why) = self
            .limits
            .check(&p.topic, &p.payload, p.properties.as_deref())
        {
            metrics::counter!("firstseen_oversize_total", "upstream" => self.config.name.clone())
                .increment(1);
            // A topic can be the oversized part: log its start only.
            let topic: String = p.topic.chars().take(200).collect();
            match self.oversize {
                OversizePolicy::Drop => {
                    tracing::warn!(upstream = %self.config.name, %topic, bound = why.kind(), reason = %why, "oversized message dropped by policy");
                }
                OversizePolicy::DeadLetter => {
                    tracing::warn!(upstream = %self.config.name, %topic, bound = why.kind(), reason = %why, "oversized message set aside");
                    self.set_aside("oversize", &p, now).await
                }
            }
            return Received {
                observation: None,
                properties: None,
                kind: firstseen_store::KeyKind::Unknown,
                ack,
                received_at,
            };
        }
        let key = match crate::key::key(&route.key, &p.topic, &p.payload) {
            Ok(k) => (route.key.kind(), k),
            Err(why) => {
                let missing = match &route.key {
                    crate::key::KeySpec::Fields(f) => f.missing,
                    crate::key::KeySpec::Bytes(_) => crate::key::Missing::Bytes,
                };
                metrics::counter!("firstseen_key_fallbacks_total", "policy" => match missing {
                    crate::key::Missing::Bytes => "bytes",
                    crate::key::Missing::DeadLetter => "dead-letter",
                })
                .increment(1);
                tracing::debug!(upstream = %self.config.name, topic = %p.topic, reason = %why, "no field key");
                match missing {
                    crate::key::Missing::Bytes => (
                        firstseen_store::KeyKind::TopicPayload,
                        crate::key::byte_key(
                            crate::key::ByteKey::TopicPayload,
                            &p.topic,
                            &p.payload,
                        ),
                    ),
                    crate::key::Missing::DeadLetter => {
                        self.set_aside("key-field-missing", &p, now).await;
                        return Received {
                            observation: None,
                            properties: None,
                            kind: firstseen_store::KeyKind::Unknown,
                            ack,
                            received_at,
                        };
                    }
                }
            }
        };
        let (kind, key) = key;
        let observation = Observation {
            key,
            mqtt_topic: p.topic,
            pulsar_topic: route.pulsar_topic.clone(),
            payload: p.payload,
            qos: qos_level,
            retain: p.retain,
            node: self.node,
            received_ms: now,
        };
        Received {
            observation: Some(observation),
            properties: p.properties,
            kind,
            ack,
            received_at,
        }
    }

    /// Stores a message in the dead-letter directory. If even that fails
    /// (disk full), the task waits and retries rather than ack a message it
    /// has not kept: the broker holds it meanwhile.
    async fn set_aside(&self, reason: &str, p: &Message, now: u64) {
        metrics::counter!("firstseen_dead_letter_total", "reason" => reason.to_string())
            .increment(1);
        let mut delay = Duration::from_millis(200);
        loop {
            if let Some(reason) = self.disk.reason() {
                // Held unacked until there is room; the broker keeps it.
                tracing::warn!(upstream = %self.config.name, reason = %reason, "dead letter waits for disk space");
                while self.disk.is_low() {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            match self
                .dead_letter
                .store(
                    reason,
                    &p.topic,
                    Some(p.qos),
                    Some(p.retain),
                    &p.payload,
                    now,
                )
                .await
            {
                Ok(deadletter::Stored::At(path)) => {
                    let topic: String = p.topic.chars().take(200).collect();
                    tracing::warn!(upstream = %self.config.name, %topic, bytes = p.payload.len(), reason, path = %path.display(), "message set aside in dead-letter store");
                    return;
                }
                Ok(deadletter::Stored::OverBound) => {
                    // Acked and not kept: no route wants it, and keeping
                    // more would evict the other dead letters.
                    metrics::counter!("firstseen_dead_letter_not_kept_total", "reason" => reason.to_string())
                        .increment(1);
                    let topic: String = p.topic.chars().take(200).collect();
                    tracing::debug!(upstream = %self.config.name, %topic, reason, "dead letter not kept: past dead_letter.unrouted_max_bytes");
                    return;
                }
                Err(e) => {
                    tracing::error!(upstream = %self.config.name, error = %e, "cannot write dead-letter file; holding the message unacked");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(10));
                }
            }
        }
    }
}

/// An upstream's subscriptions, which a reload replaces while it runs.
pub type LiveSubscriptions = Arc<tokio::sync::watch::Sender<Vec<(String, u8)>>>;

/// An upstream's subscriptions as (filter, qos).
pub fn subscriptions(u: &UpstreamConfig) -> Vec<(String, u8)> {
    u.subscriptions
        .iter()
        .map(|s| (s.filter.clone(), s.qos))
        .collect()
}

/// What a reload changes of a session's subscriptions: the (filter, qos)
/// to subscribe (new, or with another QoS) and the filters to unsubscribe.
pub fn subscription_changes(
    old: &[(String, u8)],
    new: &[(String, u8)],
) -> (Vec<(String, u8)>, Vec<String>) {
    let added = new.iter().filter(|n| !old.contains(n)).cloned().collect();
    let removed = old
        .iter()
        .filter(|(f, _)| !new.iter().any(|(g, _)| g == f))
        .map(|(f, _)| f.clone())
        .collect();
    (added, removed)
}

/// An operator-readable reason for a connection failure, naming the
/// upstream's URL.
fn describe(e: &SessionError, url: &str) -> String {
    match e {
        SessionError::Unresolved { .. } => format!("{url}: {e}"),
        SessionError::Refused => format!("connection to {url} refused"),
        other => format!("{url}: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reload_subscribes_and_unsubscribes_the_difference() {
        let s = |f: &str, q: u8| (f.to_string(), q);
        let (added, removed) = subscription_changes(
            &[s("a/#", 1), s("b/#", 1), s("c/#", 0)],
            &[s("a/#", 1), s("b/#", 2), s("d/#", 1)],
        );
        assert_eq!(added, vec![s("b/#", 2), s("d/#", 1)]);
        assert_eq!(removed, vec!["c/#".to_string()]);
    }

    #[test]
    fn upstream_urls_parse() {
        assert_eq!(
            UpstreamAddr::parse("mqtt://broker.example:1884").unwrap(),
            UpstreamAddr {
                host: "broker.example".into(),
                port: 1884,
                tls: false
            }
        );
        assert_eq!(UpstreamAddr::parse("mqtts://b").unwrap().port, 8883);
        assert_eq!(
            UpstreamAddr::parse("http://b"),
            Err(BadUpstreamUrl::Scheme("http".into()))
        );
        assert!(UpstreamAddr::parse("nonsense").is_err());
    }
}
