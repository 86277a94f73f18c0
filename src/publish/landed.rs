//! Which sequences between the watermark and the tail a topic lacks, from
//! the messages the tail read meets ([`super::tail`] does the reading):
//! pure, without I/O. What it finds goes late (`policy::Refusals`).

/// What the tail read gathers to tell which sequences between the
/// watermark and the tail the topic lacks.
///
/// Messages of ours that are not late are in the topic in the order of
/// their sequences (each producer resumes after the tail, and lands in the
/// order it sends), and a late message comes after a higher one that
/// landed before it. So every message of ours numbered above a non-late
/// one lies after it: once the read has passed a non-late message numbered
/// at most one past the watermark (or the topic's start), it has seen every
/// message of ours between the watermark and the tail that the topic holds.
///
/// Except that anyone can write a copy of a proven message again later (a
/// replay, [`super::proof`]), and a leader that resumed too early sent some
/// again: such a message lies after higher ones, and says nothing of where
/// the watermark lies. Counted, one old message copied to the end of the
/// topic during an election stopped the read before the dead leader's
/// messages, and all of them went again, late. So a message is a witness
/// ([`Landed::covered`]) only if no non-late message of ours read before it
/// is numbered higher, and another one read sets it in order: one before
/// it numbered lower, or one after it numbered higher. One message written
/// at the end, alone or after the cluster's, is never a witness: before a
/// window's first message nothing is read yet, and the cluster's messages
/// after it are only those written later. (Two proven messages copied in
/// order are: nothing in the topic tells them from the cluster's own.)
#[derive(Debug)]
pub(super) struct Landed {
    watermark: u64,
    /// Possible witnesses, one per window read (the best of it), and
    /// whether one is set in order. One that a window read later (lying
    /// before it) shows to come after a higher message is dropped.
    witnesses: Vec<(u64, bool)>,
    /// The highest non-late sequence in the windows read (lying after this
    /// one).
    read_high: Option<u64>,
    /// This window's: the lowest and highest non-late sequences read so far
    /// in it, and its possible witness.
    window_low: Option<u64>,
    window_high: Option<u64>,
    window_witness: Option<(u64, bool)>,
    /// Sequences above the watermark read, late or not, as runs
    /// `(first, last)`, in the order read until [`Landed::compact`].
    runs: Vec<(u64, u64)>,
    /// How many runs there were after the last compaction.
    compacted: usize,
}

impl Landed {
    pub(super) fn new(watermark: u64) -> Self {
        Self {
            watermark,
            witnesses: Vec::new(),
            read_high: None,
            window_low: None,
            window_high: None,
            window_witness: None,
            runs: Vec::new(),
            compacted: 0,
        }
    }

    /// Counts message `seq` of ours, read after the ones before it in its
    /// window (a window is read forward, windows back from the end).
    pub(super) fn add(&mut self, seq: u64, late: bool) {
        if !late {
            // A higher one after the window's witness sets it in order.
            if let Some((w, in_order)) = self.window_witness.as_mut() {
                *in_order |= seq > *w;
            }
            // Nothing higher before it in the window, and at most one past
            // the watermark: it may be a witness, the higher the better (a
            // window read later is less likely to hold one above it); one
            // above the window's witness has it before, lower.
            let after_higher = self.window_high.is_some_and(|h| h > seq);
            if !after_higher && seq <= self.watermark.saturating_add(1) {
                let lower_before = self.window_low.is_some_and(|l| l < seq);
                self.window_witness = match self.window_witness {
                    Some((w, in_order)) if w == seq => Some((w, in_order || lower_before)),
                    _ => Some((seq, lower_before)),
                };
            }
            self.window_low = Some(self.window_low.map_or(seq, |l| l.min(seq)));
            self.window_high = self.window_high.max(Some(seq));
        }
        if seq <= self.watermark {
            return;
        }
        match self.runs.last_mut() {
            Some((first, last)) if *first <= seq && seq <= *last => {}
            Some((_, last)) if last.checked_add(1) == Some(seq) => *last = seq,
            _ => self.runs.push((seq, seq)),
        }
        // Runs are one per message only where sequences do not follow each
        // other (late messages, replays); merging them now and then keeps
        // them to the distinct ones, whatever the topic repeats.
        if self.runs.len() >= (2 * self.compacted).max(4096) {
            self.compact();
        }
    }

