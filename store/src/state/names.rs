//! The rise to cluster level 3 ([`crate::level::NAMES`]): every topic the
//! state holds under a spelling other than its canonical name
//! ([`crate::topic::canonical`]) moves to that name, on every node alike,
//! at the `Command::Level` entry.
//!
//! - **One spelling** (a route always named `fs`): the topic is renamed.
//!   Its sequence, watermark and unpublished messages keep their numbers,
//!   which are the numbers its messages in Pulsar carry (a proof names the
//!   canonical topic whatever the spelling), so the publisher under the new
//!   name reads the topic's tail and carries on where the old one stopped.
//! - **Several spellings** (two routes, or two nodes, named one topic two
//!   ways before the rise): each had its own sequence, and both publishers
//!   wrote proofs for the same topic and overlapping numbers into Pulsar,
//!   so no number at or below the highest either assigned can tell what is
//!   in the topic. The merged topic's watermark becomes that highest
//!   number, and every unpublished message of every spelling (the
//!   canonical one's first, then the others' by name, each in its own
//!   order) is numbered after it. Nothing unpublished is skipped: the
//!   publisher resumes after the watermark, and no proof in Pulsar can
//!   carry a number above it. The price, in this case only: the topic's
//!   sequence jumps, and a message one of the old publishers had sent but
//!   not yet recorded as published goes again under its new number.
//!
//! The window records keep the identities they were made with (a blake3
//! of the spelling): they are looked up under every spelling until they
//! expire (`Memory::names_below`). A duplicate of a moved message reports
//! the sequence its first copy got when it was applied.

use std::collections::BTreeMap;

use super::apply::{InlineMessages, Written};
use super::memory::Memory;
use crate::record::Run;
use crate::topic::canonical;
use crate::window;
use crate::StoreError;
use crate::TopicState;

/// One spelling's unpublished messages, in sequence order: inline records
/// (from a snapshot) and the unpublished part of runs (in the log). Also
/// what a rebase renumbers (`rebase.rs`).
pub(super) enum Part {
    Inline(Vec<u8>),
    Run(Run),
}

impl Memory {
    /// Moves every topic held under a spelling other than its canonical
    /// name to that name. Reads the disk (inline messages) before changing
    /// anything, so an error leaves the state as it was.
    /// Whether any topic was held under another spelling: only then can
    /// window records hold identities of other spellings.
    pub(super) fn name_topics(&mut self, disk: &impl Written) -> Result<bool, StoreError> {
        // canonical name → the spellings held, canonical first if held.
        let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for t in self.head.topics.keys() {
            groups
                .entry(canonical(t).into_owned())
                .or_default()
                .push(t.clone());
        }
        groups.retain(|c, names| names.iter().any(|n| n != c));
        if groups.is_empty() {
            return Ok(false);
        }
        let mut inline: BTreeMap<String, InlineMessages> = BTreeMap::new();
        for (c, names) in groups.iter_mut() {
            if let Some(i) = names.iter().position(|n| n == c) {
                let own = names.remove(i);
                names.insert(0, own);
            }
            for n in names.iter() {
                let st = self.head.topics.get(n).copied().unwrap_or_default();
                inline.insert(
                    n.clone(),
                    disk.inline(n, st.published_seq + 1, st.last_seq)?,
                );
            }
        }
        // Nothing fails from here on.
        for (c, names) in groups {
            if let [only] = names.as_slice() {
                let st = self.head.topics.remove(only).unwrap_or_default();
                // The same numbers: those its messages in Pulsar carry.
                for (seq, part) in self.take_unpublished(only, st, inline.remove(only)) {
                    self.put(&c, seq, part);
                }
                self.head.topics.insert(c, st);
                continue;
            }
            let states: Vec<TopicState> = names
                .iter()
                .map(|n| self.head.topics.get(n).copied().unwrap_or_default())
                .collect();
            let top = states.iter().map(|s| s.last_seq).max().unwrap_or(0);
            let mut next = top + 1;
            for (n, st) in names.iter().zip(states) {
                self.head.topics.remove(n);
                for (_, part) in self.take_unpublished(n, st, inline.remove(n)) {
                    let count = match &part {
                        Part::Inline(_) => 1,
                        Part::Run(r) => r.messages.len() as u64,
                    };
                    self.put(&c, next, part);
                    next += count;
                }
            }
            // The window's sequences of these messages are their old ones.
            self.renumbered_below = self.head.totals.records;
            tracing::warn!(topic = %c, spellings = ?names, watermark = top, last = next - 1, "one topic was held under several spellings: merged at cluster level 3, its unpublished messages numbered after the highest sequence any spelling assigned");
            self.head.topics.insert(
                c,
                TopicState {
                    last_seq: next - 1,
                    published_seq: top,
                },
            );
        }
        // The moved inline records are read from the disk by the outbox:
        // written at once, by a checkpoint at the end of this entry.
        self.entries_since = u64::MAX / 2;
        Ok(true)
    }

