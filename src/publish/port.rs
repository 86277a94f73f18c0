//! What the publisher needs from the outside world, as traits.
//!
//! The publisher's protocol (leader only, lease before each batch, exclusive
//! producer, resume after the tail, receipts oldest first, watermarks) talks
//! to three things: the broker, the Raft group and the replicated outbox.
//! Here they are traits, so that the same publisher runs against Pulsar and
//! openraft in a node (`adapter/`) and against models of them in the
//! simulation (`tests/simulate_publish.rs`), where thousands of seeded
//! schedules of leader changes, pauses and lost receipts run in seconds.

use std::future::Future;
use std::pin::Pin;

use firstseen_store::{OutboxMessage, TopicState};

use super::Error;

pub use crate::send::SendError;

/// Resolves once the broker has persisted one message, or fails when it
/// will never say so (the connection or the producer is gone: the message
/// may or may not be in the topic).
pub type Receipt = Pin<Box<dyn Future<Output = Result<(), SendError>> + Send>>;

/// How a message goes to the broker, besides as itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sending {
    /// A marker goes in the message's place: its sequence, key, MQTT topic,
    /// node and time, an empty payload, and this reason
    /// (`firstseen-set-aside`).
    pub set_aside: Option<String>,
    /// It follows higher sequences: the broker refused it while they were
    /// on their way (`firstseen-late`), so that an audit tells it from a
    /// reordering.
    pub late: bool,
    /// How the message is written (`routes[].format`). A marker is always
    /// written raw: an empty body without schema properties, which
    /// transitdata's consumers skip as a message of no schema they know
    /// rather than parse an empty payload.
    pub format: super::format::Format,
    /// The cluster's generation (`firstseen-generation`, written when not
    /// 0): what the publisher's outbox was applied at when it took the
    /// topic.
    pub generation: u64,
    /// It goes in an entry of its own, none joining it
    /// ([`super::policy::Refusals::one_per_entry`]).
    pub alone: bool,
}

/// The broker (Pulsar).
pub trait Broker: Send + Sync {
    /// One connection to the broker, held for a leadership term.
    type Session: Session;

    /// Connects for a new term.
    fn connect(&self) -> impl Future<Output = Result<Self::Session, SendError>> + Send;
}

/// A connection to the broker.
pub trait Session: Send + Sync {
    /// A producer with exclusive access to one topic.
    type Producer: Send;

    /// Takes exclusive access to `topic` under `name`. Refused while another
    /// producer holds it, with [`SendError::HeldElsewhere`].
    fn exclusive(
        &self,
        topic: &str,
        name: &str,
    ) -> impl Future<Output = Result<Self::Producer, SendError>> + Send;

    /// The last `firstseen-seq` of ours in the topic, where the group has
    /// assigned up to `assigned`, and how many foreign messages the read
    /// passed ([`super::tail::Tail`]). Read while holding the topic's
    /// producer, so it cannot move. `strict`: only messages with the
    /// cluster's proof count (cluster level 2). A lower bound: what the read
    /// could not reach within its bounds is not counted.
    fn last_seq(
        &self,
        topic: &str,
        assigned: u64,
        strict: bool,
    ) -> impl Future<Output = Result<super::tail::Tail, Error>> + Send;

    /// The tail, as [`Session::last_seq`], and which sequences between
    /// `watermark` (the group's committed watermark) and it the topic lacks
    /// ([`super::tail::Tail::missing`]): those the broker refused while
    /// later ones landed, which go late, whoever saw the refusal; whatever
    /// the topic holds does not go again. The default checks nothing below
    /// the tail (`missing` is `None`), and the publisher goes by the
    /// refusals it remembers.
    fn read_tail(
        &self,
        topic: &str,
        assigned: u64,
        watermark: u64,
        strict: bool,
    ) -> impl Future<Output = Result<super::tail::Tail, Error>> + Send {
        let _ = watermark;
        self.last_seq(topic, assigned, strict)
    }

    /// The largest message the broker takes on `topic`, when the broker
    /// says (its `maxMessageSize`, or the topic's own policy); the
    /// publisher keeps the smaller of this and `pulsar.max_message_bytes`.
    /// `None`: only the configured bound holds. Asked when a producer is
    /// acquired.
    fn message_limit(&self, _topic: &str) -> impl Future<Output = Option<usize>> + Send {
        async { None }
    }

