//! Batching: many observations become one Raft entry.
//!
//! [`Pending`] is the pure decision of when a batch is complete (size, bytes,
//! linger). [`run`] is the task around it: it proposes each batch, waits
//! until the entry is committed, and only then acks its messages upstream.
//! [`port`] is what it needs of the group and of the upstream sessions.

pub mod config;
pub mod port;
mod run;

use std::time::Duration;

use tokio::time::Instant;

pub use run::{run, Batcher};

use std::sync::Arc;

use firstseen_store::StateStore;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::ingest::Received;

/// What the batch stage works with besides its section: the group it
/// commits to, the sessions it acks on, and what holds it back.
pub struct Links {
    /// What commits the batches: the node's [`crate::propose::Proposer`].
    pub proposer: Arc<dyn port::Commit>,
    /// The upstream sessions' acks.
    pub acks: Arc<dyn port::Acks>,
    pub state: StateStore,
    pub disk: Arc<crate::diskspace::DiskSpace>,
    /// The outbox's bound (`outbox.quota_bytes`): above it nothing is
    /// proposed, and nothing acked.
    pub outbox_quota_bytes: u64,
}

/// The batch stage, built from `[batch]`: the task that turns `received`
/// into committed, acked batches until its senders are gone or `stop`.
pub fn build(
    section: &config::BatchConfig,
    links: Links,
    received: mpsc::Receiver<Received>,
    stop: CancellationToken,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    run(
        Batcher {
            policy: section.policy(),
            proposer: links.proposer,
            acks: links.acks,
            state: links.state,
            quota_bytes: links.outbox_quota_bytes,
            disk: links.disk,
            shutdown: stop,
        },
        received,
    )
}

/// When a batch is complete.
#[derive(Debug, Clone, Copy)]
pub struct BatchPolicy {
    pub max_messages: usize,
    pub max_bytes: usize,
    pub linger: Duration,
}

/// Messages waiting to be proposed, in receive order.
#[derive(Debug, Default)]
pub struct Pending {
    pub items: Vec<Received>,
    bytes: usize,
    started: Option<Instant>,
}

impl Pending {
    /// Adds a message; the first one starts the linger clock.
    pub fn push(&mut self, item: Received, now: Instant) {
        if let Some(o) = &item.observation {
            self.bytes += o.payload.len() + o.mqtt_topic.len();
        }
        self.started.get_or_insert(now);
        self.items.push(item);
    }

    /// Whether the batch must be proposed now without waiting for more.
    pub fn is_full(&self, policy: &BatchPolicy) -> bool {
        self.items.len() >= policy.max_messages || self.bytes >= policy.max_bytes
    }

    /// When the batch must be proposed at the latest.
    pub fn deadline(&self, policy: &BatchPolicy) -> Option<Instant> {
        self.started.map(|s| s + policy.linger)
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Payload and topic bytes in the batch.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Empties the batch, returning its messages.
    pub fn take(&mut self) -> Vec<Received> {
        self.bytes = 0;
        self.started = None;
        std::mem::take(&mut self.items)
    }
}

/// A received message for the batcher's tests: key byte 0 is `tag`, the
/// payload `bytes` long, received now.
#[cfg(test)]
pub(crate) fn test_message(tag: u8, bytes: usize) -> Received {
    let mut key = [0; 32];
    key[0] = tag;
    Received {
        observation: Some(firstseen_store::Observation {
            key,
            mqtt_topic: String::new(),
            pulsar_topic: "t".into(),
            payload: vec![tag; bytes],
            qos: 1,
            retain: false,
            node: 1,
            received_ms: 0,
        }),
        properties: None,
        kind: firstseen_store::KeyKind::TopicPayload,
        ack: None,
        received_at: Instant::now(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(bytes: usize) -> Received {
        test_message(0, bytes)
    }

    #[test]
    fn completes_on_count_bytes_or_linger() {
        let policy = BatchPolicy {
            max_messages: 3,
            max_bytes: 100,
            linger: Duration::from_millis(5),
        };
        let t0 = Instant::now();
        let mut p = Pending::default();
        assert_eq!(p.deadline(&policy), None);
        p.push(item(10), t0);
        p.push(item(10), t0 + Duration::from_millis(1));
        assert!(!p.is_full(&policy));
        assert_eq!(p.deadline(&policy), Some(t0 + Duration::from_millis(5)));
        p.push(item(10), t0);
        assert!(p.is_full(&policy));
        assert_eq!(p.take().len(), 3);
        assert!(p.is_empty());
        p.push(item(150), t0);
        assert!(
            p.is_full(&policy),
            "one large message fills a batch by bytes"
        );
    }

    #[test]
    fn set_aside_messages_keep_their_place_without_bytes() {
        let mut p = Pending::default();
        p.push(
            Received {
                observation: None,
                properties: None,
                kind: firstseen_store::KeyKind::Unknown,
                ack: None,
                received_at: Instant::now(),
            },
            Instant::now(),
        );
        assert_eq!(p.bytes(), 0);
        assert_eq!(p.items.len(), 1);
    }
}
