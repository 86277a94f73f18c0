//! The publisher's [`Outbox`] over the replicated state: topics and
//! watermarks from the state store, payloads read from the Raft log.

use firstseen_raft::LogId;
use firstseen_store::{OutboxMessage, StateStore, TopicState};
use openraft::metrics::RaftDataMetrics;
use tokio::sync::watch;

use crate::publish::port::Outbox;
use crate::Error;

/// The outbox in the replicated state, payloads read from the Raft log.
pub struct StateOutbox {
    pub state: StateStore,
    pub outbox: firstseen_raft::Outbox,
    /// openraft's data metrics: `last_applied` moves when apply has put
    /// new messages in the outbox.
    pub applied: watch::Receiver<RaftDataMetrics<firstseen_raft::TypeConfig>>,
    /// The `last_applied` that `grown` last returned on.
    pub seen: Option<LogId>,
}

impl Outbox for StateOutbox {
    fn topics(&self) -> Result<Vec<(String, TopicState)>, Error> {
        Ok(self.state.topics()?)
    }

    fn level(&self) -> u32 {
        self.state.level()
    }

    fn generation(&self) -> u64 {
        self.state.generation()
    }

    fn topic(&self, topic: &str) -> Result<TopicState, Error> {
        Ok(self.state.topic_state(topic)?)
    }

    fn read(
        &self,
        topic: &str,
        from: u64,
        limit: usize,
    ) -> Result<Vec<(u64, OutboxMessage)>, Error> {
        Ok(self.outbox.read(topic, from, limit)?)
    }

    fn applied_at(&self, topic: &str, seq: u64) -> Option<std::time::Instant> {
        self.state.applied_at(topic, seq)
    }

    async fn grown(&mut self) {
        loop {
            // The data metrics also change with replication progress; only
            // a new applied index can mean new messages.
            let now = self.applied.borrow_and_update().last_applied;
            if now != self.seen {
                self.seen = now;
                return;
            }
            crate::propose::metrics_changed(&mut self.applied).await;
        }
    }
}
