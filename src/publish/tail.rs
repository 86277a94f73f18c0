//! Reading the last `firstseen-seq` this cluster actually wrote to a topic.
//!
//! The Raft watermark may lag what is in Pulsar (a receipt arrived but the
//! `Published` entry was not committed before a leader change), so a new
//! publisher resumes after whichever is larger: the tail or the watermark.
//!
//! The tail counts only messages that are ours ([`Tail::classify`]): that
//! carry the cluster's proof ([`super::proof`]; by name alone, while the
//! cluster runs at level 1) and are numbered within what the group has
//! assigned. Anyone with a producer on the topic can write while no node
//! holds it; trusting such a message's `firstseen-seq` made a new leader
//! skip every sequence up to it, and the watermark that followed trimmed
//! them from the outbox unpublished: 1,000 acked messages lost after one
//! foreign write, and `u64::MAX` overflowed the resume point. Foreign
//! messages are counted and skipped; the read goes back from the end until
//! it finds one of ours, within bounds ([`MAX_SCAN`]), and what it found by
//! then is a lower bound on what the cluster wrote: never more.

use std::time::Duration;

use futures::StreamExt;
use pulsar::consumer::InitialPosition;
use pulsar::proto::MessageIdData;
use pulsar::{Consumer, ConsumerOptions, Pulsar, SubType, TokioExecutor};

use super::proof::{Claim, Message, ProofKeys, Retired};
use super::props;
use crate::{Error, TopicProblem};

/// Whether a last-message id means "the topic has no message".
pub fn is_empty_marker(id: &MessageIdData) -> bool {
    // The broker answers entry id -1 for a topic with no entries.
    id.entry_id == u64::MAX || id.ledger_id == u64::MAX
}

/// Whether a message read from a topic is the last one of its entry. A
/// batching producer writes many messages as one entry; a reader gets them
/// one by one, with the entry's id and their index in it.
pub fn ends_entry(id: &MessageIdData, meta: &pulsar::proto::MessageMetadata) -> bool {
    match (id.batch_index, meta.num_messages_in_batch) {
        (Some(index), Some(count)) => index + 1 >= count,
        _ => true,
    }
}

/// A position just before `id`, so that a non-durable subscription started
/// there delivers `id` first (such a start position is exclusive).
pub fn just_before(id: &MessageIdData) -> MessageIdData {
    MessageIdData {
        ledger_id: id.ledger_id,
        // -1 within the same ledger means "before its first entry".
        entry_id: id.entry_id.wrapping_sub(1),
        partition: id.partition,
        batch_index: None,
        ack_set: Vec::new(),
        batch_size: None,
        first_chunk_message_id: None,
    }
}

/// A throwaway, non-durable subscription name: it leaves no cursor behind.
pub fn scratch_subscription(purpose: &str) -> String {
    let n: u64 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default();
    format!("firstseen-{purpose}-{n:x}")
}

/// Opens a non-durable reader on `topic` starting after `start` (or at the
/// earliest message when `None`).
pub async fn reader(
    pulsar: &Pulsar<TokioExecutor>,
    topic: &str,
    start: Option<MessageIdData>,
    purpose: &str,
) -> Result<Consumer<Vec<u8>, TokioExecutor>, Error> {
    let mut options = ConsumerOptions::default()
        .durable(false)
        .with_initial_position(InitialPosition::Earliest);
    if let Some(start) = start {
        options = options.starting_on_message(start);
    }
    Ok(pulsar
        .consumer()
        .with_topic(topic)
        .with_subscription(scratch_subscription(purpose))
        .with_subscription_type(SubType::Exclusive)
        .with_options(options)
        .build()
        .await?)
}

/// Every firstseen producer's name starts with this.
pub const PRODUCER_PREFIX: &str = "firstseen-";

