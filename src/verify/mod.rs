//! `firstseen verify`: read a topic back and audit it.
//!
//! [`Audit`] is the pure part: fed messages in topic order, it reports
//! duplicate keys and gaps, repeats or reordering in `firstseen-seq`. The
//! reader in [`read`] feeds it from Pulsar.

pub mod compare;
pub mod read;

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

/// Where a message comes from, as the audit tells: by the cluster's proof
/// (`crate::publish::proof`), or by producer name when asked to
/// (`--trust-names`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Source {
    /// The cluster's: audited.
    #[default]
    Ours,
    /// Someone else's: counted apart, not audited.
    Foreign,
    /// Made to look like the cluster's (its properties, with a proof that
    /// does not hold): counted apart, not audited, listed.
    Forged,
    /// Without a proof, from a producer named like the cluster's: written
    /// by a release from before proofs, or by anyone. Counted apart.
    Unproven,
}

/// One message as the audit sees it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub key: Option<String>,
    pub seq: Option<u64>,
    /// Whose it is: only the cluster's messages are audited.
    pub source: Source,
    /// A marker in place of a message the broker would refuse: it holds
    /// the message's key and sequence, so it is audited like one. The
    /// reason it gives.
    pub set_aside: Option<String>,
    /// Sent after higher sequences because the broker refused it while they
    /// were on their way (`firstseen-late`).
    pub late: bool,
    /// What reading the message's contents back found, when checked.
    pub contents: Contents,
}

/// Whether a message's contents agree with its labels.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Contents {
    /// Not checked: no key rule to check by, or a marker (no contents).
    #[default]
    Unchecked,
    /// Its key, recomputed from the MQTT topic and payload it holds (raw or
    /// in the transitdata envelope), is its `firstseen-key`.
    Agree,
    /// The recomputed key is another.
    KeyDiffers,
    /// It says it is an envelope and does not decode as one.
    Undecodable,
}

/// What the audit found. Lists are capped so a badly broken topic still
/// gives a readable report; the counts are exact.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Report {
    pub topic: String,
    pub messages: u64,
    pub distinct_keys: u64,
    pub first_seq: Option<u64>,
    pub last_seq: Option<u64>,
    /// Messages whose key was already seen.
    pub duplicate_messages: u64,
    pub duplicate_keys: Vec<String>,
    /// Sequence numbers missing between the first and the last.
    pub missing_seqs: u64,
    /// Messages that came after higher sequences but filled a gap: the
    /// broker refused them while later ones were on their way, and the
    /// publisher sent them again after those. Nothing is missing or doubled;
    /// a consumer that needs strict order sees them late.
    pub late: u64,
    pub gaps: Vec<(u64, u64)>,
    /// Messages whose sequence was not above the previous one.
    pub out_of_order: u64,
    pub repeats: Vec<u64>,
    /// Messages without `firstseen-seq` or `firstseen-key`.
    pub unlabelled: u64,
    /// Messages that are not the cluster's: another writer on the topic.
    /// Not audited, and not a fault of the bridge's, but an operator wants
    /// to know.
    pub foreign: u64,
    /// Of those, messages made to look like the cluster's: its properties
    /// with a proof that does not hold (someone writing a look-alike of the
    /// cluster's messages: worth finding out who).
    pub forged: u64,
    /// Sequence numbers the first few forged messages claimed.
    pub forged_seqs: Vec<u64>,
    /// Messages without a proof from a producer named like the cluster's:
    /// a release from before proofs wrote them, or anyone did. Not audited
    /// (`--trust-names` audits them).
    pub unproven: u64,
    /// Whether the cluster's messages were told by producer name only
    /// (`--trust-names`), not by proof.
    pub by_name: bool,
    /// The markers, first few: (sequence, key, reason). Each message they
    /// stand for is kept by the cluster (`docs/operations.md`, "Messages
    /// set aside").
    pub markers: Vec<(u64, String, String)>,
    /// Markers in place of messages the broker would refuse
    /// (`firstseen-set-aside`); their messages are in a node's dead-letter
    /// store. Counted in the audit as the messages they stand for.
    pub set_aside: u64,
    /// Messages whose contents were read back and keyed again (with
    /// `--config`, by each one's route; with `--key`, by that rule).
    pub contents_checked: u64,
    /// Of those, messages whose key is not that of their contents.
    pub key_mismatches: u64,
    /// Messages labelled as a transitdata envelope that do not decode as one.
    pub undecodable: u64,
    /// Sequence numbers of the first few of either.
    pub bad_contents: Vec<u64>,
}

