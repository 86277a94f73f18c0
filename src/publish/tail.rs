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
//! it finds one of ours, within bounds ([`MAX_ENTRIES`]), and what it found
//! by then is a lower bound on what the cluster wrote: never more.
//!
//! Asked with the watermark ([`landed`]), it also says which sequences
//! between the watermark and the tail the topic lacks ([`Tail::missing`]):
//! what the broker refused while later entries landed. Those go late;
//! what the topic holds does not go again, whether or not its receipt came
//! back, and whichever leader sent it.

use std::time::Duration;

use futures::StreamExt;
use pulsar::consumer::InitialPosition;
use pulsar::proto::MessageIdData;
use pulsar::{Consumer, ConsumerOptions, Pulsar, SubType, TokioExecutor};

use super::landed::Landed;
use super::props;
use super::{Error, TopicProblem};

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

pub use super::ours::{superseded, Found, Origin, Ours, Superseded, PRODUCER_PREFIX};

/// Which messages are ours after a rotation, and after v2 proofs.
#[cfg(test)]
mod ours_after_a_rotation {
    use super::*;
    use crate::publish::proof::{Claim, Message};
    use crate::secret::ClusterKey;
    use pulsar::proto::{KeyValue, MessageMetadata};

    const TOPIC: &str = "persistent://public/default/t";

