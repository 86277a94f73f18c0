//! The producers' protocol state on a connection, without the socket: the
//! entries each producer has in flight, how the broker's answers settle
//! them ([`ProducerSlot::settle`]), and what the broker's refusals mean to
//! the publisher ([`refusal`]).
//!
//! Apart from the connection's I/O (`conn.rs`, `socket.rs`) so that the
//! rules of settlement, which the broker's out-of-order answers make
//! subtle, are plain functions over plain data, tested without a socket,
//! and a change to how a refusal is read touches this file alone.

use std::collections::VecDeque;

use pulsar::proto;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::super::port::SendError;

/// Why an entry did not land.
#[derive(Debug, Clone)]
pub enum Failure {
    /// The broker answered the entry of `messages` messages with an error
    /// instead of a receipt: a judgement of the entry, which names no one
    /// message in it.
    Refused { messages: usize, why: String },
    /// Anything else: the producer or the connection is gone.
    Lost(SendError),
}

/// A receipt on its way: resolves with the entry's fate.
pub type Waiter = oneshot::Sender<Result<(), Failure>>;

/// The broker's answer to one entry, as it names the entry.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Answer {
    /// Persisted: `CommandSendReceipt`'s `sequence_id` and, when the frame
    /// has it, `highest_sequence_id`.
    Receipt { seq: u64, highest: Option<u64> },
    /// Refused: `CommandSendError`'s `sequence_id` and the reason.
    Refused { seq: u64, why: String },
}

impl Answer {
    /// A `CommandSendReceipt` as the entry it names.
    pub(super) fn of_receipt(r: &proto::CommandSendReceipt) -> Self {
        Answer::Receipt {
            seq: r.sequence_id,
            highest: r.highest_sequence_id,
        }
    }

    /// A `CommandSendError` as the entry it names and why it was refused.
    pub(super) fn of_error(e: &proto::CommandSendError) -> Self {
        let why = format!(
            "{:?}: {}",
            proto::ServerError::try_from(e.error).unwrap_or(proto::ServerError::UnknownError),
            e.message
        );
        Answer::Refused {
            seq: e.sequence_id,
            why,
        }
    }
}

/// An entry sent and not yet acknowledged: its sequence ids, its size and
/// who waits.
pub(super) struct Pending {
    /// The sequence id of its first message: the entry's `sequence_id`,
    /// which its receipt carries.
    pub(super) first: u64,
    /// Its last message's: the entry's `highest_sequence_id`, which its
    /// receipt carries too, and which the broker's error for it names (it
    /// answers a refused entry with the larger of the two ids).
    pub(super) last: u64,
    pub(super) messages: usize,
    pub(super) waiters: Vec<Waiter>,
    /// The broker has persisted an entry sent after this one: this one was
    /// refused, its error not read yet (see [`ProducerSlot::settle`]).
    pub(super) overtaken: bool,
}

impl Pending {
    /// Whether the broker's answer `answer` is this entry's.
    ///
    /// A receipt carries the entry's first id as `sequence_id` and its last
    /// as `highest_sequence_id`. The broker reports no highest id for an
    /// entry of one message (it only tracks one when it is above the first:
    /// the wire then has -1, or nothing), so the cross-check holds for
    /// entries of several. An error carries one id only, the larger of the
    /// two the entry was sent with (Pulsar 4.0, `Producer.java`, both where
    /// it judges the entry before the log and where the log fails it): the
    /// last, for this client, which always sends both; the first is
    /// accepted too, as the id of a broker that reports the lowest.
    fn answered_by(&self, answer: &Answer) -> bool {
        match answer {
            Answer::Receipt { seq, highest } => {
                *seq == self.first
                    && (self.first == self.last || highest.is_none_or(|h| h == self.last))
            }
            Answer::Refused { seq, .. } => *seq == self.first || *seq == self.last,
        }
    }

    /// Fails every waiter: as refused when a later entry overtook this one
    /// (it is surely not in the topic), else as lost (it may be).
    pub(super) fn fail(self, lost: impl Fn() -> SendError) {
        let failure = if self.overtaken {
            Failure::Refused {
                messages: self.messages,
                why:
                    "the broker persisted a later entry and not this one (its refusal was not read)"
                        .into(),
            }
        } else {
            Failure::Lost(lost())
        };
        for w in self.waiters {
            let _ = w.send(Err(failure.clone()));
        }
    }
}

/// A producer's state on the connection.
#[derive(Default)]
pub(super) struct ProducerSlot {
    /// The topic it writes, for the fence its close holds ([`Closing`](super::conn::Closing)).
    pub(super) topic: String,
    pub(super) pending: VecDeque<Pending>,
    /// Why the producer can no longer send (the broker closed it, or
    /// refused an entry, or it is being closed): every later send fails at
    /// once.
    pub(super) gone: Option<SendError>,
    /// Set once a close at the broker is under way, so that a second close
    /// waits for the first.
    pub(super) closing: Option<Close>,
}