    /// Takes `topic`'s unpublished messages out of the outbox, in sequence
    /// order with their sequences: its runs (the unpublished part of a run
    /// partly published) and its inline records (`inline`, read before).
    pub(super) fn take_unpublished(
        &mut self,
        topic: &str,
        st: TopicState,
        inline: Option<InlineMessages>,
    ) -> Vec<(u64, Part)> {
        let mut out: Vec<(u64, Part)> = Vec::new();
        for (k, raw) in inline.unwrap_or_default() {
            if let Some(seq) = window::outbox_seq(&k) {
                out.push((seq, Part::Inline(raw)));
            }
            self.inline_gone.push(k);
        }
        let range = window::outbox_key(topic, 0)..=window::outbox_key(topic, u64::MAX);
        let keys: Vec<Vec<u8>> = self.runs.range(range).map(|(k, _)| k.clone()).collect();
        for k in keys {
            let Some(mut run) = self.runs.remove(&k) else {
                continue;
            };
            if !self.runs_new.remove(&k) {
                self.runs_gone.insert(k.clone());
            }
            let first = window::outbox_seq(&k).unwrap_or_default();
            // Its published head is out of the outbox already (counted
            // off the totals when its receipt was applied).
            let skip = (st.published_seq + 1).saturating_sub(first) as usize;
            if skip >= run.messages.len() {
                continue;
            }
            run.messages.drain(..skip);
            out.push((first + skip as u64, Part::Run(run)));
        }
        out.sort_by_key(|(seq, _)| *seq);
        out
    }

