//! When recent entries were written to this node's log: the start of the
//! commit path's `to_send` leg (an entry appended on the leader until the
//! first append that carries it leaves for a follower), which the network
//! records (`firstseen_commit_leg_seconds`). Telemetry only: nothing
//! decides anything from it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::lock;

/// Appends remembered. At the HSL peak a leader appends a few hundred
/// entries a second, so this covers the last second or more; an entry older
/// than that is a follower catching up, which the leg is not about.
const KEPT: usize = 1024;

/// The last [`KEPT`] appends: `(first index, last index, when)`, oldest
/// first. Cheap to clone; every clone is the same record.
#[derive(Clone, Default)]
pub struct AppendClock(Arc<Mutex<VecDeque<(u64, u64, Instant)>>>);

impl AppendClock {
    /// Notes that entries `first..=last` were written now.
    pub fn wrote(&self, first: u64, last: u64) {
        let mut q = lock(&self.0);
        if q.len() == KEPT {
            q.pop_front();
        }
        q.push_back((first, last, Instant::now()));
    }

    /// When the entry at `index` was written, if that is still remembered.
    /// A rewrite of an index (a truncated tail written again) answers the
    /// latest write.
    pub fn written_at(&self, index: u64) -> Option<Instant> {
        let q = lock(&self.0);
        q.iter()
            .rev()
            .find(|(first, last, _)| (*first..=*last).contains(&index))
            .map(|(_, _, at)| *at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_the_latest_write_of_an_index_and_forgets_the_oldest() {
        let c = AppendClock::default();
        c.wrote(1, 3);
        let first = c.written_at(2).unwrap();
        c.wrote(3, 4);
        assert!(c.written_at(3).unwrap() >= first);
        assert_eq!(c.written_at(5), None);
        for i in 0..KEPT as u64 {
            c.wrote(10 + i, 10 + i);
        }
        assert_eq!(c.written_at(1), None, "the oldest append is forgotten");
        assert!(c.written_at(10).is_some());
    }
}