impl Report {
    /// The cluster's messages the audit read.
    pub fn audited(&self) -> u64 {
        self.messages - self.foreign - self.unproven
    }

    /// Whether the topic holds exactly one copy per key, numbered without
    /// gaps, and at least one message of the cluster's: a topic with none
    /// (a wrong topic, another cluster's secret) proves nothing.
    pub fn is_clean(&self) -> bool {
        self.audited() > 0 && self.is_whole()
    }

    /// Whether what the cluster wrote is whole, however much there is.
    pub fn is_whole(&self) -> bool {
        self.duplicate_messages == 0
            && self.missing_seqs == 0
            && self.out_of_order == 0
            && self.unlabelled == 0
            && self.key_mismatches == 0
            && self.undecodable == 0
    }
}

const LIST_CAP: usize = 50;

/// What a message's key is checked against.
#[derive(Debug, Clone)]
pub enum KeyRule {
    /// Each message's route, found by its MQTT topic, as ingest finds it.
    Routes(std::sync::Arc<Vec<crate::ingest::route::Route>>),
    /// One rule for every message.
    One(crate::key::KeySpec),
}

/// Reads a message's contents back (raw, or the transitdata envelope its
/// properties name) and keys it again under `rule`, for [`Seen::contents`].
pub fn check_contents(
    rule: &KeyRule,
    property: impl Fn(&str) -> Option<String>,
    body: &[u8],
    key_hex: &str,
) -> Contents {
    let Ok(c) = crate::publish::format::contents(property, body) else {
        return Contents::Undecodable;
    };
    let topic = c.topic.unwrap_or_default();
    let spec = match rule {
        KeyRule::One(spec) => spec,
        KeyRule::Routes(routes) => match crate::ingest::route::route_for(routes, &topic) {
            Some(route) => &route.key,
            // No route takes it now: the config changed since.
            None => return Contents::Unchecked,
        },
    };
    match crate::key::published_key(spec, &topic, &c.payload) {
        Some(k) if hex::encode(k) == key_hex => Contents::Agree,
        _ => Contents::KeyDiffers,
    }
}

/// Takes `seq` out of the open gap that holds it, if one does.
fn fill(gaps: &mut BTreeMap<u64, u64>, seq: u64) -> bool {
    let Some((&start, &end)) = gaps.range(..=seq).next_back() else {
        return false;
    };
    if seq > end {
        return false;
    }
    gaps.remove(&start);
    if start < seq {
        gaps.insert(start, seq - 1);
    }
    if seq < end {
        gaps.insert(seq + 1, end);
    }
    true
}

/// Streaming audit of one topic.
#[derive(Debug, Default)]
pub struct Audit {
    report: Report,
    keys: HashMap<String, u32>,
    prev_seq: Option<u64>,
    /// Every gap still open, first sequence to last: a late message that
    /// falls in one fills it.
    open_gaps: BTreeMap<u64, u64>,
    /// The first sequence read in order. What lies below it is not missing
    /// (retention may have removed it), but late messages may fill it: the
    /// messages of a refused first entry go after the ones that landed.
    start: Option<u64>,
}