/// A producer's close at the broker, as its callers follow it.
#[derive(Clone)]
pub struct Close {
    /// Cancelled once the caller may stop waiting: the broker answered the
    /// close, or did not within the operation timeout (the producer's
    /// entries still unanswered are then in doubt), or refused it, or the
    /// connection is gone.
    pub heard: CancellationToken,
    /// Cancelled once the close has settled for good: the broker answered
    /// it, or the connection is gone. Until then the broker may hold
    /// writes of the producer, and the topic stays fenced in this process
    /// ([`closes_settled`](super::conn::closes_settled)).
    pub settled: CancellationToken,
}

impl Close {
    pub(super) fn new() -> Self {
        Self {
            heard: CancellationToken::new(),
            settled: CancellationToken::new(),
        }
    }

    pub(super) fn done() -> Self {
        let c = Self::new();
        c.heard.cancel();
        c.settled.cancel();
        c
    }
}

impl ProducerSlot {
    /// Settles the entry of `producer` that `answer` names: persisted, or
    /// refused for the reason given.
    ///
    /// The broker does not answer in the order the entries were sent: it
    /// judges an entry (its size against the topic's bound, say) before it
    /// reaches the log, and its error for a refused entry may come after
    /// the receipts of entries sent later (seen on the real broker: the
    /// receipt for the second entry ahead of the error for the first).
    /// Receipts among themselves do come in order, since the log persists
    /// entries in order. So a receipt for a later entry means the earlier
    /// ones still waiting were refused: they are marked so, and wait for
    /// their errors; should the producer go first, they fail as refused,
    /// not lost, because the topic surely lacks them. A refusal settles its
    /// own entry wherever it sits, and only that one.
    pub(super) fn settle(&mut self, producer: u64, answer: Answer) -> Result<(), OutOfOrder> {
        let Some(at) = self.pending.iter().position(|p| p.answered_by(&answer)) else {
            return match (&answer, self.pending.front()) {
                // An error for an entry no longer waited for (its
                // receipt timed out), or nothing in flight.
                (Answer::Refused { .. }, _) | (Answer::Receipt { .. }, None) => Ok(()),
                (Answer::Receipt { seq, highest }, Some(p)) => Err(OutOfOrder {
                    producer,
                    got: *seq,
                    highest: *highest,
                    expected: p.first,
                }),
            };
        };
        let refused = match answer {
            Answer::Receipt { .. } => None,
            Answer::Refused { why, .. } => Some(why),
        };
        if refused.is_none() {
            for earlier in self.pending.iter_mut().take(at) {
                earlier.overtaken = true;
            }
        }
        let done = self.pending.remove(at).expect("found above");
        let result = match refused {
            None => Ok(()),
            Some(why) => {
                // A refused entry ends the producer for new sends: nothing
                // more goes behind it before the publisher has settled it.
                // The ones already sent keep waiting for their own answers,
                // which the broker gives each (a later one may land, or be
                // refused too).
                self.gone = Some(SendError::Lost(format!(
                    "the broker refused an entry: {why}"
                )));
                Err(Failure::Refused {
                    messages: done.messages,
                    why,
                })
            }
        };
        for w in done.waiters {
            let _ = w.send(result.clone());
        }
        Ok(())
    }
}

/// A receipt for another entry than the oldest in flight: the connection
/// can no longer be trusted.
#[derive(Debug, thiserror::Error)]
#[error("a receipt for sequence {got} (highest {highest:?}) of producer {producer}, expecting {expected}")]
pub(super) struct OutOfOrder {
    producer: u64,
    got: u64,
    highest: Option<u64>,
    expected: u64,
}