/// Which messages are this cluster's: those that carry its proof
/// ([`super::proof`]), and, while the cluster runs at level 1 (a member may
/// be of a release that writes no proofs), those its producers' names claim.
///
/// Its producers are named `firstseen-c<cluster id>-…`, with the id derived
/// from the cluster secret ([`crate::secret::ClusterKey::cluster_id`]);
/// a name is for the operator, and counts as evidence only at level 1.
#[derive(Clone, Debug)]
pub struct Ours {
    prefix: String,
    /// Name prefixes counted at level 1: this secret's, the previous
    /// secrets', and, on a group of one without a secret file, `clocal`
    /// (what releases before the node kept a secret of its own named it).
    names: Vec<String>,
    proofs: ProofKeys,
}

/// Where a message read from a topic comes from, as far as the cluster can
/// tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// It carries the cluster's proof: sequence `seq` is the cluster's.
    Proven(u64),
    /// No proof, but a producer name of the cluster's: counted as its own
    /// only while the cluster runs at level 1.
    Named(u64),
    /// It carries firstseen's properties and a proof that does not hold, or
    /// a sequence the cluster never assigned: someone else's, made to look
    /// like the cluster's.
    Forged,
    /// Anything else.
    Foreign,
}

impl Ours {
    /// The messages of the cluster with secret key `current`, and of the
    /// secrets it had before (`previous`). `local` for a group of one
    /// without a secret file.
    pub fn new(
        current: &crate::secret::ClusterKey,
        previous: &[crate::secret::ClusterKey],
        local: bool,
    ) -> Self {
        let name = |id: &str| format!("{PRODUCER_PREFIX}c{id}-");
        let mut names: Vec<String> = std::iter::once(current)
            .chain(previous)
            .map(|k| name(&k.cluster_id()))
            .collect();
        if local {
            names.push(name("local"));
        }
        Self {
            prefix: names[0].clone(),
            names,
            proofs: ProofKeys::new(current, previous),
        }
    }

    /// With the previous secrets' cut-offs in `retired` (shared by every
    /// clone: the publisher records into it, the tail read checks by it).
    pub fn with_retired(mut self, retired: Retired) -> Self {
        self.proofs = self.proofs.with_retired(retired);
        self
    }

    /// The name of a producer of this cluster, `rest` telling them apart.
    pub fn producer_name(&self, rest: &str) -> String {
        format!("{}{rest}", self.prefix)
    }

    /// The keys proofs are made and checked with.
    pub fn proofs(&self) -> &ProofKeys {
        &self.proofs
    }

    /// Whether a producer of this cluster's name wrote it.
    fn named(&self, producer_name: &str) -> bool {
        self.names.iter().any(|p| producer_name.starts_with(p))
    }

    /// Where message (`meta`, `body`) of `topic` comes from. `assigned`:
    /// the last sequence the group assigned on the topic, when known (a
    /// sequence beyond it cannot be the cluster's, proof or not).
    pub fn origin(
        &self,
        topic: &str,
        meta: &pulsar::proto::MessageMetadata,
        body: &[u8],
        assigned: Option<u64>,
    ) -> Origin {
        let seq = props::get(meta, props::SEQ).and_then(|s| s.parse::<u64>().ok());
        let key = props::get(meta, props::KEY).and_then(super::proof::key_of);
        let (Some(seq), Some(key)) = (seq, key) else {
            return Origin::Foreign;
        };
        if seq == 0 || assigned.is_some_and(|a| seq > a) {
            return Origin::Forged;
        }
        match props::get(meta, props::PROOF) {
            Some(proof) => {
                let claim = Claim {
                    topic,
                    seq,
                    key: &key,
                    marker: props::get(meta, props::SET_ASIDE).is_some(),
                    body,
                };
                // Every property counts (a v2 proof covers them all).
                let properties: Vec<(&str, &str)> = meta
                    .properties
                    .iter()
                    .map(|kv| (kv.key.as_str(), kv.value.as_str()))
                    .collect();
                let message = Message {
                    claim,
                    properties: &properties,
                };
                // A previous secret without a recorded cut-off proves as
                // before cut-offs: only `verify` without the node's record
                // meets one (it says so), as the publisher reads no tail
                // until the record is made.
                if self.proofs.verifies(&message, proof) {
                    Origin::Proven(seq)
                } else {
                    Origin::Forged
                }
            }
            None if self.named(&meta.producer_name) => Origin::Named(seq),
            None => Origin::Foreign,
        }
    }
}

