//! The upstream MQTT broker, as ingest sees it: one persistent session per
//! upstream, split in two halves as MQTT clients split it.
//!
//! - [`UpstreamClient`] is the half that sends: acks, the subscribe, the
//!   disconnect. It is shared with the [`crate::ingest::ack::AckGate`], which acks
//!   after commit from the batcher's task.
//! - [`UpstreamSession`] is the half that reads: it connects, reconnects
//!   when polled after a failure, and reports [`Event`]s.
//!
//! A node plugs in rumqttc (`adapter/`); `tests/simulate_cluster.rs`
//! plugs in a model of a broker with persistent sessions, so the ingest
//! loop, its reconnects and the ack gate's epochs run under the
//! simulation's faults.

use std::time::Duration;

use firstseen_store::Properties;
use futures::future::BoxFuture;

/// What a message is on its way in.
#[derive(Debug, Clone)]
pub struct Message {
    pub topic: String,
    pub payload: Vec<u8>,
    pub qos: u8,
    pub retain: bool,
    /// Means something only on the connection that delivered it.
    pub pkid: u16,
    pub properties: Option<Box<Properties>>,
}

/// What the session reports.
#[derive(Debug)]
pub enum Event {
    /// A connection was made. Without `session_present` the broker has no
    /// subscriptions for this client, and ingest subscribes.
    Connected {
        session_present: bool,
    },
    /// Subscriptions the broker refused: (position, reason).
    Subscribed {
        refused: Vec<(usize, String)>,
    },
    Message(Message),
    /// Anything else (pings, acks of our own packets).
    Other,
}

/// Sending failed: the client's request queue is full or closed. What was
/// not sent is not lost: the broker redelivers an unacked message.
#[derive(Debug)]
pub struct QueueFull;

/// The sending half of an upstream session.
pub trait UpstreamClient: Send + Sync {
    /// Queues a PUBACK (QoS 1) or PUBREC (QoS 2) for packet `pkid` on the
    /// current connection, without waiting.
    fn try_ack(&self, pkid: u16, qos: u8) -> Result<(), QueueFull>;

    /// Queues one SUBSCRIBE for every (filter, qos).
    fn try_subscribe(&self, filters: &[(String, u8)]) -> Result<(), QueueFull>;

    /// Queues an UNSUBSCRIBE of every filter (a subscription removed by a
    /// reload).
    fn try_unsubscribe(&self, filters: &[String]) -> Result<(), QueueFull>;

    /// Queues a DISCONNECT; the persistent session stays on the broker.
    fn try_disconnect(&self);
}

/// Why an upstream connection failed, as ingest decides on it: what it
/// tells the operator, and (later) how it backs off. Details from the MQTT
/// client travel as text inside the variant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    /// The broker's host name does not resolve.
    #[error("cannot resolve the host {host}: {detail}")]
    Unresolved { host: String, detail: String },
    /// Nothing listens there (TCP refused).
    #[error("connection refused")]
    Refused,
    /// The broker answered CONNECT with a refusal (bad credentials, not
    /// authorised, a client id it rejects).
    #[error("the broker refused the connection: {code}")]
    RefusedByBroker { code: String },
    #[error("timed out")]
    Timeout,
    #[error("TLS: {detail}")]
    Tls { detail: String },
    /// Any other failure of an established or half-made connection.
    #[error("{detail}")]
    Lost { detail: String },
}

/// The reading half of an upstream session.
pub trait UpstreamSession: Send {
    /// The next event. Connects first when not connected. `Err` says why
    /// the connection failed; the caller then calls
    /// [`UpstreamSession::clean`] before polling again.
    fn poll(&mut self) -> BoxFuture<'_, Result<Event, SessionError>>;

    /// Forgets the failed connection and every ack still queued for it: a
    /// packet id means nothing on the next connection.
    fn clean(&mut self);

    /// Polls until the queued DISCONNECT is written, or `limit` passes.
    fn flush_disconnect(&mut self, limit: Duration) -> BoxFuture<'_, ()>;
}