/// A broker's refusal code as the publisher decides on it.
pub(super) fn refusal(code: i32, message: &str) -> SendError {
    use proto::ServerError as E;
    match E::try_from(code) {
        Ok(E::ProducerBusy | E::ProducerFenced) => SendError::HeldElsewhere(message.to_string()),
        Ok(E::TopicNotFound) => SendError::TopicNotFound(message.to_string()),
        Ok(e) => SendError::Lost(format!("{e:?}: {message}")),
        Err(_) => SendError::Lost(format!("error {code}: {message}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Entries in flight, each `(first, last)`, of two messages each.
    fn in_flight(
        entries: &[(u64, u64)],
    ) -> (ProducerSlot, Vec<oneshot::Receiver<Result<(), Failure>>>) {
        let mut slot = ProducerSlot::default();
        let mut rx = Vec::new();
        for &(first, last) in entries {
            let (tx, r) = oneshot::channel();
            slot.pending.push_back(Pending {
                first,
                last,
                messages: 2,
                waiters: vec![tx],
                overtaken: false,
            });
            rx.push(r);
        }
        (slot, rx)
    }

    fn receipt(first: u64, last: u64) -> Answer {
        Answer::Receipt {
            seq: first,
            highest: Some(last),
        }
    }

    /// The broker's error for an entry: it names the larger of the entry's
    /// two ids, its last.
    fn refused(last: u64) -> Answer {
        Answer::Refused {
            seq: last,
            why: "too big".into(),
        }
    }

    /// The broker refuses the second entry before it has persisted the
    /// first: the first still lands, the second is refused, the third
    /// waits for its own answer. Before, the refusal broke the connection
    /// as a receipt out of order (tests/hostile.rs on the real broker).
    #[test]
    fn a_refusal_may_overtake_the_receipts_before_it() {
        let (mut slot, mut rx) = in_flight(&[(1, 2), (3, 4), (5, 6)]);
        slot.settle(7, refused(4)).unwrap();
        assert!(matches!(
            rx[1].try_recv(),
            Ok(Err(Failure::Refused { messages: 2, .. }))
        ));
        assert!(rx[0].try_recv().is_err(), "the first still waits");
        assert!(rx[2].try_recv().is_err(), "the third still waits");
        assert!(slot.gone.is_some(), "nothing new goes behind a refusal");
        slot.settle(7, receipt(1, 2)).unwrap();
        assert!(matches!(rx[0].try_recv(), Ok(Ok(()))));
        slot.settle(7, receipt(5, 6)).unwrap();
        assert!(matches!(rx[2].try_recv(), Ok(Ok(()))));
    }

    /// Issue 48: the broker names a refused entry of several messages by
    /// its highest sequence id, not its first. Before, the pending entry
    /// was looked up by its first id only: the error was dropped as one
    /// for an entry no longer waited for, and the entry waited out the
    /// receipt timeout, which then abandoned the whole connection (on the
    /// real broker: nothing published for minutes; tests/hostile.rs,
    /// `entries_the_broker_refuses_by_their_last_id_do_not_stall_the_topic`).
    #[test]
    fn a_refusal_names_a_batched_entry_by_its_last_sequence() {
        let (mut slot, mut rx) = in_flight(&[(10, 12), (13, 15)]);
        slot.settle(7, refused(12)).unwrap();
        assert!(matches!(
            rx[0].try_recv(),
            Ok(Err(Failure::Refused { messages: 2, .. }))
        ));
        assert!(rx[1].try_recv().is_err(), "the second waits for its own");
        // A broker that names the first id is understood too.
        slot.settle(
            7,
            Answer::Refused {
                seq: 13,
                why: "x".into(),
            },
        )
        .unwrap();
        assert!(matches!(rx[1].try_recv(), Ok(Err(Failure::Refused { .. }))));
        assert!(slot.pending.is_empty());
        // An id inside an entry names neither end: not that entry.
        let (mut slot, mut rx) = in_flight(&[(20, 22)]);
        slot.settle(
            7,
            Answer::Refused {
                seq: 21,
                why: "x".into(),
            },
        )
        .unwrap();
        assert!(rx[0].try_recv().is_err());
    }

    /// A receipt names its entry by its first id and, for an entry of
    /// several messages, its last; one whose last id is not the entry's is
    /// not that entry's receipt, and breaks the connection. For an entry of
    /// one message the broker reports no highest id (-1 on the wire).
    #[test]
    fn a_receipt_is_its_entry_s_by_both_ends() {
        let (mut slot, mut rx) = in_flight(&[(1, 3)]);
        assert!(slot.settle(7, receipt(1, 2)).is_err());
        assert!(rx[0].try_recv().is_err());
        slot.settle(
            7,
            Answer::Receipt {
                seq: 1,
                highest: None,
            },
        )
        .unwrap();
        assert!(matches!(rx[0].try_recv(), Ok(Ok(()))));
        let (mut slot, mut rx) = in_flight(&[(4, 4)]);
        slot.settle(7, receipt(4, u64::MAX)).unwrap();
        assert!(matches!(rx[0].try_recv(), Ok(Ok(()))));
    }

    /// The receipt for a later entry comes while an earlier one still
    /// waits: the broker refused the earlier one, and if the producer goes
    /// before its error is read, it fails as refused, not as lost (the
    /// tail, past it, would hide it). Before, this receipt broke the
    /// connection and the earlier entry counted as lost.
    #[test]
    fn a_receipt_that_overtakes_an_entry_means_that_entry_was_refused() {
        let (mut slot, mut rx) = in_flight(&[(1, 2), (3, 4)]);
        slot.settle(7, receipt(3, 4)).unwrap();
        assert!(matches!(rx[1].try_recv(), Ok(Ok(()))));
        for p in slot.pending.drain(..) {
            p.fail(|| SendError::Lost("connection lost".into()));
        }
        assert!(matches!(
            rx[0].try_recv(),
            Ok(Err(Failure::Refused { messages: 2, .. }))
        ));
        // A receipt for an entry never sent is a broken connection.
        let (mut slot, _rx) = in_flight(&[(1, 2)]);
        assert!(slot.settle(7, receipt(9, 10)).is_err());
    }

    #[test]
    fn a_busy_topic_is_held_elsewhere_and_other_refusals_are_lost() {
        use proto::ServerError as E;
        assert!(matches!(
            refusal(E::ProducerBusy as i32, "x"),
            SendError::HeldElsewhere(_)
        ));
        assert!(matches!(
            refusal(E::ProducerFenced as i32, "x"),
            SendError::HeldElsewhere(_)
        ));
        assert!(matches!(
            refusal(E::AuthorizationError as i32, "x"),
            SendError::Lost(_)
        ));
        assert!(matches!(refusal(9999, "x"), SendError::Lost(_)));
    }
}