    pub(super) fn compact(&mut self) {
        self.runs.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(self.runs.len());
        for &(a, b) in &self.runs {
            match merged.last_mut() {
                Some((_, last)) if a <= last.saturating_add(1) => *last = (*last).max(b),
                _ => merged.push((a, b)),
            }
        }
        self.runs = merged;
        self.compacted = self.runs.len();
    }

    /// Ends a window: everything in it lies before the windows read so
    /// far.
    pub(super) fn end_window(&mut self) {
        let (low, high) = (self.window_low.take(), self.window_high.take());
        if let (Some(low), Some(high)) = (low, high) {
            // A witness after a higher message is a replay or a resend; one
            // after a lower one is set in order.
            self.witnesses.retain(|&(seq, _)| seq >= high);
            for (seq, in_order) in &mut self.witnesses {
                *in_order |= low < *seq;
            }
        }
        if let Some((seq, in_order)) = self.window_witness.take() {
            let higher_after = self.read_high.is_some_and(|h| h > seq);
            self.witnesses.push((seq, in_order || higher_after));
        }
        self.read_high = self.read_high.max(high);
    }

    /// Whether what was read holds every message of ours numbered above
    /// the watermark: it passed a witness (see [`Landed`]), a non-late
    /// message numbered at most one past the watermark. Windows count once
    /// ended.
    pub(super) fn covered(&self) -> bool {
        self.witnesses.iter().any(|&(_, in_order)| in_order)
    }

