//! Taking a topic: the exclusive producer, the read of the topic's end
//! under it, and the resume point after max(tail, watermark); what the
//! topic lacks below its tail goes late first, and an older or newer
//! cluster's messages found there are handled before anything is sent.

use std::time::Duration;

// Tokio's clock, not the system's: it is the same in a node, and it is the
// simulated clock in the simulation.
use tokio::time::Instant;

use super::inflight::TopicPublisher;
use super::port::{Broker, Consensus, Outbox, Session};
use super::Error;
use super::{policy, tail, Publisher};

impl<B: Broker, C: Consensus, O: Outbox> Publisher<B, C, O> {
    /// Takes `tp`'s topic for this term: returns `None` once the producer
    /// is held and the resume point set, or whether anything was done when
    /// the topic is not taken this time (given up, rebased, or waiting).
    pub(super) async fn take(
        &self,
        session: &B::Session,
        tp: &mut TopicPublisher<<B::Session as Session>::Producer>,
        term: u64,
    ) -> Result<Option<bool>, Error> {
        if let Some((name, producer)) = tp.held.take() {
            return self.take_with(session, tp, producer, &name).await;
        }
        let name = self.producer_name(term);
        let producer = session.exclusive(&tp.topic, &name).await?;
        self.take_with(session, tp, producer, &name).await
    }

    /// A producer name of this node and term, unique to this acquisition.
    pub(super) fn producer_name(&self, term: u64) -> String {
        self.ours.producer_name(&format!(
            "{}-t{}-{}",
            self.node_id,
            term,
            tail::scratch_subscription("p")
        ))
    }

    /// [`Publisher::take`] once `producer`, named `name`, holds the topic's
    /// exclusive access and the writes an earlier producer left pending
    /// have settled ([`Session::exclusive`]): the read barrier, the tail
    /// read under it, and the resume point. Nothing is sent before this has
    /// run, whenever the producer was acquired: held since, exclusive, the
    /// topic's end cannot move under it.
    pub(super) async fn take_with(
        &self,
        session: &B::Session,
        tp: &mut TopicPublisher<<B::Session as Session>::Producer>,
        producer: <B::Session as Session>::Producer,
        name: &str,
    ) -> Result<Option<bool>, Error> {
        let mut producer = producer;
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
            return Ok(Some(false));
        }
        tp.generation = generation;
        if !tail.older.is_empty() {
            // Nothing is sent before the rebase is applied; the next
            // pass takes the topic again and reads it anew.
            drop(producer);
            if tail.cut_short {
                tracing::error!(topic = %tp.topic, watermark, found = tail.older.len(), "the topic holds messages of the cluster this one was recovered from above this cluster's watermark, and the tail read reached its bounds before it had read back to the watermark: nothing is published to this topic until a read gets there (the survivor lagged too far behind)");
                tp.retry_at = Some(Instant::now() + Duration::from_secs(5));
                return Ok(Some(false));
            }
            self.rebase(&tp.topic, &tail.older).await?;
            return Ok(Some(true));
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
        tp.propose_watermark(&self.consensus);
        Ok(None)
    }
}