/// Which messages are ours after a rotation, and after v2 proofs.
#[cfg(test)]
mod ours_after_a_rotation {
    use super::*;
    use crate::secret::ClusterKey;
    use pulsar::proto::{KeyValue, MessageMetadata};

    const TOPIC: &str = "persistent://public/default/t";

    /// Message `seq` with a proof `prove` makes of it.
    fn message(seq: u64, prove: impl Fn(&Message<'_>) -> String) -> MessageMetadata {
        let key = [4u8; 32];
        let mut properties = vec![
            (props::SEQ.to_string(), seq.to_string()),
            (props::KEY.to_string(), hex::encode(key)),
        ];
        let view: Vec<(&str, &str)> = properties
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let proof = prove(&Message {
            claim: Claim {
                topic: TOPIC,
                seq,
                key: &key,
                marker: false,
                body: b"b",
            },
            properties: &view,
        });
        properties.push((props::PROOF.to_string(), proof));
        MessageMetadata {
            producer_name: "anyone".into(),
            properties: properties
                .into_iter()
                .map(|(key, value)| KeyValue { key, value })
                .collect(),
            ..Default::default()
        }
    }

    /// Issue 48: someone with a leaked old secret writes proven messages
    /// numbered past what the cluster wrote under it (but within what it
    /// has assigned since). Without a cut-off they were the tail, and a
    /// new leader skipped everything up to them. Above the cut-off they
    /// are forged; at or below it, the cluster's. (Without the cut-off
    /// check in `ProofKeys::check`, this test fails.)
    #[test]
    fn a_leaked_old_secret_proves_nothing_past_its_cut_off() {
        let old = ClusterKey::from_secret(b"old secret");
        let new = ClusterKey::from_secret(b"new secret");
        let ours = Ours::new(&new, std::slice::from_ref(&old), false);
        // The record the publisher makes at its first read barrier.
        ours.proofs()
            .retired()
            .record(&ours.proofs().unrecorded(), [("t", 6)])
            .unwrap();
        let leaked = Ours::new(&old, &[], false);
        let under_old = |seq| message(seq, |m| leaked.proofs().prove(m));
        let v1_under_old = |seq| message(seq, |m| leaked.proofs().sign(&m.claim));
        let assigned = Some(20);
        assert_eq!(
            ours.origin(TOPIC, &under_old(6), b"b", assigned),
            Origin::Proven(6)
        );
        assert_eq!(
            ours.origin(TOPIC, &v1_under_old(6), b"b", assigned),
            Origin::Proven(6)
        );
        for forged in [under_old(7), v1_under_old(7), under_old(20)] {
            assert_eq!(ours.origin(TOPIC, &forged, b"b", assigned), Origin::Forged);
        }
        // The tail of a topic that ends in the forged ones: the real 6.
        let mut tail = Tail::default();
        let real_new = message(9, |m| ours.proofs().prove(m));
        for m in [under_old(6), under_old(15), v1_under_old(19)] {
            tail.classify(&ours, TOPIC, &m, b"b", 20, true);
        }
        assert_eq!((tail.seq, tail.forged), (Some(6), 2));
        tail.classify(&ours, TOPIC, &real_new, b"b", 20, true);
        assert_eq!(tail.seq, Some(9));
    }

    /// Messages written by builds before v2 (a v1 proof) count as ours at
    /// level 2, beside v2 ones: the change loses or doubles nothing.
    #[test]
    fn v1_and_v2_messages_are_both_ours() {
        let ours = Ours::new(&ClusterKey::from_secret(b"s"), &[], false);
        let v1 = message(3, |m| ours.proofs().sign(&m.claim));
        let v2 = message(4, |m| ours.proofs().prove(m));
        let mut tail = Tail::default();
        tail.classify(&ours, TOPIC, &v1, b"b", 4, true);
        assert_eq!((tail.seq, tail.foreign), (Some(3), 0));
        tail.classify(&ours, TOPIC, &v2, b"b", 4, true);
        assert_eq!((tail.seq, tail.foreign), (Some(4), 0));
    }
}

/// How far back the tail read goes before it gives up and resumes from the
/// watermark: entries of the last ledger, at first, then sixteen times as
/// many each time it finds nothing of the cluster's, up to [`MAX_SCAN`]
/// messages in all (the whole topic from its start at last, when the last
/// ledger held none).
const LOOKBACK: u64 = 64;
/// Messages the tail read reads at most. A topic whose last ledger holds
/// none of the cluster's messages (one foreign write in a fresh ledger, or
/// a secret rotated without `cluster.previous_secret_files`) was read whole
/// within one operation timeout, timed out, and was read again for ever:
/// the outbox filled and acks stopped. Past this the read ends with what
/// it found.
pub const MAX_SCAN: u64 = 100_000;

/// What the tail read found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tail {
    /// The highest `firstseen-seq` of ours in what was read: `None` when
    /// what was read holds nothing of ours. A lower bound on what the
    /// cluster wrote: a message of ours is never missed for a foreign one,
    /// only perhaps not reached.
    pub seq: Option<u64>,
    /// Messages read that are not ours: another producer's, unnumbered, or
    /// numbered beyond what the group has assigned.
    pub foreign: u64,
    /// Of those, messages made to look like ours (firstseen's properties
    /// with a proof that does not hold, or a sequence never assigned).
    pub forged: u64,
    /// The read stopped at its bounds ([`MAX_SCAN`], or the time given)
    /// before it found a message of ours: the publisher resumes after the
    /// watermark, which may send a few messages a second time, never skip
    /// one.
    pub cut_short: bool,
}