    /// Puts `part` into the outbox of `topic` from sequence `seq` on.
    pub(super) fn put(&mut self, topic: &str, seq: u64, part: Part) {
        let key = window::outbox_key(topic, seq);
        match part {
            // The checkpoint deletes gone inline records before it writes
            // new ones: a key taken and put again is kept.
            Part::Inline(raw) => self.inline_new.push((key, raw)),
            // So are gone runs before new ones (a key taken and put again
            // stays in `runs_gone`: if it leaves again before the
            // checkpoint, its run on disk is still deleted).
            Part::Run(run) => {
                self.runs.insert(key.clone(), run);
                self.runs_new.insert(key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{obs, publish, store};
    use crate::StateStore;
    use crate::{Command, KeyKind, OutboxItem, Outcome, Response};

    const FULL: &str = "persistent://public/default/fs";

    fn level(s: &StateStore, level: u32, at: u64) {
        s.apply(Some(&Command::Level { level }), at, &at.to_be_bytes())
            .unwrap();
    }

    fn kinded(stamped_ms: u64, copies: Vec<crate::Observation>) -> Command {
        super::super::testing::kinded(stamped_ms, copies, KeyKind::TopicPayload)
    }

    /// (sequence, log index, position) of each outbox message of `topic`.
    fn outbox(s: &StateStore, topic: &str) -> Vec<(u64, u64, u32)> {
        s.outbox_from(topic, 0, 1_000)
            .unwrap()
            .into_iter()
            .map(|(seq, item)| match item {
                OutboxItem::InLog { log_index, pos, .. } => (seq, log_index, pos),
                OutboxItem::Inline(m) => (seq, 0, u32::from(m.key[0])),
            })
            .collect()
    }

    fn outcomes(s: &StateStore, cmd: &Command, at: u64) -> Vec<Outcome> {
        match s.apply(Some(cmd), at, &at.to_be_bytes()).unwrap() {
            Response::Observed(o) => o,
            other => panic!("{other:?}"),
        }
    }

    /// A state whose topics all had their full names already looks copies
    /// up under no other spelling after the rise: no window record can hold
    /// one, and the lookups would cost every copy for a whole window. One
    /// that had a short name does, until its records expire.
    #[test]
    fn other_spellings_are_looked_up_only_when_a_topic_had_one() {
        let s = store();
        level(&s, 2, 1);
        s.apply(Some(&kinded(1_000, vec![obs(1, 1, FULL)])), 2, b"2")
            .unwrap();
        level(&s, 3, 3);
        assert!(!s.lock().scope().names);
        let t = store();
        level(&t, 2, 1);
        t.apply(Some(&kinded(1_000, vec![obs(1, 1, "fs")])), 2, b"2")
            .unwrap();
        level(&t, 3, 3);
        assert!(t.lock().scope().names);
    }

    /// A topic always named `fs` is renamed at the rise with its numbers,
    /// its watermark and its unpublished messages as they were, and a
    /// message first seen under `fs` before the rise is a duplicate under
    /// the full name after it (and under `fs`, now the same topic).
    #[test]
    fn one_spelling_is_renamed_with_its_numbers() {
        let s = store();
        level(&s, 2, 1);
        s.apply(
            Some(&kinded(1_000, (1..=5).map(|k| obs(k, 1, "fs")).collect())),
            2,
            b"2",
        )
        .unwrap();
        publish(&s, "fs", 2, 3);
        let before = s.totals().unwrap();
        level(&s, 3, 4);
        assert_eq!(s.level(), 3);
        let topics = s.topics().unwrap();
        assert_eq!(topics.len(), 1, "{topics:?}");
        assert_eq!(topics[0].0, FULL);
        assert_eq!((topics[0].1.last_seq, topics[0].1.published_seq), (5, 2));
        assert_eq!(outbox(&s, FULL), vec![(3, 2, 2), (4, 2, 3), (5, 2, 4)]);
        assert!(outbox(&s, "fs").is_empty());
        let after = s.totals().unwrap();
        assert_eq!(
            (after.outbox_messages, after.outbox_bytes),
            (before.outbox_messages, before.outbox_bytes)
        );
        // Copies after the rise, in either spelling: duplicates, and a new
        // message follows the old sequence.
        let o = outcomes(
            &s,
            &kinded(
                2_000,
                vec![obs(1, 2, FULL), obs(5, 3, "fs"), obs(6, 2, "fs")],
            ),
            5,
        );
        assert!(matches!(o[0], Outcome::Duplicate { seq: 1, .. }), "{o:?}");
        assert!(matches!(o[1], Outcome::Duplicate { seq: 5, .. }), "{o:?}");
        assert_eq!(o[2], Outcome::FirstSeen { seq: 6 });
        assert_eq!(s.topic_state(FULL).unwrap().last_seq, 6);
        // A receipt of the old publisher, in flight across the rise, names
        // the same numbers.
        publish(&s, "fs", 4, 6);
        assert_eq!(s.topic_state(FULL).unwrap().published_seq, 4);
        assert_eq!(
            outbox(&s, FULL).iter().map(|m| m.0).collect::<Vec<_>>(),
            vec![5, 6]
        );
    }

    /// Both spellings hold messages (two routes or two nodes named the
    /// topic two ways before the rise): nothing unpublished is lost or
    /// doubled, and every one is numbered after the highest sequence
    /// either spelling assigned, which becomes the watermark.
    #[test]
    fn two_spellings_are_merged_after_the_highest_sequence() {
        let s = store();
        level(&s, 2, 1);
        // Full: 1..=4, published up to 3. Short: 1..=6, published up to 1,
        // partly in one run with its published head.
        s.apply(
            Some(&kinded(1_000, (1..=4).map(|k| obs(k, 1, FULL)).collect())),
            2,
            b"2",
        )
        .unwrap();
        s.apply(
            Some(&kinded(1_001, (11..=16).map(|k| obs(k, 1, "fs")).collect())),
            3,
            b"3",
        )
        .unwrap();
        publish(&s, FULL, 3, 4);
        publish(&s, "fs", 1, 5);
        let before = s.totals().unwrap();
        assert_eq!(before.outbox_messages, 1 + 5);
        level(&s, 3, 6);
        let topics = s.topics().unwrap();
        assert_eq!(topics.len(), 1, "{topics:?}");
        assert_eq!((topics[0].1.last_seq, topics[0].1.published_seq), (12, 6));
        // The full spelling's message 4 first, then the short one's 2..=6.
        assert_eq!(
            outbox(&s, FULL),
            vec![
                (7, 2, 3),
                (8, 3, 1),
                (9, 3, 2),
                (10, 3, 3),
                (11, 3, 4),
                (12, 3, 5)
            ]
        );
        let after = s.totals().unwrap();
        assert_eq!(
            (after.outbox_messages, after.outbox_bytes),
            (before.outbox_messages, before.outbox_bytes)
        );
        // Old receipts change nothing; a new message comes after.
        publish(&s, "fs", 6, 7);
        publish(&s, FULL, 4, 8);
        assert_eq!(s.topic_state(FULL).unwrap().published_seq, 6);
        let o = outcomes(
            &s,
            &kinded(2_000, vec![obs(12, 2, FULL), obs(20, 2, "fs")]),
            9,
        );
        assert!(matches!(o[0], Outcome::Duplicate { .. }), "{o:?}");
        assert_eq!(o[1], Outcome::FirstSeen { seq: 13 });
        publish(&s, FULL, 13, 10);
        let t = s.totals().unwrap();
        assert_eq!((t.outbox_messages, t.outbox_bytes), (0, 0));
        assert_eq!(s.log_hold(), super::super::NO_HOLD);
    }

    /// Messages that came with a snapshot (inline, not in the log) move
    /// too, and the move survives a restart.
    #[test]
    fn inline_messages_move_and_the_move_is_durable() {
        let source = store();
        level(&source, 2, 1);
        let log: Vec<Command> = vec![kinded(1_000, (1..=3).map(|k| obs(k, 1, "fs")).collect())];
        source.apply(Some(&log[0]), 2, b"2").unwrap();
        let mut stream = Vec::new();
        source
            .export(&mut stream, &mut |_| Ok(log[0].clone()))
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        {
            let db = super::super::testing::reopenable(dir.path());
            let s = StateStore::open(&db).unwrap();
            s.import(&mut stream.as_slice()).unwrap();
            level(&s, 3, 3);
            assert_eq!(
                outbox(&s, FULL),
                vec![(1, 0, 1), (2, 0, 2), (3, 0, 3)],
                "inline, with their keys"
            );
            s.flush().unwrap();
        }
        let db = super::super::testing::reopenable(dir.path());
        let s = StateStore::open(&db).unwrap();
        assert_eq!(s.level(), 3);
        assert_eq!(outbox(&s, FULL).len(), 3);
        assert!(outbox(&s, "fs").is_empty());
        // Still a duplicate under the full name after the restart.
        let o = outcomes(&s, &kinded(2_000, vec![obs(2, 2, FULL)]), 4);
        assert!(matches!(o[0], Outcome::Duplicate { seq: 2, .. }), "{o:?}");
        publish(&s, FULL, 3, 5);
        let t = s.totals().unwrap();
        assert_eq!((t.outbox_messages, t.outbox_bytes), (0, 0));
    }

    /// Below level 3 nothing of this happens: the spellings are two topics,
    /// as every release before it applies them.
    #[test]
    fn below_level_three_the_spelling_is_the_name() {
        let s = store();
        level(&s, 2, 1);
        s.apply(
            Some(&kinded(1_000, vec![obs(1, 1, "fs"), obs(1, 1, FULL)])),
            2,
            b"2",
        )
        .unwrap();
        assert_eq!(s.topics().unwrap().len(), 2);
    }
}
