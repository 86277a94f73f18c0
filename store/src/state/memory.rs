//! The state in memory: everything apply reads and changes, and what the
//! next checkpoint must write. Nothing here touches the disk.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::NO_HOLD;
use crate::index::{Index, NodeBits};
use crate::record::{Item, Run};
use crate::window;
use crate::{Coverage, NodeId, TopicState, Totals};

/// Everything small about the state, written whole at each checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Head {
    pub(super) totals: Totals,
    pub(super) coverage: BTreeMap<NodeId, Coverage>,
    pub(super) topics: BTreeMap<String, TopicState>,
    pub(super) bits: NodeBits,
    /// Window records below this id have expired.
    pub(super) expired_below: u64,
    pub(super) applied: Vec<u8>,
}

/// A window record applied but not yet written.
pub(super) struct PendingRecord {
    pub(super) rec: u64,
    pub(super) ts: u64,
    pub(super) items: Vec<Item>,
    /// Per item, as in a masks record: 0 for "the first node only".
    pub(super) masks: Vec<u64>,
}

/// The state in memory, and what the next checkpoint must write.
#[derive(Default)]
pub(super) struct Memory {
    pub(super) head: Head,
    /// The cluster level. Kept apart from the head (whose encoding every
    /// release before levels reads), and written only once it rose.
    pub(super) levels: crate::level::Levels,
    /// Window records below this id may hold identities made with a
    /// topic's spelling as written (before cluster level 3): until they
    /// have expired, a copy is also looked up under its topic's other
    /// spellings. Kept in the meta tree (`META_NAMES`) once set.
    pub(super) names_below: u64,
    /// Window records below this id may hold a sequence their message no
    /// longer has: a rebase or a merge of spellings renumbered the outbox
    /// after they were made (the window is not renumbered with it). A
    /// rebase drops the copies the window places on its topic only by
    /// records at or above it. Kept in the meta tree (`META_RENUMBERED`).
    pub(super) renumbered_below: u64,
    /// The cluster's generation ([`crate::Command::Generation`]): 0 until a
    /// recovery started one. Kept apart from the head, like the level, and
    /// written only once it is not 0.
    pub(super) generation: u64,
    /// Messages sent as markers, kept whole (`aside.rs`).
    pub(super) aside: super::aside::Aside,
    pub(super) index: Index,
    /// Records not yet written, oldest first; their ids are contiguous and
    /// follow the written ones.
    pub(super) pending: VecDeque<PendingRecord>,
    /// Mask changes to written records: record → item → mask.
    pub(super) masks: BTreeMap<u64, BTreeMap<u32, u64>>,
    /// Every run of the outbox. Few: one per topic per unpublished entry.
    pub(super) runs: BTreeMap<Vec<u8>, Run>,
    pub(super) runs_new: BTreeSet<Vec<u8>>,
    pub(super) runs_gone: BTreeSet<Vec<u8>>,
    pub(super) inline_gone: Vec<Vec<u8>>,
    /// Inline outbox records to write: (sled key, encoded message). Only
    /// the rise to level 3 makes any, when it moves a topic's messages to
    /// its canonical name.
    pub(super) inline_new: Vec<(Vec<u8>, Vec<u8>)>,
    /// First record id that may still be in sled.
    pub(super) written_from: u64,
    pub(super) dirty: bool,
    pub(super) entries_since: u64,
    pub(super) last_checkpoint: Option<Instant>,
    /// The hold as of the last checkpoint: what a recovered state needs.
    pub(super) durable_hold: u64,
}

impl Memory {
    pub(super) fn first_unwritten(&self) -> u64 {
        self.pending
            .front()
            .map_or(self.head.totals.records, |p| p.rec)
    }

    /// Lowest log index an unpublished message is read from.
    pub(super) fn hold(&self) -> u64 {
        self.head
            .topics
            .keys()
            .filter_map(|t| {
                let start = window::outbox_key(t, 0);
                let end = window::outbox_key(t, u64::MAX);
                self.runs
                    .range(start..=end)
                    .next()
                    .map(|(_, r)| r.log_index)
            })
            .min()
            .unwrap_or(NO_HOLD)
    }
}
