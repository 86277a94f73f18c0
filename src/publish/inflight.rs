//! The per-topic window of entries in flight: what one topic's publisher
//! holds within a term (its producer, the batches sent and not yet
//! confirmed, its refusals), how receipts are settled oldest first, and
//! how a failure hears the rest out before the producer goes.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use futures::FutureExt;
// Tokio's clock, not the system's: it is the same in a node, and it is the
// simulated clock in the simulation.
use tokio::time::Instant;

use super::format;
use super::policy::{self, held_elsewhere, retry_policy};
use super::port::{Consensus, Receipt};
use super::Error;
use crate::telemetry::{self, Leg};

/// Batches sent per topic before the oldest one's receipts are awaited. With
/// one, every batch waited out a broker round trip (and a bookie fsync)
/// before the next could leave, and messages committed meanwhile queued
/// behind it: at 2,000 msg/s that wait was most of the p99. A producer's
/// messages are persisted in send order, so a batch can only succeed after
/// every batch sent before it, which is what the tail read relies on.
pub(super) const MAX_IN_FLIGHT: usize = 4;

/// A batch sent and not yet confirmed.
pub(super) struct InFlight {
    /// Receipts not yet come back, oldest first.
    pub(super) receipts: VecDeque<Receipt>,
    /// The sequence of the oldest receipt not yet come back.
    pub(super) front: u64,
    /// The sequence whose receipt came back with an error.
    pub(super) failed: Option<u64>,
    /// Last sequence in the batch.
    pub(super) last: u64,
    pub(super) messages: u64,
    pub(super) started: Instant,
}

/// Publishing state of one topic within a term.
pub(super) struct TopicPublisher<P> {
    pub(super) topic: String,
    pub(super) producer: Option<P>,
    /// Next sequence to send; valid only while `producer` is `Some`.
    pub(super) next_seq: u64,
    /// Sent batches, oldest first.
    pub(super) in_flight: VecDeque<InFlight>,
    pub(super) retry_at: Option<Instant>,
    pub(super) backoff: Duration,
    /// Last sequence whose receipt came back, and the last one proposed as
    /// the watermark, with when.
    pub(super) confirmed: u64,
    pub(super) proposed: u64,
    pub(super) proposed_at: Option<Instant>,
    /// The broker's refusals of one message in a row.
    pub(super) refusals: policy::Refusals,
    /// The largest message the broker takes on this topic, when it said.
    pub(super) limit: Option<usize>,
    /// The late message whose send failed, for [`TopicPublisher::fail`].
    pub(super) late_failed: Option<u64>,
    /// How this topic's messages are written.
    pub(super) format: format::Format,
    /// The cluster's generation, as applied when the producer was taken.
    pub(super) generation: u64,
    /// A producer acquired at the term's start (exclusive, a predecessor's
    /// pending writes settled) for a topic with nothing to send yet, and its
    /// name: its read barrier and tail read wait for the topic's first
    /// message ([`super::Publisher::take`]). Read at the term's start, a
    /// quiet topic's tail held up every other topic for as long as the read
    /// took, and anyone who can write foreign messages to it could make that
    /// long.
    pub(super) held: Option<(String, P)>,
}

impl<P> TopicPublisher<P> {
    pub(super) fn new(topic: String, format: format::Format) -> Self {
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
            held: None,
        }
    }

    /// Proposes the confirmed watermark through Raft if it moved and the
    /// last proposal is [`policy::WATERMARK_EVERY`] old.
    pub(super) fn propose_watermark(&mut self, consensus: &impl Consensus) {
        let since_last = self.proposed_at.map(|t| t.elapsed());
        if !policy::watermark_due(self.confirmed, self.proposed, since_last) {
            return;
        }
        self.proposed = self.confirmed;
        self.proposed_at = Some(Instant::now());
        // Committed in the background: the next batch need not wait for it.
        // Apply keeps the larger of two watermarks whatever their order.
        consensus.watermark(self.topic.clone(), self.confirmed);
    }

    /// Proposes the confirmed watermark if it moved, whatever the cadence
    /// (the publisher is stopping).
    pub(super) fn propose_watermark_now(&mut self, consensus: &impl Consensus) {
        if self.confirmed > self.proposed {
            self.proposed = self.confirmed;
            self.proposed_at = Some(Instant::now());
            consensus.watermark(self.topic.clone(), self.confirmed);
        }
    }

    /// How long until a watermark held back is due, if one is.
    pub(super) fn watermark_wait(&self) -> Option<Duration> {
        policy::watermark_wait(
            self.confirmed,
            self.proposed,
            self.proposed_at.map(|t| t.elapsed()),
        )
    }

    /// Drops the producer and its pending queue; the next attempt re-reads
    /// the tail.
    pub(super) async fn fail(&mut self, error: &Error) {
        metrics::counter!("firstseen_publish_errors_total").increment(1);
        let failed = self
            .in_flight
            .iter()
            .find_map(|b| b.failed)
            .or(self.late_failed.take());
        // The broker's (or the connection's) answer, which the policy
        // reads; the publisher's own errors are none of the broker's.
        let answer = error.broker();
        let refused = answer.is_some_and(policy::refused_by_broker);
        self.refusals.record(failed, answer);
        if refused {
            metrics::counter!("firstseen_publish_refusals_total").increment(1);
        }
        self.hear_out().await;
        let (delay, next) = retry_policy(self.backoff, answer.is_some_and(held_elsewhere));
        tracing::warn!(topic = %self.topic, %error, seq = ?failed, refused_by_broker = refused, retry_in_ms = delay.as_millis() as u64, "publisher dropped its producer");
        self.producer = None;
        self.held = None;
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
    pub(super) async fn hear_out(&mut self) {
        for batch in &mut self.in_flight {
            while let Some(receipt) = batch.receipts.pop_front() {
                let seq = batch.front;
                batch.front += 1;
                if let Err(e) = receipt.await {
                    if self.refusals.heard(seq, &e) {
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
    pub(super) async fn received(&mut self) -> Result<(), Error> {
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
    pub(super) fn settle_ready(&mut self) -> Result<Option<u64>, Error> {
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
    pub(super) async fn oldest_received(&mut self) -> Result<(), Error> {
        match self.in_flight.front_mut() {
            Some(batch) => batch.received().await,
            None => std::future::pending().await,
        }
    }
}

/// Waits for the first topic whose oldest batch has come back, and names it.
pub(super) async fn first_received<P: Send>(
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
