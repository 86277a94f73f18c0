//! After a recovery: the topic's end holds the older cluster's messages
//! (rebase this cluster's numbering after them), or a newer generation's
//! (give the topic up for good).

use super::port::{Broker, Consensus, Outbox};
use super::Error;
use super::Publisher;

impl<B: Broker, C: Consensus, O: Outbox> Publisher<B, C, O> {
    /// Continues `topic` after `older`, the proven messages of the cluster
    /// this one was recovered from above its watermark (what the lost
    /// members published and the survivor never received): commits a
    /// rebase with the outbox's messages of their keys (in Pulsar already),
    /// then, for copies first seen meanwhile, rebases again until the
    /// outbox holds none of their keys (from then on the window has them).
    pub(super) async fn rebase(
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
                return Err(crate::Error::Raft {
                    action: format!("rebase {topic}"),
                    source: "the watermark is still below the older cluster's messages".into(),
                }
                .into());
            }
            metrics::counter!("firstseen_publish_rebased_total").increment(1);
            tracing::warn!(topic, older = if first { older.len() } else { 0 }, older_from = low, older_up_to = after, in_pulsar_already = dropped, watermark = now.published_seq, last_assigned = now.last_seq, "the topic holds messages the cluster this one was recovered from published and this node never received: their keys are in the window, this node's copies of them left the outbox as published, and its other messages are numbered after them");
            first = false;
        }
        Ok(())
    }

    /// Stops publishing `topic` for good: it holds proven messages of
    /// generation `newer`, above this cluster's `ours`.
    pub(super) fn give_up(&self, topic: &str, ours: u64, newer: u64) {
        if self.ours.superseded().record(topic, ours, newer) {
            metrics::counter!("firstseen_publish_superseded_total").increment(1);
            tracing::error!(topic, generation = %firstseen_raft::recover::shown(ours), newer_generation = %firstseen_raft::recover::shown(newer), "this cluster stops publishing this topic: it holds messages of a newer generation of this cluster, written by a cluster recovered from this one's data (`firstseen recover --force-new-cluster` on a member this cluster was cut off from). Two clusters with one secret cannot publish one topic without losing or doubling messages, and the newer one is the one that lives: the newer generation's messages stay at the topic's end, so this cluster gives the topic up again after every restart. Stop this cluster for good (never start its members again on their data); its unpublished messages reached the newer cluster too, as far as that cluster's nodes received the same feed. This node reports not ready and publishes nothing more to this topic");
        }
    }
}
