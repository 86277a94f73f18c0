//! The publisher's decisions, without I/O: where a new producer resumes,
//! when a watermark is proposed, how long to wait after an error, and what
//! a broker's refusal means (held back, set aside, one message per entry).
//! Each decides from the port's own error, [`SendError`]; the runtime
//! (`term`, `inflight`, `late`) does the sending and the Raft writes
//! around them.

use std::time::Duration;

use super::port::SendError;

/// Least time between two watermark proposals of a topic, busy or idle.
/// Each is a Raft entry, and between zones every entry holds the replication
/// stream to each follower for a round trip: proposed at every pause of the
/// publisher (each time its batches were all confirmed), watermarks were as
/// many entries as the batches themselves at the HSL peak with zones 10 ms
/// apart, and the next batch's entry waited behind one (docs/benchmarks.md,
/// "Zones apart"). A watermark that lags what is in Pulsar is safe (a new
/// publisher resumes after the tail), so it only trims the outbox later.
pub const WATERMARK_EVERY: Duration = Duration::from_millis(100);

/// The first sequence a producer that has just taken exclusive access sends.
///
/// `tail` is the last `firstseen-seq` in the topic, read while holding that
/// access; `watermark` is the last sequence the group has committed as
/// published. The tail can be ahead of the watermark (a predecessor's
/// receipts arrived after its last watermark was proposed, or never reached
/// it): resuming at the watermark would publish those messages again. The
/// watermark can be ahead of the tail only if the topic lost messages the
/// broker had confirmed; they are not sent twice either way.
pub fn resume_at(tail: Option<u64>, watermark: u64) -> u64 {
    // Saturating: a sequence is never near the top, but a number read from
    // outside must not be able to wrap the resume point to zero.
    tail.unwrap_or(0).max(watermark).saturating_add(1)
}

/// Whether to propose `confirmed` as the topic's watermark now: only if it
/// moved past what was `proposed`, and the last proposal is
/// [`WATERMARK_EVERY`] old (`since_last` is `None` before the first).
pub fn watermark_due(confirmed: u64, proposed: u64, since_last: Option<Duration>) -> bool {
    watermark_wait(confirmed, proposed, since_last) == Some(Duration::ZERO)
}

/// How long until `confirmed` may be proposed, or `None` when there is
/// nothing to propose: an idle publisher sleeps no longer than this, so a
/// watermark held back goes once it is due.
pub fn watermark_wait(
    confirmed: u64,
    proposed: u64,
    since_last: Option<Duration>,
) -> Option<Duration> {
    if confirmed <= proposed {
        return None;
    }
    Some(since_last.map_or(Duration::ZERO, |d| WATERMARK_EVERY.saturating_sub(d)))
}

/// Why a message goes to Pulsar as a marker instead of itself, or `None`
/// when it goes as it is. A message larger than the broker accepts
/// (`pulsar.max_message_bytes`) is refused for good: the broker closes the
/// connection on the oversized frame, and the publisher would send it again
/// after every reconnect while every later message waited behind it.
/// Ingest keeps messages below that bound, so this catches only what ingest
/// let through under other settings: a node whose `dedup.max_message_bytes`
/// was larger, or a `pulsar.max_message_bytes` lowered since.
pub fn set_aside_reason(
    m: &firstseen_store::OutboxMessage,
    limit: usize,
    format: super::format::Format,
) -> Option<String> {
    let bytes =
        firstseen_store::window::message_bytes(&m.mqtt_topic, &m.payload, m.properties.as_deref())
            .saturating_add(super::props::OWN_BYTES as u64)
            .saturating_add(format.extra_bytes(m.mqtt_topic.len()) as u64);
    (bytes > limit as u64).then(|| {
        format!(
            "{bytes} bytes with firstseen's properties, over pulsar.max_message_bytes ({limit})"
        )
    })
}

/// Whether an error means another producer still holds the topic: a
/// predecessor that was paused or cut off keeps its exclusive producer
/// until the broker drops its connection (keepalive), and this node takes
/// over the moment it does.
pub fn held_elsewhere(error: &SendError) -> bool {
    matches!(error, SendError::HeldElsewhere(_))
}

/// How many times in a row the broker may refuse the same message before it
/// goes as a marker. Once could be a broker in trouble; the same sequence
/// refused again on a fresh producer is a refusal of that message.
pub const REFUSALS_BEFORE_SET_ASIDE: u32 = 2;

/// What a receipt error says about the message or entry it answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Judged {
    /// Not judged: a lost connection or a closed producer; the message may
    /// or may not be in the topic.
    Not,
    /// The broker answered this one message with an error instead of a
    /// receipt (a topic's `maxMessageSize` policy, say), while the producer
    /// and its connection stayed up: it is not in the topic.
    Message,
    /// The broker refused the entry of this many messages starting with this
    /// one: none of them is in the topic, and which one it meant is unknown.
    Entry(u64),
}

