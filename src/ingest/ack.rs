//! Upstream acknowledgements, released only after commit (G4).
//!
//! The batcher calls [`AckGate::ack`] once the Raft entry holding a batch is
//! committed. Acks go out in receive order because batches are proposed and
//! acked one after another.
//!
//! A packet id means something only on the connection that delivered it:
//! after a reconnect the broker redelivers unacked messages and may reuse an
//! id for another message once the old one is acked. So every ack token
//! carries the connection epoch it was received in, and the gate drops tokens
//! of an older epoch. The ingest task bumps the epoch and purges the client's
//! queued acks under the same lock (see [`AckGate::next_epoch`]), so no stale
//! ack can slip onto a new connection between the check and the send.

use std::sync::{Arc, Mutex};

use super::port::{UpstreamClient, UpstreamSession};

/// What the batcher needs to ack one upstream message later.
#[derive(Debug, Clone, Copy)]
pub struct AckToken {
    /// Index of the upstream in the config.
    pub upstream: usize,
    /// Connection epoch the message arrived in.
    pub epoch: u64,
    pub pkid: u16,
    /// 1 (PUBACK) or 2 (PUBREC).
    pub qos: u8,
}

/// What happened to a batch of acks.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct AckStats {
    pub sent: u64,
    /// From an earlier connection: the broker redelivers these.
    pub stale: u64,
    /// The client's request queue was full; the broker redelivers these too.
    pub dropped: u64,
}

struct GateState {
    epoch: u64,
    client: Option<Arc<dyn UpstreamClient>>,
}

/// The ack path of one upstream connection.
pub struct AckGate {
    state: Mutex<GateState>,
}

impl Default for AckGate {
    fn default() -> Self {
        Self::new()
    }
}

impl AckGate {
    pub fn new() -> Self {
        Self {
            state: Mutex::new(GateState {
                epoch: 0,
                client: None,
            }),
        }
    }

    /// Sets the client acks are sent through.
    pub fn attach(&self, client: Arc<dyn UpstreamClient>) {
        firstseen_store::lock::lock(&self.state).client = Some(client);
    }

    /// The current connection epoch, stamped on each received message.
    pub fn epoch(&self) -> u64 {
        firstseen_store::lock::lock(&self.state).epoch
    }

    /// Called by the ingest task after its connection failed: from now on
    /// older tokens are stale, and acks already queued for the failed
    /// connection are purged (rumqttc's `EventLoop::clean` drops queued
    /// PUBACKs). Both under the lock that [`AckGate::ack`] holds while
    /// checking and queueing.
    pub fn next_epoch(&self, session: &mut dyn UpstreamSession) {
        let mut s = firstseen_store::lock::lock(&self.state);
        s.epoch += 1;
        session.clean();
    }

    /// Acks `tokens` (all of this upstream) in order.
    pub fn ack<'a>(&self, tokens: impl IntoIterator<Item = &'a AckToken>) -> AckStats {
        let s = firstseen_store::lock::lock(&self.state);
        let mut stats = AckStats::default();
        let Some(client) = &s.client else {
            return stats;
        };
        for t in tokens {
            if t.epoch != s.epoch {
                stats.stale += 1;
                continue;
            }
            match client.try_ack(t.pkid, t.qos) {
                Ok(()) => stats.sent += 1,
                Err(_) => stats.dropped += 1,
            }
        }
        stats
    }
}