impl Tail {
    /// Counts one message read from `topic`, with the last sequence the
    /// group has assigned on it (`assigned`). Below level 2 (`strict`
    /// unset) a message named like the cluster's counts as its own.
    pub fn classify(
        &mut self,
        ours: &Ours,
        topic: &str,
        meta: &pulsar::proto::MessageMetadata,
        body: &[u8],
        assigned: u64,
        strict: bool,
    ) {
        // A late message (`firstseen-late`) went after higher sequences
        // that had landed before it: it is ours, but the tail is among
        // those. Counting it made the tail the highest of the late ones
        // when a refused entry's messages all went late at the end of the
        // topic, and the next producer sent the ones after it again.
        let late = props::get(meta, props::LATE).is_some();
        match ours.origin(topic, meta, body, Some(assigned)) {
            Origin::Proven(_) | Origin::Named(_) if late => {}
            Origin::Proven(seq) => self.seq = self.seq.max(Some(seq)),
            Origin::Named(seq) if !strict => self.seq = self.seq.max(Some(seq)),
            Origin::Forged => {
                self.foreign += 1;
                self.forged += 1;
            }
            Origin::Named(_) | Origin::Foreign => self.foreign += 1,
        }
    }
}

/// What the tail read is told.
#[derive(Debug, Clone, Copy)]
pub struct TailQuery<'a> {
    pub topic: &'a str,
    /// The last sequence the group has assigned on the topic.
    pub assigned: u64,
    /// Only proven messages count (cluster level 2).
    pub strict: bool,
    /// The whole read's time.
    pub budget: Duration,
}