/// How the broker judged the send that failed (the adapter sorts the
/// client's error into a [`SendError`]; the publisher decides on that).
fn judged(error: &SendError) -> Judged {
    match error {
        SendError::Refused(_) => Judged::Message,
        SendError::RefusedEntry { messages, .. } => Judged::Entry(*messages),
        _ => Judged::Not,
    }
}

/// Whether a receipt error is the broker's refusal, of one message or of
/// its entry.
pub fn refused_by_broker(error: &SendError) -> bool {
    judged(error) != Judged::Not
}

/// What the broker refused of a topic: the sequences it holds back from the
/// topic, and how many times in a row one message was refused alone.
///
/// The refused sequences must still reach the topic. Entries sent after a
/// refused one may have landed, and then the topic's tail is past them, so
/// the next producer sends them first, late, one by one, before resuming
/// after the tail; a refusal of one of them alone counts towards its marker
/// ([`REFUSALS_BEFORE_SET_ASIDE`]). What the broker merely failed to answer
/// (a lost connection) neither counts nor forgets what is held back.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Refusals {
    /// The message refused alone last, and how many times in a row.
    seq: u64,
    times: u32,
    /// Refused and not yet in the topic: ranges, first to last, in order.
    held: std::collections::VecDeque<(u64, u64)>,
    /// The broker refused a batched entry of this topic in this term (a
    /// `Refusals` lives for one term): which of its messages it meant, it
    /// does not say, so from then on each message goes in an entry of its
    /// own, and the next refusal names its message (the one set aside,
    /// not its neighbours).
    one_per_entry: bool,
}

impl Refusals {
    /// Records a failure first seen at sequence `seq`: `error` when it was
    /// the broker's (or the connection's) answer, `None` for one of the
    /// publisher's own.
    pub fn record(&mut self, seq: Option<u64>, error: Option<&SendError>) {
        let judged = error.map_or(Judged::Not, judged);
        self.one_per_entry |= matches!(judged, Judged::Entry(_));
        let Some(s) = seq else {
            self.times = 0;
            return;
        };
        match judged {
            Judged::Not => self.times = 0,
            Judged::Message => {
                self.times = if s == self.seq && self.times > 0 {
                    self.times + 1
                } else {
                    1
                };
                self.seq = s;
                self.hold(s, s);
            }
            Judged::Entry(messages) => {
                self.times = 0;
                self.hold(s, s + messages.max(1) - 1);
            }
        }
    }

    /// Records a refusal heard after the failure that ended the producer:
    /// it holds its messages back and leaves the count alone. Returns
    /// whether it was news (not another message of an entry held already).
    pub fn heard(&mut self, seq: u64, error: &SendError) -> bool {
        let judged = judged(error);
        self.one_per_entry |= matches!(judged, Judged::Entry(_));
        match judged {
            Judged::Not => false,
            Judged::Message => self.hold(seq, seq),
            Judged::Entry(messages) => self.hold(seq, seq + messages.max(1) - 1),
        }
    }

    fn hold(&mut self, first: u64, last: u64) -> bool {
        if self.held.iter().any(|(a, b)| *a <= first && first <= *b) {
            return false; // another message of an entry already held
        }
        let at = self.held.partition_point(|(a, _)| *a < first);
        self.held.insert(at, (first, last));
        true
    }

    /// The first sequence refused and not yet in the topic.
    pub fn held(&self) -> Option<u64> {
        self.held.front().map(|(first, _)| *first)
    }

    /// Sequence `seq`, the first held back, is in the topic now.
    pub fn landed(&mut self, seq: u64) {
        self.times = 0;
        if let Some(front) = self.held.front_mut() {
            if front.0 == seq && seq < front.1 {
                front.0 = seq + 1;
            } else if front.0 == seq {
                self.held.pop_front();
            }
        }
    }

    /// What the topic lacks between the watermark and its tail, as the tail
    /// read found it (ranges `(first, last)` in order): these go late, and
    /// nothing else does. It replaces what this leader remembers: a refusal
    /// a predecessor saw is found there too (held in its memory only, it was
    /// skipped after a leader change), and a late message whose receipt was
    /// lost is in the topic, so it does not go twice. The count of
    /// refusals in a row stays.
    pub fn found_missing(&mut self, missing: &[(u64, u64)]) {
        self.held = missing.iter().copied().filter(|(a, b)| a <= b).collect();
    }

    /// Nothing after the held sequences landed: the producer resumes at or
    /// before them, in order, and nothing needs to go late.
    pub fn resumed_before(&mut self) {
        self.held.clear();
    }

