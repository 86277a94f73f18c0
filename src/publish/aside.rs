//! Set aside: a message the broker would refuse (too large, or refused
//! alone twice) goes to Pulsar as a marker, and is kept first, in the
//! replicated set-aside store or in this node's own directory.

use super::port::{Broker, Consensus, Outbox};
use super::Error;
use super::{format, policy, Publisher};

impl<B: Broker, C: Consensus, O: Outbox> Publisher<B, C, O> {
    /// Keeps a message that goes to Pulsar as a marker before the marker is
    /// sent: from cluster level 2 in the replicated set-aside store, on
    /// every node, committed first; below it in this node's own set-aside
    /// directory (fsynced), apart from the dead letters, with a bound of its
    /// own and no retention by clock. A failure fails the batch, which is
    /// retried like any other error.
    pub(super) async fn keep_set_aside(
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
    pub(super) fn limit(&self, broker: Option<usize>) -> usize {
        broker.map_or(self.max_message_bytes, |b| b.min(self.max_message_bytes))
    }

    /// Whether message `seq` goes as a marker, and why; one that does is
    /// kept in the dead-letter store first.
    pub(super) async fn set_aside(
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
}