    /// Message `seq` with a proof `prove` makes of it.
    fn message(seq: u64, prove: impl Fn(&Message<'_>) -> String) -> MessageMetadata {
        message_with(seq, Vec::new(), prove)
    }

    /// Message `seq` with the properties `more` besides its own, and a
    /// proof `prove` makes of it.
    fn message_with(
        seq: u64,
        more: Vec<(String, String)>,
        prove: impl Fn(&Message<'_>) -> String,
    ) -> MessageMetadata {
        let key = [4u8; 32];
        let mut properties = vec![
            (props::SEQ.to_string(), seq.to_string()),
            (props::KEY.to_string(), hex::encode(key)),
        ];
        properties.extend(more);
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

    /// Message `seq` of generation `generation`, proven by `by` (v2).
    fn of_generation(by: &Ours, seq: u64, generation: u64) -> MessageMetadata {
        let more = vec![(props::GENERATION.to_string(), generation.to_string())];
        message_with(seq, more, |m| by.proofs().prove(m))
    }

    /// A generation counts only under the current secret's v2 proof: a v1
    /// proof covers no property (anyone could add a generation to a copy
    /// of an old message), and a previous secret may have leaked. Either
    /// stopped a healthy cluster for good before (a review's repro).
    #[test]
    fn only_the_current_secret_s_whole_proof_carries_a_generation() {
        let old_key = ClusterKey::from_secret(b"old");
        let rotated = Ours::new(
            &ClusterKey::from_secret(b"new"),
            std::slice::from_ref(&old_key),
            false,
        );
        let old = Ours::new(&old_key, &[], false);
        let mut tail = Tail::default();
        // v2 under the previous secret, which the rotated cluster still
        // counts as its own message (no cut-off recorded).
        tail.classify(&rotated, TOPIC, &of_generation(&old, 3, 9), b"b", 20, true);
        assert_eq!(tail.generation, 0, "a previous secret's generation counted");
        // Nor is it this cluster's tail: that would skip its own messages
        // up to it (a second review).
        assert_eq!(
            tail.seq, None,
            "a newer generation's message taken for the tail"
        );
        // v1 under the current secret, a generation added after.
        let mut replayed = of_generation(&rotated, 4, 7);
        let key = [4u8; 32];
        let v1 = rotated.proofs().sign(&Claim {
            topic: TOPIC,
            seq: 4,
            key: &key,
            marker: false,
            body: b"b",
        });
        for kv in &mut replayed.properties {
            if kv.key == props::PROOF {
                kv.value = v1.clone();
            }
        }
        tail.classify(&rotated, TOPIC, &replayed, b"b", 20, true);
        assert_eq!(tail.generation, 0, "a v1 proof's generation counted");
        tail.classify(
            &rotated,
            TOPIC,
            &of_generation(&rotated, 5, 2),
            b"b",
            20,
            true,
        );
        assert_eq!(tail.generation, 2);
    }

    /// Issue 49 item 3: a cluster recovered from a member this one was cut
    /// off from publishes into the same topic with the same secret. Its
    /// proven messages tell their generation whatever their sequence
    /// (above what this cluster assigned, too: they are then no tail of
    /// this one's), and a leader of an older generation gives the topic
    /// up. A generation without a proof that holds (written by someone
    /// without the secret, or changed on a real message) counts for
    /// nothing: it would let anyone stop the cluster.
    #[test]
    fn the_tail_read_learns_the_newest_proven_generation() {
        let ours = Ours::new(&ClusterKey::from_secret(b"s"), &[], false);
        let outsider = Ours::new(&ClusterKey::from_secret(b"x"), &[], false);
        let assigned = 20;
        let mut tail = Tail::default();
        tail.classify(
            &ours,
            TOPIC,
            &of_generation(&ours, 5, 0),
            b"b",
            assigned,
            true,
        );
        assert_eq!((tail.seq, tail.generation), (Some(5), 0));
        // Numbered past what this cluster assigned: not its tail (forged
        // for that purpose), but of a newer generation all the same.
        tail.classify(
            &ours,
            TOPIC,
            &of_generation(&ours, 30, 1),
            b"b",
            assigned,
            true,
        );
        assert_eq!((tail.seq, tail.generation), (Some(5), 1));
        assert!(superseded(0, tail.generation));
        assert!(!superseded(1, tail.generation));
        assert!(!superseded(2, tail.generation));

        let mut tail = Tail::default();
        tail.classify(
            &ours,
            TOPIC,
            &of_generation(&outsider, 6, 9),
            b"b",
            assigned,
            true,
        );
        let mut changed = of_generation(&ours, 7, 1);
        for kv in &mut changed.properties {
            if kv.key == props::GENERATION {
                kv.value = "8".into();
            }
        }
        tail.classify(&ours, TOPIC, &changed, b"b", assigned, true);
        assert_eq!((tail.generation, tail.forged), (0, 2));
        assert!(!superseded(0, tail.generation));
    }

    /// Issue 49 item 2: a survivor recovered (generation 1) with watermark
    /// 3 and 5 messages assigned reads what its lost members published
    /// (generation 0) up to 9. Above the watermark they are older, not its
    /// tail, whatever their sequence (the old tail read called the ones
    /// above 5 forged, and took the others for its own tail, skipping its
    /// own messages); at or below it they are the lineage's, as before.
    /// A cluster never recovered gathers nothing.
    #[test]
    fn a_recovered_cluster_tells_its_lost_members_messages_apart() {
        let ours = Ours::new(&ClusterKey::from_secret(b"s"), &[], false);
        ours.set_generation(1);
        let mut tail = Tail {
            older_above: Some(3),
            ..Tail::default()
        };
        for seq in 1..=9 {
            tail.classify(&ours, TOPIC, &of_generation(&ours, seq, 0), b"b", 5, true);
        }
        assert_eq!(tail.seq, Some(3));
        assert_eq!(
            tail.older.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
            (4..=9).collect::<Vec<_>>()
        );
        assert_eq!((tail.forged, tail.generation), (0, 0));
        // Its own messages after the rebase are of its generation: ours.
        tail.classify(&ours, TOPIC, &of_generation(&ours, 10, 1), b"b", 12, true);
        assert_eq!((tail.seq, tail.older.len()), (Some(10), 6));

        let never = Ours::new(&ClusterKey::from_secret(b"s"), &[], false);
        let mut tail = Tail::default();
        for seq in 1..=9 {
            tail.classify(&never, TOPIC, &of_generation(&never, seq, 0), b"b", 5, true);
        }
        assert_eq!((tail.seq, tail.older.len(), tail.forged), (Some(5), 0, 4));
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

/// How far back the tail read goes at first: the last 64 entries of the
/// last ledger; then, each time that is not enough, sixteen times as many
/// before what it read; then the topic from its start up to the last
/// ledger. Within [`MAX_ENTRIES`] and the read's time in all.
const LOOKBACK: u64 = 64;
/// Entries the tail read reads at most. A topic whose last ledger holds
/// none of the cluster's messages (one foreign write in a fresh ledger, or
/// a secret rotated without `cluster.previous_secret_files`) was read whole
/// within one operation timeout, timed out, and was read again for ever:
/// the outbox filled and acks stopped. Past this the read ends with what
/// it found. It counts entries, not messages: it counted messages, and one
/// batched entry of 100,000 tiny messages (a foreign writer's, got in
/// during an election) used the whole bound up by itself, so the read never
/// reached the cluster's messages after it and every later producer
/// resumed after the watermark, sending again what had gone since. An
/// entry is read whole once begun (its messages were persisted together),
/// within the read's time.
pub const MAX_ENTRIES: u64 = 100_000;

/// What the tail read found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
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
    /// The highest generation (`firstseen-generation`) of the proven
    /// messages read, whatever their sequence: 0 when none carries one. A
    /// newer one than the cluster's means a cluster recovered from this
    /// one publishes here ([`superseded`]).
    pub generation: u64,
    /// Proven messages of an older generation than the cluster's numbered
    /// above the committed watermark, as (sequence, key), in the order
    /// read: what the lost members of a recovered cluster published and
    /// its survivor never received (`firstseen_store::Command::Rebase`).
    /// Gathered only by a read with a watermark, by a cluster of a
    /// generation above 0. They are not the tail (its sequences are the
    /// survivor's to renumber), but the read passes them as messages of
    /// the cluster's lineage, back to the watermark.
    pub older: Vec<(u64, [u8; 32])>,
    /// Above which sequence [`Tail::older`] gathers (the watermark).
    pub older_above: Option<u64>,
    /// The read stopped at its bounds ([`MAX_ENTRIES`], or the time given)
    /// before it found a message of ours, or before it had read back to the
    /// watermark (see `missing`): `seq` is `None`, and the publisher
    /// resumes after the watermark, which may send a few messages a second
    /// time, never skip one.
    pub cut_short: bool,
    /// The sequences between the committed watermark and `seq` that the
    /// topic lacks, as ranges `(first, last)` in order. Messages of one
    /// producer land in the order sent, so these were refused by the broker
    /// while later ones landed: they must go late. Whatever is in the
    /// topic, late or not, is not among them, whatever the publisher
    /// remembers of its receipts. `None`: not checked (read without a
    /// watermark, or a model of the broker); the publisher then goes by the
    /// refusals it remembers.
    pub missing: Option<Vec<(u64, u64)>>,
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
        self.sort(ours, topic, meta, body, assigned, strict);
    }

    /// As [`Tail::classify`], and returns the sequence of a message of
    /// ours with whether it is late.
    fn sort(
        &mut self,
        ours: &Ours,
        topic: &str,
        meta: &pulsar::proto::MessageMetadata,
        body: &[u8],
        assigned: u64,
        strict: bool,
    ) -> Option<(u64, bool)> {
        // A late message (`firstseen-late`) went after higher sequences
        // that had landed before it: it is ours, but the tail is among
        // those. Counting it made the tail the highest of the late ones
        // when a refused entry's messages all went late at the end of the
        // topic, and the next producer sent the ones after it again.
        let late = props::get(meta, props::LATE).is_some();
        if let Some(g) = ours.generation_above(topic, meta, body, self.generation) {
            self.generation = g;
        }
        // A message that says it is of a newer generation than this
        // cluster's is never this cluster's tail, whatever proves it: under
        // the current secret's whole proof it made the topic another
        // cluster's (above); under anything less (a previous secret's, after
        // a rotation) it cannot stop this cluster, and taken for the tail it
        // would skip this cluster's own messages (a review found it so).
        let claimed = props::get(meta, props::GENERATION).and_then(|g| g.parse::<u64>().ok());
        if claimed.is_some_and(|g| g > ours.generation()) {
            self.foreign += 1;
            self.forged += 1;
            return None;
        }
        if let Some(watermark) = self.older_above {
            if let Some((seq, key)) = ours.of_older_generation(topic, meta, body, ours.generation())
            {
                if seq > watermark {
                    self.older.push((seq, key));
                    return Some((seq, late));
                }
            }
        }
        let seq = match ours.origin(topic, meta, body, Some(assigned)) {
            Origin::Proven(seq) => seq,
            Origin::Named(seq) if !strict => seq,
            Origin::Named(_) if late => return None,
            Origin::Forged => {
                self.foreign += 1;
                self.forged += 1;
                return None;
            }
            Origin::Named(_) | Origin::Foreign => {
                self.foreign += 1;
                return None;
            }
        };
        if !late {
            self.seq = self.seq.max(Some(seq));
        }
        Some((seq, late))
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
/// [`MAX_ENTRIES`] entries and `q.budget` in all; what it found by then is
/// the answer. It does not check what lies below the tail (`missing` is
/// `None`).
pub async fn last_seq(
    pulsar: &Pulsar<TokioExecutor>,
    ours: &Ours,
    q: TailQuery<'_>,
) -> Result<Tail, Error> {
    read(pulsar, ours, q, None).await
}

/// The tail, as [`last_seq`], and which sequences between `watermark` (the
/// group's committed watermark) and it the topic lacks ([`Tail::missing`]):
/// it reads back until it has passed a message of ours numbered at most one
/// past the watermark, or the topic's start, within the same bounds. One
/// that reaches them is cut short ([`Tail::cut_short`]).
pub async fn landed(
    pulsar: &Pulsar<TokioExecutor>,
    ours: &Ours,
    q: TailQuery<'_>,
    watermark: u64,
) -> Result<Tail, Error> {
    read(pulsar, ours, q, Some(watermark)).await
}

async fn read(
    pulsar: &Pulsar<TokioExecutor>,
    ours: &Ours,
    q: TailQuery<'_>,
    watermark: Option<u64>,
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
        return Ok(Tail {
            missing: watermark.map(|_| Vec::new()),
            ..Tail::default()
        });
    }
    let mut scan = Scan {
        ours,
        q: &q,
        deadline,
        tail: Tail {
            older_above: watermark.filter(|_| ours.generation() > 0),
            ..Tail::default()
        },
        landed: watermark.map(Landed::new),
        entries: 0,
    };
    let mut end = End::Through((last.ledger_id, last.entry_id));
    let mut lookback = LOOKBACK;
    loop {
        // Within the last ledger, before what was read already.
        let first = last.entry_id.saturating_sub(lookback);
        let start = MessageIdData {
            entry_id: first,
            ..last.clone()
        };
        if !scan.window(pulsar, Some(just_before(&start)), end).await? {
            return Ok(scan.cut_short());
        }
        if scan.enough() {
            return Ok(scan.finish());
        }
        end = End::Before((last.ledger_id, first));
        if first == 0 {
            // The last ledger is read whole: the rest of the topic, from
            // its start.
            if !scan.window(pulsar, None, end).await? {
                return Ok(scan.cut_short());
            }
            return Ok(scan.finish());
        }
        lookback = lookback.saturating_mul(16);
    }
}

/// Where a window of the tail read ends.
#[derive(Debug, Clone, Copy)]
enum End {
    /// With the whole entry at (ledger, entry).
    Through((u64, u64)),
    /// Just before the entry at (ledger, entry), which exists.
    Before((u64, u64)),
}

/// One tail read under way.
struct Scan<'a> {
    ours: &'a Ours,
    q: &'a TailQuery<'a>,
    deadline: tokio::time::Instant,
    tail: Tail,
    /// What lies between the watermark and the tail; `None` when not asked.
    landed: Option<Landed>,
    /// Entries read so far, of [`MAX_ENTRIES`].
    entries: u64,
}

impl Scan<'_> {
    /// Whether the read has what it was asked for.
    fn enough(&self) -> bool {
        self.tail.seq.is_some() && self.landed.as_ref().is_none_or(Landed::covered)
    }

    fn finish(self) -> Tail {
        let seq = self.tail.seq;
        Tail {
            missing: self
                .landed
                .map(|l| seq.map(|t| l.missing(t)).unwrap_or_default()),
            ..self.tail
        }
    }

    /// The read reached its bounds first: what it found is no answer. The
    /// publisher resumes after the watermark and sends what went since it
    /// again, in order: a duplicate, never a loss.
    fn cut_short(self) -> Tail {
        Tail {
            seq: None,
            cut_short: true,
            missing: None,
            ..self.tail
        }
    }

    /// Reads from after `start` (the topic's start when `None`) to `end`,
    /// classifying every message. Returns whether it got there within the
    /// bounds.
    async fn window(
        &mut self,
        pulsar: &Pulsar<TokioExecutor>,
        start: Option<MessageIdData>,
        end: End,
    ) -> Result<bool, Error> {
        let q = self.q;
        let Ok(consumer) =
            tokio::time::timeout_at(self.deadline, reader(pulsar, q.topic, start, "tail")).await
        else {
            return Ok(false);
        };
        let mut consumer = consumer?;
        let done = loop {
            let next = match tokio::time::timeout_at(self.deadline, consumer.next()).await {
                Ok(Some(msg)) => msg?,
                Ok(None) => {
                    close(consumer).await;
                    return Err(Error::topic(q.topic, TopicProblem::ReaderClosed));
                }
                Err(_) => break false,
            };
            let id = next.message_id();
            let at = (id.ledger_id, id.entry_id);
            match end {
                End::Through(last) if at > last => break true,
                End::Before(stop) if at >= stop => break true,
                _ => {}
            }
            let found = self.tail.sort(
                self.ours,
                q.topic,
                next.metadata(),
                &next.payload.data,
                q.assigned,
                q.strict,
            );
            if let (Some((seq, late)), Some(landed)) = (found, self.landed.as_mut()) {
                landed.add(seq, late);
            }
            // An entry counts once its last message is read: a batch of
            // any size is read whole, within the read's time.
            if !ends_entry(id, next.metadata()) {
                continue;
            }
            self.entries += 1;
            // The last entry may be a batch: its last message holds the
            // highest sequence, and every message of it was persisted with
            // it.
            if matches!(end, End::Through(last) if at == last) {
                break true;
            }
            if self.entries >= MAX_ENTRIES {
                break false;
            }
        };
        if let Some(landed) = self.landed.as_mut() {
            landed.end_window();
        }
        close(consumer).await;
        Ok(done)
    }
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
    use crate::publish::proof::Claim;
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
