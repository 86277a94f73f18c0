//! The term loop: the publisher waits to lead, then, for one leadership
//! term, takes each topic with a committed message, sends its batches
//! after a lease confirmation each, and settles their receipts, until the
//! lease, the term or the node ends.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

// Tokio's clock, not the system's: it is the same in a node, and it is the
// simulated clock in the simulation.
use tokio::time::Instant;

use super::inflight::{first_received, InFlight, TopicPublisher, MAX_IN_FLIGHT};
use super::port::{Broker, Consensus, Outbox, Sending, Session};
use super::Publisher;
use super::{Error, TopicProblem};
use crate::telemetry::{self, Leg};

/// Why a leadership term's publishing ended.
pub(super) enum TermEnd {
    /// Not (or no longer) the leader, or the lease could not be confirmed.
    LostLease,
    /// The topics were renamed (cluster level 3): lead again at once.
    Renamed,
    Shutdown,
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

    /// Sends the next batch of one topic without awaiting its receipts.
    /// Returns whether there was anything to send.
    pub(super) async fn send_batch(
        &self,
        session: &B::Session,
        tp: &mut TopicPublisher<<B::Session as Session>::Producer>,
        term: u64,
    ) -> Result<bool, Error> {
        if tp.producer.is_none() {
            if let Some(sent) = self.take(session, tp, term).await? {
                return Ok(sent);
            }
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
                alone: tp.refusals.one_per_entry(),
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