/// The last sequence of ours in the topic (see [`Tail`]). Reads back from
/// the end, further each time it finds nothing of ours, within
/// [`MAX_SCAN`] messages and `q.budget` in all; what it found by then is
/// the answer.
pub async fn last_seq(
    pulsar: &Pulsar<TokioExecutor>,
    ours: &Ours,
    q: TailQuery<'_>,
) -> Result<Tail, Error> {
    let topic = q.topic;
    let deadline = tokio::time::Instant::now() + q.budget;
    let timed_out = || Error::topic(topic, TopicProblem::TailTimedOut);
    let last = tokio::time::timeout_at(deadline, async {
        let mut probe = reader(pulsar, topic, None, "tail").await?;
        let last = probe.get_last_message_id().await;
        close(probe).await;
        last?
            .into_iter()
            .next()
            .ok_or_else(|| Error::topic(topic, TopicProblem::NoLastMessageId))
    })
    .await
    .map_err(|_| timed_out())??;
    if is_empty_marker(&last) {
        return Ok(Tail::default());
    }
    let mut lookback = LOOKBACK;
    let mut total = Tail::default();
    let mut scanned = 0u64;
    loop {
        // Within the last ledger; before its first entry once the lookback
        // reaches it, and from the topic's start after that.
        let whole_ledger = last.entry_id < lookback;
        let start = MessageIdData {
            entry_id: last.entry_id.saturating_sub(lookback),
            ..last.clone()
        };
        let (tail, read, done) = read_to(
            pulsar,
            ours,
            &q,
            Some(just_before(&start)),
            &last,
            deadline,
            MAX_SCAN.saturating_sub(scanned),
        )
        .await?;
        scanned += read;
        total.foreign = total.foreign.max(tail.foreign);
        total.forged = total.forged.max(tail.forged);
        if tail.seq.is_some() {
            return Ok(Tail {
                seq: tail.seq,
                ..total
            });
        }
        if !done {
            return Ok(Tail {
                cut_short: true,
                ..total
            });
        }
        if whole_ledger {
            let (tail, _, done) = read_to(
                pulsar,
                ours,
                &q,
                None,
                &last,
                deadline,
                MAX_SCAN.saturating_sub(scanned),
            )
            .await?;
            return Ok(Tail {
                seq: tail.seq,
                foreign: total.foreign.max(tail.foreign),
                forged: total.forged.max(tail.forged),
                cut_short: !done && tail.seq.is_none(),
            });
        }
        lookback = lookback.saturating_mul(16);
    }
}

/// Reads from after `start` (the topic's start when `None`) through the
/// whole entry `last`, classifying every message, until `deadline` or
/// `limit` messages. Returns what it found, how many it read, and whether
/// it reached the end.
async fn read_to(
    pulsar: &Pulsar<TokioExecutor>,
    ours: &Ours,
    q: &TailQuery<'_>,
    start: Option<MessageIdData>,
    last: &MessageIdData,
    deadline: tokio::time::Instant,
    limit: u64,
) -> Result<(Tail, u64, bool), Error> {
    let Ok(consumer) =
        tokio::time::timeout_at(deadline, reader(pulsar, q.topic, start, "tail")).await
    else {
        return Ok((Tail::default(), 0, false));
    };
    let mut consumer = consumer?;
    let end = (last.ledger_id, last.entry_id);
    let mut tail = Tail::default();
    let mut read = 0u64;
    let done = loop {
        if read >= limit {
            break false;
        }
        let next = match tokio::time::timeout_at(deadline, consumer.next()).await {
            Ok(Some(msg)) => msg?,
            Ok(None) => {
                close(consumer).await;
                return Err(Error::topic(q.topic, TopicProblem::ReaderClosed));
            }
            Err(_) => break false,
        };
        read += 1;
        let id = next.message_id();
        let at = (id.ledger_id, id.entry_id);
        if at > end {
            break true;
        }
        tail.classify(
            ours,
            q.topic,
            next.metadata(),
            &next.payload.data,
            q.assigned,
            q.strict,
        );
        // The last entry may be a batch: its last message holds the
        // highest sequence, and every message of it was persisted with it.
        if at == end && ends_entry(id, next.metadata()) {
            break true;
        }
    };
    close(consumer).await;
    Ok((tail, read, done))
}

