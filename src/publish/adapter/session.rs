//! Pulsar for one leadership term, as the publisher's [`Session`]: a
//! topic's exclusive producer, taken only once the writes a predecessor
//! left pending have settled (`settled`), the tail read under it, and each
//! message queued as an entry's part.

use std::time::Duration;

use firstseen_store::OutboxMessage;
use pulsar::{Pulsar, TokioExecutor};

use super::outgoing::outgoing;
use super::sort::sort;
use crate::publish::port::{Receipt, SendError, Sending, Session};
use crate::publish::producer::{Producer, Producers};
use crate::publish::{tail, Admin};

/// Pulsar for one leadership term: the crate's client for lookups and the
/// tail read, and our producers' connections.
pub struct PulsarSession {
    pub(super) client: Pulsar<TokioExecutor>,
    pub(super) producers: Producers,
    /// `pulsar.operation_timeout_ms`: the longest wait for the tail's last
    /// message.
    pub(super) operation_timeout: Duration,
    pub(super) ours: tail::Ours,
    /// The admin API, when configured.
    pub(super) admin: Option<Admin>,
    /// The broker's `maxMessageSize`, when the admin API said.
    pub(super) limit: Option<usize>,
    /// `pulsar.max_message_bytes`: no entry is larger.
    pub(super) max_message_bytes: usize,
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

    /// Looks `topic` up and opens its exclusive producer under `name`.
    async fn acquire(&self, topic: &str, name: &str) -> Result<Producer, SendError> {
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
        self.producers
            .exclusive(at.url.as_str(), proxy_to, topic, name, limit)
            .await
    }

    /// Refuses a partitioned `topic`, when the admin API can tell. A
    /// producer on a partitioned topic's name writes to a non-partitioned
    /// topic the broker makes beside the partitions (with auto-creation on;
    /// with it off the producer is refused and the creation answers that
    /// the name is taken, forever), while the tail read follows the
    /// partitions: a new leader would resume from an end that is not the
    /// one written. One ERROR per topic says so; retried with backoff.
    /// When the admin API does not answer, the take goes on as before, with
    /// one WARN per topic.
    async fn refuse_partitioned(&self, topic: &str) -> Result<(), SendError> {
        let Some(admin) = &self.admin else {
            return Ok(());
        };
        match admin.partitions(topic).await {
            Ok(0) => Ok(()),
            Ok(n) => {
                if first_report(Problem::Partitioned, topic) {
                    tracing::error!(topic, partitions = n, "the topic is partitioned, and firstseen publishes only to non-partitioned topics (one exclusive producer, and the topic's end read back to resume): nothing is published to it. Route to a non-partitioned topic, or replace this one (pulsar-admin topics delete-partitioned-topic, then create it without partitions); retrying with backoff");
                }
                Err(SendError::Partitioned(format!(
                    "{topic} has {n} partitions"
                )))
            }
            // Fails open: the admin API down, a token without the right or
            // a non-persistent topic must not stop publishing. Said once per
            // topic, since a partitioned topic then goes unnoticed.
            Err(e) => {
                if first_report(Problem::PartitionsUnknown, topic) {
                    tracing::warn!(topic, error = %e, "could not read the topic's partitions from the admin API; taking it as non-partitioned (a partitioned topic is not supported)");
                }
                Ok(())
            }
        }
    }

    /// Creates `topic`, which the broker said it does not have and will not
    /// create on its own (`allowAutoTopicCreation=false`, common in
    /// production), through the admin API; the caller then takes it again.
    /// The decision is by the broker's code (`SendError::TopicNotFound`),
    /// never its words. Without `pulsar.admin_url` nothing can create it:
    /// one ERROR per topic says so (the retries, with backoff, do not repeat
    /// it), and the topic stays unpublished until someone creates it.
    async fn create(&self, topic: &str, why: String) -> Result<(), SendError> {
        let Some(admin) = &self.admin else {
            if first_report_of_missing(topic) {
                tracing::error!(topic, broker = %why, "the topic does not exist and the broker does not create topics on its own (allowAutoTopicCreation=false): nothing is published to it until it exists. Set pulsar.admin_url so that the publisher creates it, or create it (non-partitioned) with pulsar-admin topics create; retrying with backoff");
            }
            return Err(SendError::TopicNotFound(why));
        };
        match admin.create_topic(topic).await {
            Ok(created) => {
                if created {
                    metrics::counter!("firstseen_publish_topics_created_total").increment(1);
                }
                tracing::info!(
                    topic,
                    created,
                    "the broker does not create topics on its own: the topic was created through the admin API (non-partitioned, or it existed already); taking it again"
                );
                Ok(())
            }
            // Still missing: retried with backoff, like the refusal itself.
            Err(e) => Err(SendError::TopicNotFound(format!(
                "{why}; creating it through the admin API failed: {e}"
            ))),
        }
    }
}

/// Whether `topic`'s absence from a broker that creates no topics is not
/// reported yet in this process: the ERROR goes once per topic, not once
/// per retry.
fn first_report_of_missing(topic: &str) -> bool {
    first_report(Problem::Missing, topic)
}

/// What a topic's one ERROR is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Problem {
    Missing,
    Partitioned,
    PartitionsUnknown,
}

/// Whether `problem` with `topic` is not reported yet in this process.
fn first_report(problem: Problem, topic: &str) -> bool {
    static REPORTED: std::sync::Mutex<std::collections::BTreeSet<(Problem, String)>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    REPORTED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert((problem, topic.to_string()))
}

impl Session for PulsarSession {
    type Producer = Producer;

    async fn exclusive(&self, topic: &str, name: &str) -> Result<Self::Producer, SendError> {
        self.refuse_partitioned(topic).await?;
        let producer = match self.acquire(topic, name).await {
            Err(SendError::TopicNotFound(why)) => {
                self.create(topic, why).await?;
                self.acquire(topic, name).await?
            }
            other => other?,
        };
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
    ) -> Result<tail::Tail, crate::publish::Error> {
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
    ) -> Result<tail::Tail, crate::publish::Error> {
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
