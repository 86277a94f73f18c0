//! When each entry's messages were applied, kept in memory only: where the
//! `publish` stage of `firstseen_stage_seconds` starts on the leader. It is
//! a measurement, not state: nothing decides on it, it is not replicated,
//! and a restart starts it empty.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

/// Entries remembered per topic. At the HSL peak (about 400 entries a
/// second) this covers ten seconds, far more than a healthy publisher lags;
/// a message older than that (an outage's backlog) goes unmeasured rather
/// than make this grow with the outbox.
const KEEP: usize = 4096;

/// Per Pulsar topic: the last sequence of each applied entry, with when it
/// was applied, in sequence order.
#[derive(Default)]
pub(super) struct AppliedAt {
    topics: HashMap<String, VecDeque<(u64, Instant)>>,
}

impl AppliedAt {
    /// Entry up to `last_seq` of `topic` applied at `at`.
    pub(super) fn note(&mut self, topic: &str, last_seq: u64, at: Instant) {
        let entries = match self.topics.get_mut(topic) {
            Some(e) => e,
            None => self.topics.entry(topic.to_string()).or_default(),
        };
        match entries.back() {
            Some((last, _)) if *last == last_seq => return,
            // A snapshot installed or a state reloaded: what came before
            // does not describe these sequences.
            Some((last, _)) if *last > last_seq => entries.clear(),
            _ => {}
        }
        if entries.len() == KEEP {
            entries.pop_front();
        }
        entries.push_back((last_seq, at));
    }

    /// When the entry holding `seq` of `topic` was applied, if remembered.
    pub(super) fn find(&self, topic: &str, seq: u64) -> Option<Instant> {
        let entries = self.topics.get(topic)?;
        // Entries assign contiguous sequences, so the first one whose last
        // sequence reaches `seq` holds it, unless `seq` is older than every
        // remembered entry.
        let i = entries.partition_point(|(last, _)| *last < seq);
        let (_, at) = entries.get(i)?;
        let older = i == 0 && entries.len() == KEEP;
        (!older).then_some(*at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_sequence_maps_to_the_entry_that_assigned_it() {
        let t0 = Instant::now();
        let t = |ms| t0 + Duration::from_millis(ms);
        let mut a = AppliedAt::default();
        a.note("x", 3, t(1));
        a.note("x", 3, t(9)); // no new message for x: kept as it was
        a.note("x", 7, t(2));
        a.note("y", 1, t(5));
        assert_eq!(a.find("x", 1), Some(t(1)));
        assert_eq!(a.find("x", 3), Some(t(1)));
        assert_eq!(a.find("x", 4), Some(t(2)));
        assert_eq!(a.find("x", 7), Some(t(2)));
        assert_eq!(a.find("x", 8), None, "not applied yet");
        assert_eq!(a.find("y", 1), Some(t(5)));
        assert_eq!(a.find("z", 1), None);
        a.note("x", 2, t(6)); // a snapshot took the topic back
        assert_eq!(a.find("x", 4), None);
        assert_eq!(a.find("x", 1), Some(t(6)));
    }

    #[test]
    fn it_forgets_the_oldest_entries_and_says_so() {
        let t0 = Instant::now();
        let mut a = AppliedAt::default();
        for i in 1..=(KEEP as u64 + 10) {
            a.note("x", i * 2, t0);
        }
        assert_eq!(a.find("x", 1), None, "older than what is kept");
        assert_eq!(
            a.find("x", 21),
            None,
            "the oldest kept entry may hold older sequences"
        );
        assert_eq!(a.find("x", 23), Some(t0));
        assert_eq!(a.topics["x"].len(), KEEP);
    }
}