/// Closes a reader, or gives up on it after a second: a close the broker
/// does not answer must not hold the publisher (the reader is non-durable
/// and goes with the connection anyway).
async fn close(consumer: Consumer<Vec<u8>, TokioExecutor>) {
    let mut consumer = consumer;
    let _ = tokio::time::timeout(Duration::from_secs(1), consumer.close()).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use pulsar::proto::MessageMetadata;

    fn id(batch_index: Option<i32>) -> MessageIdData {
        MessageIdData {
            ledger_id: 7,
            entry_id: 3,
            partition: None,
            batch_index,
            ack_set: Vec::new(),
            batch_size: None,
            first_chunk_message_id: None,
        }
    }

    fn meta(in_batch: Option<i32>) -> MessageMetadata {
        MessageMetadata {
            num_messages_in_batch: in_batch,
            ..Default::default()
        }
    }

    const TOPIC: &str = "persistent://public/default/t";

    fn secret() -> crate::secret::ClusterKey {
        crate::secret::ClusterKey::from_secret(b"the cluster's secret")
    }

    fn ours() -> Ours {
        Ours::new(&secret(), &[], false)
    }

    /// A message of `producer` numbered `seq`, with key `key`, body `body`,
    /// and a proof under `signer` when given.
    fn written(
        producer: &str,
        seq: u64,
        key: [u8; 32],
        body: &[u8],
        signer: Option<&Ours>,
    ) -> MessageMetadata {
        let mut properties = vec![
            pulsar::proto::KeyValue {
                key: props::SEQ.into(),
                value: seq.to_string(),
            },
            pulsar::proto::KeyValue {
                key: props::KEY.into(),
                value: hex::encode(key),
            },
        ];
        if let Some(o) = signer {
            properties.push(pulsar::proto::KeyValue {
                key: props::PROOF.into(),
                value: o.proofs().sign(&Claim {
                    topic: TOPIC,
                    seq,
                    key: &key,
                    marker: false,
                    body,
                }),
            });
        }
        MessageMetadata {
            producer_name: producer.into(),
            properties,
            ..Default::default()
        }
    }

    /// The forged tail of the review: a writer names its producer like the
    /// cluster's and numbers messages past the real tail while no exclusive
    /// producer is held. By name it was ours, and a new leader resumed after
    /// it, trimming the real ones unpublished. Only the proof counts now.
    #[test]
    fn only_a_proof_makes_a_message_ours_at_level_two() {
        let o = ours();
        let name = o.producer_name("1-t3-p");
        assert!(name.starts_with("firstseen-c"), "{name}");
        let real = written(&name, 7, [1; 32], b"body", Some(&o));
        let forged = written(&name, 9, [2; 32], b"body", None);
        let lookalike = written("firstseen-9-x", 9, [2; 32], b"body", None);
        let assigned = Some(10);
        assert_eq!(o.origin(TOPIC, &real, b"body", assigned), Origin::Proven(7));
        assert_eq!(
            o.origin(TOPIC, &forged, b"body", assigned),
            Origin::Named(9)
        );
        // The clause that took any `firstseen-<digit>` name as ours is gone.
        assert_eq!(
            o.origin(TOPIC, &lookalike, b"body", assigned),
            Origin::Foreign
        );
        // A proof of another body, another cluster's proof, a sequence the
        // group never assigned: forged.
        assert_eq!(o.origin(TOPIC, &real, b"other", assigned), Origin::Forged);
        let other = Ours::new(&crate::secret::ClusterKey::from_secret(b"x"), &[], false);
        let theirs = written(&name, 7, [1; 32], b"body", Some(&other));
        assert_eq!(o.origin(TOPIC, &theirs, b"body", assigned), Origin::Forged);
        let beyond = written(&name, 11, [1; 32], b"body", Some(&o));
        assert_eq!(o.origin(TOPIC, &beyond, b"body", assigned), Origin::Forged);
        let max = written(&name, u64::MAX, [1; 32], b"body", Some(&o));
        assert_eq!(o.origin(TOPIC, &max, b"body", assigned), Origin::Forged);

        let mut strict = Tail::default();
        let mut lenient = Tail::default();
        for m in [&real, &forged, &theirs] {
            strict.classify(&o, TOPIC, m, b"body", 10, true);
            lenient.classify(&o, TOPIC, m, b"body", 10, false);
        }
        assert_eq!((strict.seq, strict.foreign, strict.forged), (Some(7), 2, 1));
        // At level 1 a member may be of a release that writes no proof.
        assert_eq!(lenient.seq, Some(9));
    }

    /// The messages of a refused entry go late, after higher sequences,
    /// and may fill the end of the topic: the tail is the highest before
    /// them. Before, it was the highest late one, and the next producer
    /// sent everything after it again (tests/hostile.rs on the real broker).
    #[test]
    fn a_late_message_is_ours_but_not_the_tail() {
        let o = ours();
        let name = o.producer_name("1-t3-p");
        let landed = written(&name, 9, [1; 32], b"body", Some(&o));
        let mut late = written(&name, 4, [2; 32], b"body", Some(&o));
        late.properties.push(pulsar::proto::KeyValue {
            key: props::LATE.into(),
            value: "true".into(),
        });
        let mut only_late = Tail::default();
        only_late.classify(&o, TOPIC, &late, b"body", 10, true);
        assert_eq!((only_late.seq, only_late.foreign), (None, 0));
        let mut both = Tail::default();
        both.classify(&o, TOPIC, &landed, b"body", 10, true);
        both.classify(&o, TOPIC, &late, b"body", 10, true);
        assert_eq!(both.seq, Some(9));
    }

    #[test]
    fn a_previous_secret_s_messages_and_the_local_name_stay_ours() {
        let old = crate::secret::ClusterKey::from_secret(b"old");
        let before = Ours::new(&old, &[], false);
        let after = Ours::new(&secret(), std::slice::from_ref(&old), true);
        let m = written(&before.producer_name("p"), 4, [5; 32], b"b", Some(&before));
        assert_eq!(after.origin(TOPIC, &m, b"b", Some(9)), Origin::Proven(4));
        // A group of one named its producers `clocal` before it kept a
        // secret of its own.
        let local = written("firstseen-clocal-1-t1-p", 4, [5; 32], b"b", None);
        assert_eq!(after.origin(TOPIC, &local, b"b", Some(9)), Origin::Named(4));
        assert_eq!(ours().origin(TOPIC, &local, b"b", Some(9)), Origin::Foreign);
    }

    #[test]
    fn unnumbered_or_garbled_messages_are_foreign() {
        let o = ours();
        let mut m = written(&o.producer_name("p"), 1, [1; 32], b"", Some(&o));
        m.properties.retain(|kv| kv.key != props::SEQ);
        assert_eq!(o.origin(TOPIC, &m, b"", None), Origin::Foreign);
        let mut m = written(&o.producer_name("p"), 1, [1; 32], b"", Some(&o));
        m.properties[1].value = "zz".into();
        assert_eq!(o.origin(TOPIC, &m, b"", None), Origin::Foreign);
        let zero = written(&o.producer_name("p"), 0, [1; 32], b"", Some(&o));
        assert_eq!(o.origin(TOPIC, &zero, b"", None), Origin::Forged);
    }

    #[test]
    fn a_message_sent_alone_ends_its_entry() {
        assert!(ends_entry(&id(None), &meta(None)));
    }

    #[test]
    fn only_the_last_message_of_a_batch_ends_its_entry() {
        assert!(!ends_entry(&id(Some(0)), &meta(Some(3))));
        assert!(!ends_entry(&id(Some(1)), &meta(Some(3))));
        assert!(ends_entry(&id(Some(2)), &meta(Some(3))));
        assert!(ends_entry(&id(Some(0)), &meta(Some(1))));
    }
}