impl Audit {
    pub fn new(topic: &str) -> Self {
        Self {
            report: Report {
                topic: topic.to_string(),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// Feeds the next message in topic order.
    pub fn push(&mut self, m: Seen) {
        let r = &mut self.report;
        r.messages += 1;
        match m.source {
            Source::Ours => {}
            Source::Foreign => {
                r.foreign += 1;
                return;
            }
            Source::Forged => {
                r.foreign += 1;
                r.forged += 1;
                if let Some(seq) = m.seq.filter(|_| r.forged_seqs.len() < LIST_CAP) {
                    r.forged_seqs.push(seq);
                }
                return;
            }
            Source::Unproven => {
                r.unproven += 1;
                return;
            }
        }
        let (Some(key), Some(seq)) = (m.key, m.seq) else {
            r.unlabelled += 1;
            return;
        };
        if let Some(reason) = m.set_aside {
            r.set_aside += 1;
            if r.markers.len() < LIST_CAP {
                r.markers.push((seq, key.clone(), reason));
            }
        }
        let bad = match m.contents {
            Contents::Unchecked => false,
            Contents::Agree => {
                r.contents_checked += 1;
                false
            }
            Contents::KeyDiffers => {
                r.contents_checked += 1;
                r.key_mismatches += 1;
                true
            }
            Contents::Undecodable => {
                r.undecodable += 1;
                true
            }
        };
        if bad && r.bad_contents.len() < LIST_CAP {
            r.bad_contents.push(seq);
        }
        let count = self.keys.entry(key.clone()).or_insert(0);
        *count += 1;
        if *count == 2 && r.duplicate_keys.len() < LIST_CAP {
            r.duplicate_keys.push(key);
        }
        if *count > 1 {
            r.duplicate_messages += 1;
        }
        r.first_seq.get_or_insert(seq);
        match self.prev_seq {
            Some(prev) if seq <= prev => {
                let below_start = self.start.is_some_and(|s| seq < s);
                if m.late && *count == 1 && fill(&mut self.open_gaps, seq) {
                    if below_start {
                        r.first_seq = r.first_seq.map(|f| f.min(seq));
                    } else {
                        r.missing_seqs -= 1;
                    }
                    r.late += 1;
                } else {
                    r.out_of_order += 1;
                    if r.repeats.len() < LIST_CAP {
                        r.repeats.push(seq);
                    }
                }
            }
            Some(prev) => {
                if seq > prev + 1 {
                    r.missing_seqs += seq - prev - 1;
                    self.open_gaps.insert(prev + 1, seq - 1);
                }
                self.prev_seq = Some(seq);
            }
            None => {
                self.prev_seq = Some(seq);
                self.start = Some(seq);
                if seq > 1 {
                    self.open_gaps.insert(1, seq - 1);
                }
            }
        }
        r.last_seq = self.prev_seq;
    }

    pub fn finish(mut self) -> Report {
        self.report.distinct_keys = self.keys.len() as u64;
        let start = self.start.unwrap_or(0);
        self.report.gaps = self
            .open_gaps
            .iter()
            .filter(|(a, _)| **a >= start)
            .take(LIST_CAP)
            .map(|(a, b)| (*a, *b))
            .collect();
        self.report
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "topic           {}", self.topic)?;
        writeln!(f, "messages        {}", self.messages)?;
        writeln!(f, "distinct keys   {}", self.distinct_keys)?;
        let range = match (self.first_seq, self.last_seq) {
            (Some(a), Some(b)) => format!("{a}..={b}"),
            _ => "-".into(),
        };
        writeln!(f, "firstseen-seq   {range}")?;
        writeln!(
            f,
            "duplicates      {} messages over {} keys",
            self.duplicate_messages,
            self.duplicate_keys.len()
        )?;
        writeln!(
            f,
            "gaps            {} missing in {} gaps",
            self.missing_seqs,
            self.gaps.len()
        )?;
        writeln!(f, "out of order    {}", self.out_of_order)?;
        if self.late > 0 {
            writeln!(
                f,
                "late            {} (refused by the broker after later messages, sent again after them; each filled its gap)",
                self.late
            )?;
        }
        writeln!(f, "unlabelled      {}", self.unlabelled)?;
        if self.contents_checked > 0 || self.undecodable > 0 {
            writeln!(
                f,
                "contents        {} keyed again from topic and payload, {} with another key, {} undecodable envelopes",
                self.contents_checked, self.key_mismatches, self.undecodable
            )?;
        }
        if self.foreign > 0 {
            writeln!(
                f,
                "foreign         {} (not the cluster's; not audited)",
                self.foreign
            )?;
        }
        if self.forged > 0 {
            writeln!(
                f,
                "forged          {} of those carry firstseen's properties with a proof that does not hold: someone writes look-alikes of the cluster's messages (claimed seqs {:?})",
                self.forged, self.forged_seqs
            )?;
        }
        if self.unproven > 0 {
            writeln!(
                f,
                "unproven        {} (no proof, from producers named like the cluster's: a release before proofs, or anyone; not audited, --trust-names audits them)",
                self.unproven
            )?;
        }
        if self.set_aside > 0 {
            writeln!(
                f,
                "set aside       {} (markers for messages the broker would refuse; the cluster keeps each message, see docs/operations.md)",
                self.set_aside
            )?;
        }
        for (seq, key, reason) in &self.markers {
            writeln!(f, "  marker seq {seq} key {key}: {reason}")?;
        }
        for k in &self.duplicate_keys {
            writeln!(f, "  duplicate key {k}")?;
        }
        for (a, b) in &self.gaps {
            writeln!(f, "  gap {a}..={b}")?;
        }
        for s in &self.repeats {
            writeln!(f, "  seq {s} not above its predecessor")?;
        }
        for s in &self.bad_contents {
            writeln!(f, "  seq {s}: contents do not match its key")?;
        }
        let how = if self.by_name {
            " (told by producer name only: not proven)"
        } else {
            ""
        };
        let verdict = if self.audited() == 0 {
            "NOTHING OF THE CLUSTER'S TO AUDIT"
        } else if self.is_whole() {
            "OK"
        } else {
            "PROBLEMS FOUND"
        };
        write!(f, "verdict         {verdict}{how}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(key: &str, seq: u64) -> Seen {
        Seen {
            key: Some(key.into()),
            seq: Some(seq),
            source: Source::Ours,
            set_aside: None,
            late: false,
            contents: Contents::Unchecked,
        }
    }

    #[test]
    fn a_clean_topic_is_clean() {
        let mut a = Audit::new("t");
        for (i, k) in ["a", "b", "c"].iter().enumerate() {
            a.push(seen(k, i as u64 + 1));
        }
        let r = a.finish();
        assert!(r.is_clean(), "{r}");
        assert_eq!(
            (r.messages, r.distinct_keys, r.first_seq, r.last_seq),
            (3, 3, Some(1), Some(3))
        );
    }

    #[test]
    fn duplicates_gaps_and_reordering_are_reported() {
        let mut a = Audit::new("t");
        a.push(seen("a", 1));
        a.push(seen("b", 2));
        a.push(seen("a", 5));
        a.push(seen("c", 4));
        a.push(Seen {
            key: None,
            seq: Some(6),
            source: Source::Ours,
            set_aside: None,
            late: false,
            contents: Contents::Unchecked,
        });
        let r = a.finish();
        assert!(!r.is_clean());
        assert_eq!(r.duplicate_messages, 1);
        assert_eq!(r.duplicate_keys, vec!["a".to_string()]);
        assert_eq!(r.gaps, vec![(3, 4)]);
        assert_eq!(r.missing_seqs, 2);
        assert_eq!(r.out_of_order, 1);
        assert_eq!(r.unlabelled, 1);
    }

    /// A message the broker refused while later ones landed, sent again
    /// after them and marked late: it fills its gap, and the topic is whole.
    /// The same order without the mark is a reordering.
    #[test]
    fn a_late_message_fills_its_gap_and_only_when_marked() {
        let run = |late: bool| {
            let mut a = Audit::new("t");
            for (k, s) in [("a", 1), ("c", 3), ("d", 4)] {
                a.push(seen(k, s));
            }
            a.push(Seen {
                late,
                ..seen("b", 2)
            });
            a.push(seen("e", 5));
            a.finish()
        };
        let r = run(true);
        assert!(r.is_clean(), "{r}");
        assert_eq!((r.late, r.missing_seqs, r.out_of_order), (1, 0, 0));
        assert!(r.gaps.is_empty());
        assert!(r.to_string().contains("late            1"), "{r}");
        let r = run(false);
        assert!(!r.is_clean());
        assert_eq!((r.late, r.missing_seqs, r.out_of_order), (0, 1, 1));
    }

    /// The broker refused the first entry and the ones after it landed: the
    /// topic starts at a later sequence and the refused ones come late,
    /// below it. They fill what lay before the start, which was never
    /// missing (retention may remove a topic's start). Before, each counted
    /// as out of order.
    #[test]
    fn late_messages_may_fill_what_lies_before_the_start() {
        let mut a = Audit::new("t");
        for (k, s) in [("c", 3), ("d", 4)] {
            a.push(seen(k, s));
        }
        for (k, s) in [("a", 1), ("b", 2)] {
            a.push(Seen {
                late: true,
                ..seen(k, s)
            });
        }
        let r = a.finish();
        assert!(r.is_clean(), "{r}");
        assert_eq!((r.late, r.missing_seqs, r.out_of_order), (2, 0, 0));
        assert_eq!(r.first_seq, Some(1));
        // A topic whose start retention removed: nothing missing either.
        let mut a = Audit::new("t");
        a.push(seen("c", 3));
        let r = a.finish();
        assert!(r.is_clean(), "{r}");
        assert!(r.gaps.is_empty());
    }

    /// Another producer's messages in the topic, numbered to look like
    /// ours: counted as foreign, and the audit of ours stays clean.
    #[test]
    fn foreign_messages_are_counted_apart() {
        let mut a = Audit::new("t");
        a.push(seen("a", 1));
        a.push(Seen {
            key: Some("a".into()),
            seq: Some(1_001),
            source: Source::Foreign,
            set_aside: None,
            late: false,
            contents: Contents::Unchecked,
        });
        a.push(seen("b", 2));
        let r = a.finish();
        assert!(r.is_clean(), "{r}");
        assert_eq!((r.messages, r.foreign, r.distinct_keys), (3, 1, 2));
        assert!(r.to_string().contains("foreign         1"), "{r}");
    }

    /// Contents that are not what the key says: keyed again from the raw
    /// payload or the envelope, a tampered payload and an envelope that
    /// does not decode are both found, and a clean message agrees.
    #[test]
    fn contents_are_keyed_again_raw_or_in_the_envelope() {
        use crate::key::{byte_key, ByteKey};
        use crate::publish::format::Format;
        let rule = KeyRule::One(crate::key::KeySpec::TOPIC_PAYLOAD);
        let key = hex::encode(byte_key(ByteKey::TopicPayload, "a/b", b"hello"));
        let raw = |name: &str| (name == "mqtt-topic").then(|| "a/b".to_string());
        assert_eq!(check_contents(&rule, raw, b"hello", &key), Contents::Agree);
        assert_eq!(
            check_contents(&rule, raw, b"hellO", &key),
            Contents::KeyDiffers
        );
        let (body, props) = Format::Transitdata.encode("a/b", b"hello".to_vec(), 5);
        let envelope = |name: &str| {
            props
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(
            check_contents(&rule, envelope, &body, &key),
            Contents::Agree
        );
        assert_eq!(
            check_contents(&rule, envelope, &body[..body.len() / 2], &key),
            Contents::Undecodable
        );
        let mut a = Audit::new("t");
        a.push(seen("x", 1));
        a.push(Seen {
            contents: Contents::KeyDiffers,
            ..seen("y", 2)
        });
        a.push(Seen {
            contents: Contents::Undecodable,
            ..seen("z", 3)
        });
        let r = a.finish();
        assert!(!r.is_clean(), "{r}");
        assert_eq!(
            (
                r.contents_checked,
                r.key_mismatches,
                r.undecodable,
                r.bad_contents.clone()
            ),
            (1, 1, 1, vec![2, 3])
        );
    }
}
