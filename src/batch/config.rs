//! `[batch]`: how observations are grouped into Raft entries. Types,
//! defaults and the checks that need nothing but the values.

use serde::{Deserialize, Serialize};

use super::BatchPolicy;
use crate::problem::Problems;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BatchConfig {
    /// Most observations in one Raft entry.
    #[serde(default = "default_batch_messages")]
    pub max_messages: usize,
    /// Most payload bytes in one Raft entry.
    #[serde(default = "default_batch_bytes")]
    pub max_bytes: usize,
    /// Longest wait for a batch to fill once its first message arrived.
    #[serde(default = "default_linger_ms")]
    pub linger_ms: u64,
}

fn default_batch_messages() -> usize {
    1_000
}
/// 256 KiB: openraft gives a whole AppendEntries one heartbeat (100 ms),
/// and a follower that fell behind is sent `max_payload_entries` (4)
/// entries at a time. With 4 MiB entries (merged batches of a replayed
/// backlog) a debug build on two cores never answered within the budget:
/// the same append was resent forever and a two-node majority committed
/// nothing (found when a third node's disk failed mid-replay). A quarter
/// MiB keeps an append near 1 MiB; batches are bounded by
/// `batch.max_messages` first at the HSL feed's message sizes anyway.
fn default_batch_bytes() -> usize {
    256 * 1024
}
fn default_linger_ms() -> u64 {
    2
}
impl Default for BatchConfig {
    fn default() -> Self {
        Self {
            max_messages: default_batch_messages(),
            max_bytes: default_batch_bytes(),
            linger_ms: default_linger_ms(),
        }
    }
}

impl BatchConfig {
    /// Adds every problem of `[batch]` to `p`.
    pub fn check(&self, p: &mut Problems) {
        if self.max_messages == 0 {
            p.add("batch.max_messages", "must be at least 1");
        }
        if self.max_bytes == 0 {
            p.add("batch.max_bytes", "must be at least 1");
        }
    }
}

impl BatchConfig {
    /// When a batch is complete, as the batcher decides it.
    pub fn policy(&self) -> BatchPolicy {
        BatchPolicy {
            max_messages: self.max_messages,
            max_bytes: self.max_bytes,
            linger: std::time::Duration::from_millis(self.linger_ms),
        }
    }
}