    /// The sequences in (watermark, `tail`] not read, as ranges in order.
    pub(super) fn missing(mut self, tail: u64) -> Vec<(u64, u64)> {
        self.compact();
        let mut missing = Vec::new();
        let mut next = self.watermark.saturating_add(1);
        for (a, b) in self.runs {
            if a > tail {
                break;
            }
            if a > next {
                missing.push((next, a - 1));
            }
            next = next.max(b.saturating_add(1));
        }
        if next <= tail {
            missing.push((next, tail));
        }
        missing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sequences 5..=10 of ours, 7 refused while 8..=10 landed, with the
    /// watermark at 4: 7 is what the topic lacks, whoever remembers it.
    #[test]
    fn what_the_topic_lacks_between_the_watermark_and_the_tail_goes_late() {
        let mut l = Landed::new(4);
        // Read back from the end: the last window first.
        for s in [8, 9, 10] {
            l.add(s, false);
        }
        l.end_window();
        assert!(!l.covered(), "7 and below not read yet");
        for s in [3, 4, 5, 6] {
            l.add(s, false);
        }
        l.end_window();
        assert!(l.covered());
        assert_eq!(l.missing(10), vec![(7, 7)]);
    }

    /// A late message whose receipt was lost: the topic holds it (after
    /// higher sequences), so it does not go again. Before, the tail read
    /// skipped late messages, nothing showed it had landed, and the next
    /// producer sent it a second time.
    #[test]
    fn a_late_message_that_landed_is_not_missing() {
        let mut l = Landed::new(4);
        for (s, late) in [(7, true), (8, false), (9, false), (10, false)] {
            l.add(s, late);
        }
        l.end_window();
        for s in [4, 5, 6] {
            l.add(s, false);
        }
        l.end_window();
        assert!(l.covered());
        assert_eq!(l.missing(10), Vec::<(u64, u64)>::new());
        // Late messages alone do not cover anything below them.
        let mut only_late = Landed::new(0);
        only_late.add(1, true);
        only_late.end_window();
        assert!(!only_late.covered());
    }

    /// The review's replay (G2): the leader died with watermark 100 and
    /// tail 300; during the election an outsider copied proven message 1
    /// to the end of the topic. The first window (the last 64 entries)
    /// holds 238..=300 and the copy. Counted, the copy stopped the read
    /// there, and 101..=237, all in the topic, were reported missing and
    /// went again, late. It lies after higher messages: no witness.
    #[test]
    fn a_replayed_old_message_at_the_end_does_not_stop_the_read() {
        let mut l = Landed::new(100);
        for s in 238..=300 {
            l.add(s, false);
        }
        l.add(1, false);
        l.end_window();
        assert!(!l.covered(), "the copy of 1 says nothing of 101..=237");
        // The window before: the rest of the dead leader's messages, and
        // the watermark's.
        for s in 90..=237 {
            l.add(s, false);
        }
        l.end_window();
        assert!(l.covered());
        assert_eq!(l.missing(300), Vec::<(u64, u64)>::new());
    }

    /// Replays placed so that they are the first of ours in a window, or
    /// several of them in order, or a copy of the watermark's own message:
    /// none is a witness while the window read before it (lying before
    /// them) holds a higher message; and what they copy is in the topic,
    /// so it is not missing.
    #[test]
    fn replays_at_a_window_s_start_are_no_witness_until_what_lies_before() {
        // A copy of the watermark's message first in the last window
        // (foreign entries after it, not counted).
        let mut l = Landed::new(100);
        l.add(100, false);
        l.end_window();
        assert!(!l.covered(), "nothing of ours read before the copy");
        for s in 180..=300 {
            l.add(s, false);
        }
        l.end_window();
        assert!(!l.covered(), "300 lies before the copy of 100");
        for s in 95..=179 {
            l.add(s, false);
        }
        l.end_window();
        assert!(l.covered());
        assert_eq!(l.missing(300), Vec::<(u64, u64)>::new());

        // Several replays after the tail, in order, and a late message.
        let mut l = Landed::new(10);
        for (s, late) in [
            (12, false),
            (14, false),
            (13, true),
            (3, false),
            (4, false),
            (5, false),
        ] {
            l.add(s, late);
        }
        l.end_window();
        assert!(!l.covered(), "3, 4, 5 lie after 14");
        for s in [10, 11] {
            l.add(s, false);
        }
        l.end_window();
        assert!(l.covered());
        assert_eq!(l.missing(14), Vec::<(u64, u64)>::new());

        // A replay makes present only what it copies: 2 stays missing (the
        // first 1, with 3 after it, is a witness; its copy is none).
        let mut l = Landed::new(0);
        for s in [1, 3, 1] {
            l.add(s, false);
        }
        l.end_window();
        assert!(l.covered());
        assert_eq!(l.missing(3), vec![(2, 2)]);

        // Two copies of one message are not in order with each other.
        let mut l = Landed::new(100);
        for s in [50, 50] {
            l.add(s, false);
        }
        l.end_window();
        assert!(!l.covered());
    }

    /// The cluster's own messages need nothing read before them: the dead
    /// leader's 101..=300 after foreign entries (its predecessor, the
    /// watermark's message, far before them) end the read in one window.
    #[test]
    fn the_watermark_s_successor_with_higher_ones_after_it_is_a_witness() {
        let mut l = Landed::new(100);
        for s in 101..=300 {
            l.add(s, false);
        }
        l.end_window();
        assert!(l.covered());
        assert_eq!(l.missing(300), Vec::<(u64, u64)>::new());
        // Alone it may be a copy: the read goes on.
        let mut l = Landed::new(100);
        l.add(101, false);
        l.end_window();
        assert!(!l.covered());
    }

    /// Nothing reaches down to the watermark (the first message was
    /// refused, or retention took the start): the read goes to the topic's
    /// start, and what it did not find there goes late.
    #[test]
    fn below_the_first_message_read_everything_unseen_is_missing() {
        let mut l = Landed::new(0);
        for s in [2, 3, 6] {
            l.add(s, false);
        }
        l.end_window();
        assert!(!l.covered(), "1 may lie before");
        assert_eq!(l.missing(6), vec![(1, 1), (4, 5)]);
        // Above the tail is not the read's business: the producer resumes
        // there.
        let mut l = Landed::new(10);
        l.add(11, false);
        l.add(13, true);
        assert_eq!(l.missing(12), vec![(12, 12)]);
    }

    /// A topic that repeats messages of ours (replays) costs the read
    /// memory for the distinct ones only.
    #[test]
    fn repeats_are_kept_once() {
        let mut l = Landed::new(0);
        for _ in 0..10_000 {
            l.add(5, true);
            l.add(3, true);
        }
        assert!(l.runs.len() <= 4096, "{}", l.runs.len());
        l.add(1, false);
        l.end_window();
        assert_eq!(l.missing(5), vec![(2, 2), (4, 4)]);
    }
}