    /// Queues message `seq` on `producer`. Messages are persisted in the
    /// order they are queued; the receipt says when this one is. `how`
    /// says whether a marker goes in its place, and whether it is late. A
    /// message may wait in the producer until [`Session::flush`]: the
    /// messages queued together go in as few broker entries as fit.
    fn send(
        &self,
        producer: &mut Self::Producer,
        seq: u64,
        message: OutboxMessage,
        how: Sending,
    ) -> impl Future<Output = Result<Receipt, SendError>> + Send;

    /// Sends whatever [`Session::send`] queued on `producer` and has not
    /// sent yet. The publisher calls it after each batch, before it awaits
    /// any of the batch's receipts.
    fn flush(
        &self,
        _producer: &mut Self::Producer,
    ) -> impl Future<Output = Result<(), SendError>> + Send {
        async { Ok(()) }
    }
}

/// The Raft group, as the publisher of one node sees it.
pub trait Consensus: Send + Sync {
    /// The current term, and the leader this node knows of. What it returns
    /// counts as seen by [`Consensus::changed`].
    fn leadership(&mut self) -> (u64, Option<u64>);

    /// Waits until [`Consensus::leadership`] may have changed since it was last
    /// read.
    fn changed(&mut self) -> impl Future<Output = ()> + Send;

    /// Whether a quorum still follows this node as leader. Bounded by less
    /// than an election timeout, so a leader cut off lets go before a
    /// successor can exist.
    fn confirm_lease(&self) -> impl Future<Output = bool> + Send;

    /// Whether a quorum still follows this node as leader, after this node
    /// applied every entry in its log when it asked (all of them get
    /// committed while it leads, and they include every entry committed
    /// before): then no message a
    /// predecessor may have published is missing from its outbox, and a
    /// tail numbered beyond it is not ours. Bounded like
    /// [`Consensus::confirm_lease`].
    fn read_barrier(&self) -> impl Future<Output = bool> + Send;

    /// Proposes the receipt `Published{topic, seq}` without waiting for it.
    fn watermark(&self, topic: String, seq: u64);

    /// Keeps a message that goes to Pulsar as a marker in the replicated
    /// set-aside store (cluster level 2), and returns once that is
    /// committed: only then may the marker be sent.
    fn set_aside(
        &self,
        record: firstseen_store::SetAside,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Commits a rebase of a topic (`firstseen_store::Command::Rebase`) and
    /// returns once it is applied. Only a recovered cluster (generation
    /// above 0) asks; the models never are one.
    fn rebase(
        &self,
        rebase: firstseen_store::Rebase,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        let _ = rebase;
        async { Err(Error::LeaseLost) }
    }
}

/// The replicated outbox: messages with a sequence, not yet published.
/// Its errors are the store's, which cross stages: the crate's.
pub trait Outbox: Send + Sync {
    /// Every topic with its last assigned and last published sequence.
    fn topics(&self) -> Result<Vec<(String, TopicState)>, crate::Error>;

    /// The cluster level the outbox was applied at (`firstseen_store::level`):
    /// from level 2 only proven messages count at the end of a topic.
    fn level(&self) -> u32 {
        firstseen_store::level::BASE
    }

    /// The cluster's generation (`firstseen_store::Command::Generation`):
    /// 0 for a cluster never recovered with `--force-new-cluster`.
    fn generation(&self) -> u64 {
        0
    }

    /// One topic's last assigned and last published sequence.
    fn topic(&self, topic: &str) -> Result<TopicState, crate::Error>;

    /// Up to `limit` messages of `topic` from sequence `from` on, in order.
    fn read(
        &self,
        topic: &str,
        from: u64,
        limit: usize,
    ) -> Result<Vec<(u64, OutboxMessage)>, crate::Error>;

    /// When the entry that assigned `seq` of `topic` was applied on this
    /// node, if it knows: where the `publish` stage of
    /// `firstseen_stage_seconds` starts. A measurement only; the models
    /// keep none.
    fn applied_at(&self, _topic: &str, _seq: u64) -> Option<std::time::Instant> {
        None
    }

    /// Resolves once the outbox may have grown since it last resolved (an
    /// entry was applied), at once if it already has. Cancel-safe.
    fn grown(&mut self) -> impl Future<Output = ()> + Send;
}
