//! The publisher's decisions, without I/O: where a new producer resumes,
//! when a watermark is proposed, and how long to wait after an error. The
//! runtime in `mod.rs` does the sending and the Raft writes around them.

use std::time::Duration;

use super::port::SendError;
use crate::Error;

/// Least time between two watermark proposals of a topic while busy. Each
/// is a Raft entry; one per publish batch was about half of all entries at
/// the HSL peak. A watermark that lags what is in Pulsar is safe (a new
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
/// moved past what was `proposed`, and then at once when `flush` is set (the
/// publisher is idle) or when the last proposal is [`WATERMARK_EVERY`] old
/// (`since_last` is `None` before the first).
pub fn watermark_due(
    confirmed: u64,
    proposed: u64,
    since_last: Option<Duration>,
    flush: bool,
) -> bool {
    confirmed > proposed && (flush || since_last.is_none_or(|d| d >= WATERMARK_EVERY))
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
pub fn held_elsewhere(error: &Error) -> bool {
    matches!(error, Error::Broker(SendError::HeldElsewhere(_)))
}

/// How many times in a row the broker may refuse the same message before it
/// goes as a marker. Once could be a broker in trouble; the same sequence
/// refused again on a fresh producer is a refusal of that message.
pub const REFUSALS_BEFORE_SET_ASIDE: u32 = 2;

/// Whether a receipt error is the broker's refusal of that one message: it
/// answered the send with an error instead of a receipt (a topic's
/// `maxMessageSize` policy, say), while the producer and its connection
/// stayed up (the adapter sorts the client's error into
/// [`SendError::Refused`]). A lost connection or a closed producer is not a
/// refusal: the message was never judged.
pub fn refused_by_broker(error: &Error) -> bool {
    matches!(error, Error::Broker(SendError::Refused(_)))
}

/// Counts the broker's refusals of one sequence in a row, and says when it
/// goes as a marker ([`REFUSALS_BEFORE_SET_ASIDE`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Refusals {
    seq: u64,
    times: u32,
}

impl Refusals {
    /// Records a failure of sequence `seq`: a refusal counts, anything else
    /// starts the count again.
    pub fn record(&mut self, seq: Option<u64>, refused: bool) {
        match seq.filter(|_| refused) {
            Some(s) if s == self.seq && self.times > 0 => self.times += 1,
            Some(s) => *self = Self { seq: s, times: 1 },
            None => *self = Self::default(),
        }
    }

    /// The sequence the broker refused last, if its last failure was one.
    pub fn pending(&self) -> Option<u64> {
        (self.times > 0).then_some(self.seq)
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

    #[test]
    fn a_message_refused_twice_in_a_row_goes_as_a_marker() {
        let mut r = Refusals::default();
        r.record(Some(7), true);
        assert_eq!(r.set_aside(7), None, "once could be the broker's trouble");
        r.record(Some(7), true);
        assert!(r.set_aside(7).is_some());
        assert_eq!(r.set_aside(8), None, "only that message");
        // A connection lost in between starts the count again.
        let mut r = Refusals::default();
        r.record(Some(7), true);
        r.record(Some(7), false);
        r.record(Some(7), true);
        assert_eq!(r.set_aside(7), None);
        // So does a refusal of another message.
        let mut r = Refusals::default();
        r.record(Some(7), true);
        r.record(Some(9), true);
        assert_eq!(r.set_aside(9), None);
    }

    #[test]
    fn only_an_answer_to_the_send_is_a_refusal() {
        let refused = Error::Broker(SendError::Refused("send_error".into()));
        assert!(refused_by_broker(&refused));
        let lost = Error::Broker(SendError::Lost("disconnected".into()));
        assert!(!refused_by_broker(&lost));
        assert!(!refused_by_broker(&Error::LeaseLost));
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
    fn a_watermark_is_proposed_when_it_moved_and_at_most_every_interval_while_busy() {
        // Nothing new confirmed: never, not even when idle.
        assert!(!watermark_due(10, 10, None, true));
        assert!(!watermark_due(10, 10, Some(Duration::from_secs(9)), false));
        // The first one goes at once.
        assert!(watermark_due(11, 10, None, false));
        // While busy, it waits out the interval since the last proposal.
        assert!(!watermark_due(
            11,
            10,
            Some(Duration::from_millis(40)),
            false
        ));
        assert!(watermark_due(11, 10, Some(WATERMARK_EVERY), false));
        // When the publisher is idle the held-back one goes now.
        assert!(watermark_due(11, 10, Some(Duration::from_millis(40)), true));
    }

    #[test]
    fn a_topic_held_elsewhere_is_retried_quickly_and_other_errors_back_off() {
        assert!(held_elsewhere(&Error::Broker(SendError::HeldElsewhere(
            "ProducerBusy".into()
        ))));
        assert!(!held_elsewhere(&Error::Broker(SendError::Lost(
            "ProducerBusy: exclusive producer".into()
        ))));
        assert!(!held_elsewhere(&Error::Io(std::io::Error::other(
            "ProducerBusy: exclusive producer"
        ))));
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
