//! The term loop: the publisher waits to lead, then, for one leadership
//! term, takes each topic with a committed message, sends its batches
//! after a lease confirmation each, and settles their receipts, until the
//! lease, the term or the node ends.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use futures::{FutureExt, StreamExt};

// Tokio's clock, not the system's: it is the same in a node, and it is the
// simulated clock in the simulation.
use tokio::time::Instant;

use super::inflight::{first_received, InFlight, TopicPublisher, MAX_IN_FLIGHT};
use super::port::{Broker, Consensus, Outbox, Sending, Session};
use super::Publisher;
use super::{Error, TopicProblem};
use crate::telemetry::{self, Leg};

/// How many topics a term acquires at once at its start. Each acquisition
/// is a lookup, a producer, and admin API requests (the topic's limit, its
/// pending writes), and then a tail read; a config of thousands of routes
/// at once would queue them all on the broker and its admin API together,
/// and the topics with messages waiting, first in line, would wait behind
/// them.
const EARLY_AT_ONCE: usize = 16;

/// How many topics a term takes at its start at most: one round of
/// [`EARLY_AT_ONCE`]. Every one holds an exclusive producer for the term
/// (as it would after its first message) and costs a tail read. A topic
/// whose first message comes while its early take is still queued waits
/// for that take (a second producer would be refused by the first), so
/// with more than one round a routed topic's first message could wait
/// behind many others' lookups and tail reads on a slow broker; the rest
/// are taken on their first message, at once.
const EARLY_TOPICS: usize = EARLY_AT_ONCE;