    /// Whether each message goes in an entry of its own: once the broker
    /// refused a batched entry of the topic, for the rest of the term.
    pub fn one_per_entry(&self) -> bool {
        self.one_per_entry
    }

    /// Why `seq` goes as a marker, if the broker refused it often enough.
    pub fn set_aside(&self, seq: u64) -> Option<String> {
        (self.times >= REFUSALS_BEFORE_SET_ASIDE && self.seq == seq)
            .then(|| format!("refused by the broker {} times in a row", self.times))
    }
}

/// The retry after a producer error, and the backoff after it: a topic held
/// by another producer is tried again every 250 ms, so a successor does not
/// sit out a long backoff after the old holder lets go; other errors back
/// off from 200 ms to 5 s.
pub fn retry_policy(backoff: Duration, held_elsewhere: bool) -> (Duration, Duration) {
    if held_elsewhere {
        (Duration::from_millis(250), backoff)
    } else {
        (backoff, (backoff * 2).min(Duration::from_secs(5)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused() -> SendError {
        SendError::Refused("send_error".into())
    }

    fn entry(messages: u64) -> SendError {
        SendError::RefusedEntry {
            messages,
            why: "too big".into(),
        }
    }

    fn lost() -> SendError {
        SendError::Lost("disconnected".into())
    }

    #[test]
    fn a_message_refused_twice_in_a_row_goes_as_a_marker() {
        let mut r = Refusals::default();
        r.record(Some(7), Some(&refused()));
        assert_eq!(r.set_aside(7), None, "once could be the broker's trouble");
        r.record(Some(7), Some(&refused()));
        assert!(r.set_aside(7).is_some());
        assert_eq!(r.set_aside(8), None, "only that message");
        // A connection lost in between starts the count again.
        let mut r = Refusals::default();
        r.record(Some(7), Some(&refused()));
        r.record(Some(7), Some(&lost()));
        r.record(Some(7), Some(&refused()));
        assert_eq!(r.set_aside(7), None);
        // So does a refusal of another message.
        let mut r = Refusals::default();
        r.record(Some(7), Some(&refused()));
        r.record(Some(9), Some(&refused()));
        assert_eq!(r.set_aside(9), None);
    }

    /// A refused entry holds back all of its messages; they go late one by
    /// one, and a lost connection in between forgets none of them. Before,
    /// an entry's refusal counted as a lost connection, and the next
    /// producer resumed after the tail, past the refused messages for good.
    #[test]
    fn a_refused_entry_holds_back_every_message_in_it() {
        let mut r = Refusals::default();
        r.record(Some(10), Some(&entry(3)));
        assert_eq!(r.held(), Some(10));
        assert_eq!(r.set_aside(10), None, "an entry's refusal names no message");
        r.landed(10);
        assert_eq!(r.held(), Some(11));
        r.record(Some(11), Some(&lost()));
        assert_eq!(r.held(), Some(11), "a lost connection forgets nothing");
        r.record(Some(11), Some(&refused()));
        r.record(Some(11), Some(&refused()));
        assert!(r.set_aside(11).is_some());
        r.landed(11);
        assert_eq!(r.held(), Some(12), "12 is still held back");
        r.landed(12);
        assert_eq!(r.held(), None);
        // Two entries refused with one that landed between them: both are
        // held, each message once.
        r.record(Some(20), Some(&entry(2)));
        assert!(!r.heard(21, &entry(2)), "the same entry");
        assert!(r.heard(30, &entry(2)));
        assert!(!r.heard(31, &entry(2)));
        for n in [20, 21, 30, 31] {
            assert_eq!(r.held(), Some(n));
            r.landed(n);
        }
        assert_eq!(r.held(), None);
        r.record(Some(40), Some(&entry(2)));
        r.resumed_before();
        assert_eq!(r.held(), None);
    }

    /// What the tail read found missing replaces what this leader
    /// remembers: a late message whose receipt was lost (remembered, but in
    /// the topic) does not go again, and a refusal only a predecessor saw
    /// goes late. The count towards a marker stays.
    #[test]
    fn what_the_topic_lacks_replaces_what_is_remembered() {
        let mut r = Refusals::default();
        r.record(Some(7), Some(&refused()));
        // Its late send's receipt was lost: still held in memory.
        r.record(Some(7), Some(&lost()));
        assert_eq!(r.held(), Some(7));
        r.record(Some(9), Some(&refused()));
        r.found_missing(&[(3, 4), (9, 9)]);
        for n in [3, 4, 9] {
            assert_eq!(r.held(), Some(n));
            r.landed(n);
        }
        assert_eq!(r.held(), None, "7 is in the topic");
        let mut r = Refusals::default();
        r.record(Some(9), Some(&refused()));
        r.found_missing(&[(9, 9)]);
        r.record(Some(9), Some(&refused()));
        assert!(r.set_aside(9).is_some(), "refused twice in a row");
    }

    #[test]
    fn only_an_answer_to_the_send_is_a_refusal() {
        assert!(refused_by_broker(&refused()));
        assert_eq!(judged(&entry(4)), Judged::Entry(4));
        assert!(!refused_by_broker(&lost()));
        assert!(!refused_by_broker(&SendError::HeldElsewhere("busy".into())));
    }

    #[test]
    fn a_refused_entry_sends_one_message_per_entry_for_the_rest_of_the_term() {
        let mut r = Refusals::default();
        r.record(Some(3), Some(&refused()));
        r.record(Some(4), Some(&lost()));
        assert!(!r.one_per_entry(), "a message refused alone names itself");
        r.record(Some(5), Some(&entry(3)));
        assert!(r.one_per_entry());
        r.landed(5);
        r.found_missing(&[]);
        r.resumed_before();
        assert!(r.one_per_entry(), "for the rest of the term");
        let mut heard = Refusals::default();
        heard.heard(9, &entry(2));
        assert!(heard.one_per_entry(), "heard out after the failure, too");
    }

    #[test]
    fn a_message_over_the_broker_limit_is_set_aside() {
        use super::super::format::Format;
        let m = |payload: usize| firstseen_store::OutboxMessage {
            key: [0; 32],
            mqtt_topic: "t".into(),
            payload: vec![0; payload],
            node: 1,
            first_seen_ms: 0,
            properties: None,
        };
        let limit = 10_000;
        let raw = Format::Raw;
        assert_eq!(set_aside_reason(&m(100), limit, raw), None);
        let room = limit - super::super::props::OWN_BYTES - 1;
        assert_eq!(set_aside_reason(&m(room), limit, raw), None);
        let why = set_aside_reason(&m(room + 1), limit, raw).unwrap();
        assert!(why.contains("pulsar.max_message_bytes (10000)"), "{why}");
        // The envelope holds the topic again: less room for the payload.
        let envelope = Format::Transitdata;
        assert!(set_aside_reason(&m(room), limit, envelope).is_some());
        let room = room - envelope.extra_bytes(1);
        assert_eq!(set_aside_reason(&m(room), limit, envelope), None);
    }

    #[test]
    fn a_new_producer_resumes_after_whichever_of_tail_and_watermark_is_further() {
        // A predecessor's last batches reached Pulsar after its last
        // watermark: they are in the topic, so resume after them.
        assert_eq!(resume_at(Some(120), 100), 121);
        // The watermark is ahead of what the topic holds.
        assert_eq!(resume_at(Some(90), 100), 101);
        // A topic nothing was ever published to.
        assert_eq!(resume_at(None, 0), 1);
        // An empty topic read (no `firstseen-seq` found) behind a watermark.
        assert_eq!(resume_at(None, 7), 8);
        // Never wraps.
        assert_eq!(resume_at(Some(u64::MAX), 7), u64::MAX);
    }

    #[test]
    fn a_watermark_is_proposed_when_it_moved_and_at_most_every_interval() {
        // Nothing new confirmed: never.
        assert!(!watermark_due(10, 10, None));
        assert!(!watermark_due(10, 10, Some(Duration::from_secs(9))));
        assert_eq!(watermark_wait(10, 10, Some(Duration::from_secs(9))), None);
        // The first one goes at once.
        assert!(watermark_due(11, 10, None));
        // Later ones wait out the interval since the last proposal, idle or
        // not, and say how long is left.
        assert!(!watermark_due(11, 10, Some(Duration::from_millis(40))));
        assert_eq!(
            watermark_wait(11, 10, Some(Duration::from_millis(40))),
            Some(WATERMARK_EVERY - Duration::from_millis(40))
        );
        assert!(watermark_due(11, 10, Some(WATERMARK_EVERY)));
    }

    #[test]
    fn a_topic_held_elsewhere_is_retried_quickly_and_other_errors_back_off() {
        assert!(held_elsewhere(&SendError::HeldElsewhere(
            "ProducerBusy".into()
        )));
        assert!(!held_elsewhere(&SendError::Lost(
            "ProducerBusy: exclusive producer".into()
        )));
        let (d, next) = retry_policy(Duration::from_secs(4), true);
        assert_eq!(
            (d, next),
            (Duration::from_millis(250), Duration::from_secs(4))
        );
        let (d, next) = retry_policy(Duration::from_secs(4), false);
        assert_eq!((d, next), (Duration::from_secs(4), Duration::from_secs(5)));
        let (d, next) = retry_policy(Duration::from_millis(200), false);
        assert_eq!(
            (d, next),
            (Duration::from_millis(200), Duration::from_millis(400))
        );
    }
}
