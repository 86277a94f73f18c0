//! The outbox as the publisher reads it: messages with their payloads.
//!
//! The state machine stores where each unpublished first copy is (log entry
//! and position), not the copy itself, so a payload is written to disk once,
//! in the log, and the state stays small (docs/benchmarks.md). The log store
//! keeps every entry from the state's hold on, so a reference resolves until
//! its message is published.

use firstseen_store::{Command, OutboxItem, OutboxMessage, StateStore, StoreError};

use crate::LogStore;

/// Reads outbox messages, resolving references into the Raft log.
#[derive(Clone)]
pub struct Outbox {
    state: StateStore,
    log: LogStore,
}

impl Outbox {
    pub fn new(state: StateStore, log: LogStore) -> Self {
        Self { state, log }
    }

    /// The Raft log it reads from.
    pub fn log(&self) -> &LogStore {
        &self.log
    }

    /// Up to `limit` unpublished messages of `topic` from sequence `from`, in
    /// order, each log entry read and decoded once.
    pub fn read(
        &self,
        topic: &str,
        from: u64,
        limit: usize,
    ) -> Result<Vec<(u64, OutboxMessage)>, StoreError> {
        let items = self.state.outbox_from(topic, from, limit)?;
        let mut entry: Option<(u64, Command)> = None;
        let mut out = Vec::with_capacity(items.len());
        for (seq, item) in items {
            let message = match item {
                OutboxItem::Inline(m) => m,
                OutboxItem::InLog {
                    log_index,
                    pos,
                    first_seen_ms,
                } => {
                    if entry.as_ref().is_none_or(|(i, _)| *i != log_index) {
                        entry = Some((log_index, self.log.command(log_index)?));
                    }
                    let cmd = &mut entry.as_mut().expect("loaded above").1;
                    let properties = cmd.properties(pos as usize).cloned().map(Box::new);
                    let Some(observations) = cmd.observations_mut() else {
                        return Err(StoreError::Log(format!(
                            "entry {log_index} holds no observations"
                        )));
                    };
                    let obs = observations.get_mut(pos as usize).ok_or_else(|| {
                        StoreError::Log(format!("entry {log_index} has no observation {pos}"))
                    })?;
                    // Each position is read once per entry: take, not clone.
                    OutboxMessage {
                        key: obs.key,
                        mqtt_topic: std::mem::take(&mut obs.mqtt_topic),
                        payload: std::mem::take(&mut obs.payload),
                        node: obs.node,
                        first_seen_ms,
                        properties,
                    }
                }
            };
            out.push((seq, message));
        }
        Ok(out)
    }
}