/// A topic acquired at a term's start: its name, its producer's name, and
/// the producer (or why not).
type Acquired<P> = (String, String, Result<P, super::port::SendError>);

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
        // The term's known topics are acquired at once, beside the loop,
        // so that a topic's first message finds its producer ready: the
        // lookup, the producer and the wait for a predecessor's pending
        // writes took most of a second after the first commit. Each is
        // taken (read barrier, tail read) as soon as it is acquired, before
        // anything is sent to it, exactly as on its first message.
        let early = self.early_topics(named, term)?;
        if !early.is_empty() && !self.consensus.confirm_lease().await {
            return Ok(TermEnd::LostLease);
        }
        let mut acquiring: BTreeSet<String> = early.iter().map(|(t, _)| t.clone()).collect();
        let mut acquired = Vec::new();
        let session_ref = &session;
        let mut acquisitions =
            futures::stream::iter(early.into_iter().map(|(topic, name)| async move {
                let producer = session_ref.exclusive(&topic, &name).await;
                (topic, name, producer)
            }))
            .buffer_unordered(EARLY_AT_ONCE);
        loop {
            if self.shutdown.is_cancelled() {
                flush_watermarks(&mut topics, &self.consensus);
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
            while !acquiring.is_empty() {
                match acquisitions.next().now_or_never() {
                    Some(Some(a)) => acquired.push(a),
                    _ => break,
                }
            }
            if !acquired.is_empty() {
                for (topic, _, _) in &acquired {
                    acquiring.remove(topic);
                }
                self.take_acquired(&session, &mut topics, std::mem::take(&mut acquired))
                    .await;
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
                    }
                    Err(e) => {
                        tp.fail(&e).await;
                        continue;
                    }
                }
                // On every pass, so that one held back goes once due, and
                // the idle wait below is never zero.
                tp.propose_watermark(&self.consensus);
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
                // Its producer is on its way: a second one would be refused
                // by the first.
                if tp.producer.is_none() && acquiring.contains(&tp.topic) {
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
                // An idle publisher still holds its producers, which keeps a
                // successor's exclusive producers out. So the lease is also
                // confirmed on a timer: a leader cut off from its peers lets
                // go of Pulsar even when it has nothing to send.
                let holding = topics
                    .values()
                    .any(|t| t.producer.is_some() || t.held.is_some());
                if holding && !self.consensus.confirm_lease().await {
                    return Ok(TermEnd::LostLease);
                }
            }
            // Nothing to send and nothing settled: wait for whichever comes
            // first, a batch's receipts or a newly applied entry. Awaiting
            // the oldest batch alone made every message committed meanwhile
            // wait out Pulsar's round trip before it could leave; at the HSL
            // peak that was most of the time from commit to send.
            // No longer than a held-back watermark has until it is due;
            // never zero, so that a topic this pass did not visit cannot
            // make the loop spin (it is proposed on the next pass).
            let idle_wait = topics
                .values()
                .filter_map(|t| t.watermark_wait())
                .fold(Duration::from_millis(200), Duration::min)
                .max(Duration::from_millis(10));
            let woke = tokio::select! {
                r = first_received(&mut topics) => Some(r),
                a = acquisitions.next(), if !acquiring.is_empty() => {
                    acquired.extend(a);
                    None
                }
                _ = self.outbox.grown() => None,
                _ = self.consensus.changed() => None,
                _ = tokio::time::sleep(idle_wait) => None,
                _ = self.shutdown.cancelled() => {
                    flush_watermarks(&mut topics, &self.consensus);
                    return Ok(TermEnd::Shutdown);
                }
            };
            if let Some((name, Err(e))) = woke {
                if let Some(tp) = topics.get_mut(&name) {
                    tp.fail(&e).await;
                }
            }
        }
    }

    /// The topics a new term takes at once, each with its producer's name:
    /// those with messages waiting in the outbox first (they are sent
    /// right away), then those the routes name (their first message is
    /// yet to come). At most [`EARLY_TOPICS`].
    ///
    /// A route's topic goes by the name the outbox gives it: its canonical
    /// one from cluster level 3, the route's spelling below (a producer
    /// under the other spelling would keep the outbox's own out of the same
    /// broker topic for the whole term). Topics another cluster took over
    /// are left alone.
    fn early_topics(&self, named: bool, term: u64) -> Result<Vec<(String, String)>, Error> {
        let mut list: Vec<String> = self
            .outbox
            .topics()?
            .into_iter()
            .filter(|(_, st)| st.last_seq > st.published_seq)
            .map(|(t, _)| t)
            .collect();
        list.extend(self.formats.topics(named));
        let superseded = self.ours.superseded();
        let mut seen = BTreeSet::new();
        list.retain(|t| !superseded.contains(t) && seen.insert(t.clone()));
        if list.len() > EARLY_TOPICS {
            tracing::info!(
                topics = list.len(),
                taken = EARLY_TOPICS,
                "more topics than a term takes at its start: the rest are taken on their first message"
            );
            list.truncate(EARLY_TOPICS);
        }
        Ok(list
            .into_iter()
            .map(|t| {
                let name = self.producer_name(term);
                (t, name)
            })
            .collect())
    }

    /// Takes the topics whose producers the term acquired at its start
    /// (each [`Publisher::take_with`], together), so that their first
    /// message finds them taken. One whose acquisition failed is left as
    /// it was: its first message takes it as before, with the backoff of
    /// its failures. An acquired topic holds its producer even with
    /// nothing to send, as every topic does after its last message; the
    /// idle lease check lets go of them all when the lease is lost.
    async fn take_acquired(
        &self,
        session: &B::Session,
        topics: &mut BTreeMap<String, TopicPublisher<<B::Session as Session>::Producer>>,
        acquired: Vec<Acquired<<B::Session as Session>::Producer>>,
    ) {
        let mut ready = BTreeMap::new();
        for (topic, name, producer) in acquired {
            match producer {
                Ok(p) => {
                    topics.entry(topic.clone()).or_insert_with(|| {
                        let format = self.formats.of(&topic);
                        TopicPublisher::new(topic.clone(), format)
                    });
                    ready.insert(topic, (name, p));
                }
                Err(e) => {
                    tracing::info!(topic = %topic, error = %e, "could not take the topic at the term's start; its first message takes it");
                }
            }
        }
        let waiting: BTreeSet<String> = match self.outbox.topics() {
            Ok(all) => all
                .into_iter()
                .filter(|(_, st)| st.last_seq > st.published_seq)
                .map(|(t, _)| t)
                .collect(),
            // Unknown: every one is taken now, as a topic with messages is.
            Err(_) => ready.keys().cloned().collect(),
        };
        let takes = topics.iter_mut().filter_map(|(topic, tp)| {
            let (name, producer) = ready.remove(topic)?;
            // A topic taken meanwhile (it cannot be: its take waited for
            // this acquisition) keeps its producer; this one goes.
            if tp.producer.is_some() || tp.held.is_some() {
                return None;
            }
            // Nothing to send yet: held, its tail read on its first message
            // (`TopicPublisher::held`).
            if !waiting.contains(topic) {
                tp.held = Some((name, producer));
                return None;
            }
            Some(async move {
                if let Err(e) = self.take_with(session, tp, producer, &name).await {
                    tp.fail(&e).await;
                }
            })
        });
        futures::future::join_all(takes).await;
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

/// Proposes every watermark held back by the cadence, at a stop: the last
/// receipts are then recorded, so a next leader that finds the topic's tail
/// gone (retention, a topic deleted and created again) still resumes after
/// them. Best effort: a node that no longer leads proposes nothing.
fn flush_watermarks<P>(
    topics: &mut BTreeMap<String, TopicPublisher<P>>,
    consensus: &impl Consensus,
) {
    for tp in topics.values_mut() {
        tp.propose_watermark_now(consensus);
    }
}
