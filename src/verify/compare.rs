//! `firstseen compare`: two topics fed by the same upstream, side by side.
//!
//! The shadow run an operator makes before switching: the old pipeline's
//! deduplicated topic and firstseen's, over the same time range. Each
//! message is keyed from its MQTT topic and payload (raw, or inside the
//! transitdata envelope), the way both pipelines decide that two copies are
//! one message, and the report says per side what it holds, what it lacks
//! that the other has, and what it holds twice.
//!
//! **The window.** The two pipelines stamp a message with different times
//! (each its own receive time; a gateway that falls behind stamps seconds
//! late). So a key belongs to the window by its earliest copy on either
//! side, and both sides are then counted over that one set of keys: every
//! copy of each, wherever its own stamp fell. A key is missing from a side
//! only when that side has no copy of it at all in what was read (the
//! window and a margin around it). Without a window given, it is the
//! stretch both topics cover, less the margin at each end.
//!
//! [`Comparison`] is the pure part, fed message by message;
//! [`super::read::read_topic`] feeds it from Pulsar.

use std::collections::HashMap;

use serde::Serialize;

use crate::key::KeySpec;
use firstseen_store::Key;

/// One message as the comparison sees it.
#[derive(Debug, Clone)]
pub struct Message {
    /// Event time, or publish time when the producer set none, in ms.
    pub time_ms: i64,
    /// The MQTT topic and payload, or `None` when the contents could not be
    /// read (an envelope that does not decode).
    pub contents: Option<(String, Vec<u8>)>,
}

/// The range compared, in ms since the epoch, both ends included.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Window {
    pub from_ms: i64,
    pub to_ms: i64,
}

impl Window {
    fn holds(&self, t: i64) -> bool {
        self.from_ms <= t && t <= self.to_ms
    }
}

/// A key's copies on one side: the first copy's time and topic, and the
/// times of any others (rare, so they alone allocate).
#[derive(Debug)]
struct Copies {
    first_ms: i64,
    topic: u32,
    more: Vec<i64>,
}

impl Copies {
    fn times(&self) -> impl Iterator<Item = i64> + '_ {
        std::iter::once(self.first_ms).chain(self.more.iter().copied())
    }
}

#[derive(Debug, Default)]
struct Side {
    name: String,
    topic: String,
    keys: HashMap<Key, Copies>,
    undecodable: u64,
    first_ms: Option<i64>,
    last_ms: Option<i64>,
}

/// One key that one side lacks, as listed in the report.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Lacked {
    pub key: String,
    pub mqtt_topic: String,
    /// When the other side has it.
    pub time_ms: i64,
}

/// What one side holds within the window.
#[derive(Debug, Clone, Serialize)]
pub struct SideReport {
    pub name: String,
    pub topic: String,
    /// Copies it holds of the window's keys (see the module docs).
    pub messages: u64,
    pub distinct_keys: u64,
    /// Messages beyond the first of their key: the copies a deduplicator let
    /// through.
    pub extra_copies: u64,
    /// Keys held more than once.
    pub keys_with_copies: u64,
    /// Keys of the window that this side has nowhere in what was read.
    pub lacks: u64,
    /// The first few of them, oldest first.
    pub lacks_first: Vec<Lacked>,
    /// Of every key either side has in the window, the share this side has,
    /// in percent.
    pub coverage_percent: f64,
    /// Messages whose contents could not be read (an envelope that does not
    /// decode): not keyed, not counted above.
    pub undecodable: u64,
}

/// The comparison of two sides.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub window: Window,
    /// Keys whose earliest copy, on either side, is in the window.
    pub union_keys: u64,
    pub sides: [SideReport; 2],
}

impl Report {
    /// Whether there is anything to compare: at least one key in the window
    /// on either side. Two empty sides (a wrong topic name, a window before
    /// either pipeline ran) are not "identical": they prove nothing.
    pub fn compared_anything(&self) -> bool {
        self.union_keys > 0
    }

    /// Whether the two sides hold the same keys, each exactly once, and
    /// there was at least one key to compare.
    pub fn identical(&self) -> bool {
        self.compared_anything()
            && self
                .sides
                .iter()
                .all(|s| s.lacks == 0 && s.extra_copies == 0 && s.undecodable == 0)
    }
}

/// Streaming comparison of two topics.
#[derive(Debug)]
pub struct Comparison {
    key: KeySpec,
    sides: [Side; 2],
    topics: HashMap<String, u32>,
    topic_names: Vec<String>,
}

impl Comparison {
    /// Compares side 0 (`a`, named `names.0`) with side 1, keying messages
    /// by `key` (a byte rule: the old deduplicator keys by topic and payload).
    pub fn new(key: KeySpec, a: (&str, &str), b: (&str, &str)) -> Self {
        let side = |(name, topic): (&str, &str)| Side {
            name: name.to_string(),
            topic: topic.to_string(),
            ..Default::default()
        };
        Self {
            key,
            sides: [side(a), side(b)],
            topics: HashMap::new(),
            topic_names: Vec::new(),
        }
    }

    fn intern(&mut self, topic: String) -> u32 {
        if let Some(&i) = self.topics.get(&topic) {
            return i;
        }
        let i = self.topic_names.len() as u32;
        self.topics.insert(topic.clone(), i);
        self.topic_names.push(topic);
        i
    }

    /// Feeds the next message of side `side` (0 or 1).
    pub fn push(&mut self, side: usize, m: Message) {
        let t = m.time_ms;
        {
            let s = &mut self.sides[side];
            s.first_ms = Some(s.first_ms.map_or(t, |f| f.min(t)));
            s.last_ms = Some(s.last_ms.map_or(t, |l| l.max(t)));
        }
        let Some((topic, payload)) = m.contents else {
            self.sides[side].undecodable += 1;
            return;
        };
        let Some(key) = crate::key::published_key(&self.key, &topic, &payload) else {
            return;
        };
        if let Some(c) = self.sides[side].keys.get_mut(&key) {
            c.more.push(t);
            return;
        }
        let topic = self.intern(topic);
        self.sides[side].keys.insert(
            key,
            Copies {
                first_ms: t,
                topic,
                more: Vec::new(),
            },
        );
    }

    /// The window when none is given: what both sides cover, less `margin`
    /// at each end. `None` when they do not overlap by more than that.
    pub fn overlap(&self, margin_ms: i64) -> Option<Window> {
        let [a, b] = &self.sides;
        let from = a.first_ms?.max(b.first_ms?) + margin_ms;
        let to = a.last_ms?.min(b.last_ms?) - margin_ms;
        (from <= to).then_some(Window {
            from_ms: from,
            to_ms: to,
        })
    }

    /// The report over `window`, listing up to `list` lacked keys per side.
    pub fn finish(self, window: Window, list: usize) -> Report {
        // Every key whose earliest copy, on either side, is in the window,
        // with that time and the topic to list it by.
        let mut keys: HashMap<Key, (i64, u32)> = HashMap::new();
        for side in &self.sides {
            for (k, c) in &side.keys {
                let t = c.times().min().unwrap_or(c.first_ms);
                keys.entry(*k)
                    .and_modify(|e| {
                        if t < e.0 {
                            *e = (t, c.topic)
                        }
                    })
                    .or_insert((t, c.topic));
            }
        }
        keys.retain(|_, (t, _)| window.holds(*t));
        let union = keys.len() as u64;
        let report = |side: &Side| {
            let mut lacked = Vec::new();
            let (mut messages, mut distinct, mut with_copies) = (0u64, 0u64, 0u64);
            for (k, (t, topic)) in &keys {
                match side.keys.get(k) {
                    Some(c) => {
                        let n = 1 + c.more.len() as u64;
                        messages += n;
                        distinct += 1;
                        with_copies += u64::from(n > 1);
                    }
                    None => lacked.push(Lacked {
                        key: hex::encode(k),
                        mqtt_topic: self.topic_names[*topic as usize].clone(),
                        time_ms: *t,
                    }),
                }
            }
            lacked.sort_by(|a, b| (a.time_ms, &a.key).cmp(&(b.time_ms, &b.key)));
            let lacks = lacked.len() as u64;
            lacked.truncate(list);
            SideReport {
                name: side.name.clone(),
                topic: side.topic.clone(),
                messages,
                distinct_keys: distinct,
                extra_copies: messages - distinct,
                keys_with_copies: with_copies,
                lacks,
                lacks_first: lacked,
                coverage_percent: if union == 0 {
                    100.0
                } else {
                    100.0 * distinct as f64 / union as f64
                },
                undecodable: side.undecodable,
            }
        };
        Report {
            window,
            union_keys: union,
            sides: [report(&self.sides[0]), report(&self.sides[1])],
        }
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "window          {} ..= {} ms since the epoch ({} s)",
            self.window.from_ms,
            self.window.to_ms,
            (self.window.to_ms - self.window.from_ms) / 1000
        )?;
        writeln!(f, "keys in either  {}", self.union_keys)?;
        let [a, b] = &self.sides;
        let row = |f: &mut std::fmt::Formatter<'_>, label: &str, x: String, y: String| {
            writeln!(f, "{label:<22}{x:>16}  {y:>16}")
        };
        row(f, "", a.name.clone(), b.name.clone())?;
        row(
            f,
            "messages",
            a.messages.to_string(),
            b.messages.to_string(),
        )?;
        row(
            f,
            "distinct keys",
            a.distinct_keys.to_string(),
            b.distinct_keys.to_string(),
        )?;
        row(
            f,
            "lacks (other has)",
            a.lacks.to_string(),
            b.lacks.to_string(),
        )?;
        row(
            f,
            "extra copies",
            a.extra_copies.to_string(),
            b.extra_copies.to_string(),
        )?;
        row(
            f,
            "keys with copies",
            a.keys_with_copies.to_string(),
            b.keys_with_copies.to_string(),
        )?;
        row(
            f,
            "undecodable",
            a.undecodable.to_string(),
            b.undecodable.to_string(),
        )?;
        row(
            f,
            "coverage",
            format!("{:.4} %", a.coverage_percent),
            format!("{:.4} %", b.coverage_percent),
        )?;
        for s in &self.sides {
            for l in &s.lacks_first {
                writeln!(
                    f,
                    "  {} lacks {} ({} at {} ms)",
                    s.name, l.key, l.mqtt_topic, l.time_ms
                )?;
            }
        }
        write!(
            f,
            "verdict         {}",
            if !self.compared_anything() {
                "NOTHING TO COMPARE (no key in the window on either side)"
            } else if self.identical() {
                "IDENTICAL"
            } else {
                "DIFFERENT"
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(t: i64, topic: &str, payload: &str) -> Message {
        Message {
            time_ms: t,
            contents: Some((topic.into(), payload.into())),
        }
    }

    fn window(from_ms: i64, to_ms: i64) -> Window {
        Window { from_ms, to_ms }
    }

    #[test]
    fn identical_topics_compare_identical() {
        let mut c = Comparison::new(KeySpec::TOPIC_PAYLOAD, ("old", "a"), ("new", "b"));
        for i in 0..100 {
            c.push(0, msg(i, "t", &i.to_string()));
            c.push(1, msg(i + 3, "t", &i.to_string()));
        }
        let r = c.finish(window(0, 200), 5);
        assert!(r.identical(), "{r}");
        assert_eq!(r.union_keys, 100);
        assert_eq!(r.sides[0].coverage_percent, 100.0);
    }

    #[test]
    fn a_dropped_key_and_a_doubled_one_are_found_on_their_sides() {
        let mut c = Comparison::new(KeySpec::TOPIC_PAYLOAD, ("old", "a"), ("new", "b"));
        for i in 0..100 {
            if i != 40 {
                c.push(0, msg(i, "t", &i.to_string()));
            }
            c.push(1, msg(i, "t", &i.to_string()));
            if i == 70 {
                c.push(0, msg(i + 5, "t", &i.to_string()));
            }
        }
        let r = c.finish(window(0, 200), 5);
        assert!(!r.identical());
        let [old, new] = &r.sides;
        assert_eq!(
            (old.lacks, old.extra_copies, old.keys_with_copies),
            (1, 1, 1)
        );
        assert_eq!(old.lacks_first[0].time_ms, 40);
        assert_eq!((new.lacks, new.extra_copies), (0, 0));
        assert_eq!(old.coverage_percent, 99.0);
        assert_eq!(new.coverage_percent, 100.0);
        assert!(r.to_string().contains("old lacks"), "{r}");
    }

    /// Two pipelines stamp the same message differently (one fell seconds
    /// behind): a key belongs to the window by its earliest copy, both sides
    /// count the same keys, and one side's late stamp outside the window
    /// does not make the key missing there.
    #[test]
    fn keys_at_the_edges_are_not_missing() {
        let mut c = Comparison::new(KeySpec::TOPIC_PAYLOAD, ("old", "a"), ("new", "b"));
        c.push(0, msg(1_000, "t", "edge"));
        c.push(1, msg(990, "t", "edge"));
        c.push(0, msg(1_500, "t", "mid"));
        c.push(1, msg(1_500, "t", "mid"));
        c.push(0, msg(2_700, "t", "end"));
        c.push(1, msg(1_990, "t", "end"));
        let r = c.finish(window(1_000, 2_000), 5);
        assert!(r.identical(), "{r}");
        // `edge` is first seen at 990, before the window: in neither count.
        assert_eq!((r.sides[0].distinct_keys, r.sides[1].distinct_keys), (2, 2));
        assert_eq!(r.union_keys, 2);
    }

    #[test]
    fn the_default_window_is_the_overlap_less_the_margin() {
        let mut c = Comparison::new(KeySpec::TOPIC_PAYLOAD, ("old", "a"), ("new", "b"));
        c.push(0, msg(0, "t", "x"));
        c.push(0, msg(10_000, "t", "y"));
        c.push(1, msg(2_000, "t", "x"));
        c.push(1, msg(9_000, "t", "y"));
        assert_eq!(c.overlap(1_000), Some(window(3_000, 8_000)));
        assert_eq!(c.overlap(4_000), None);
    }

    /// Two topics with no key in the window prove nothing: a typo in a
    /// topic name or a window before either pipeline ran used to compare
    /// "identical" and exit 0.
    #[test]
    fn nothing_to_compare_is_not_identical() {
        let c = Comparison::new(KeySpec::TOPIC_PAYLOAD, ("old", "a"), ("new", "b"));
        let r = c.finish(window(0, 10), 5);
        assert!(!r.compared_anything());
        assert!(!r.identical(), "{r}");
        assert!(r.to_string().contains("NOTHING TO COMPARE"), "{r}");
        // Messages outside the window count as nothing too.
        let mut c = Comparison::new(KeySpec::TOPIC_PAYLOAD, ("old", "a"), ("new", "b"));
        c.push(0, msg(500, "t", "x"));
        c.push(1, msg(500, "t", "x"));
        assert!(!c.finish(window(0, 10), 5).identical());
    }

    #[test]
    fn unreadable_contents_are_counted_apart() {
        let mut c = Comparison::new(KeySpec::TOPIC_PAYLOAD, ("old", "a"), ("new", "b"));
        c.push(
            0,
            Message {
                time_ms: 5,
                contents: None,
            },
        );
        let r = c.finish(window(0, 10), 5);
        assert_eq!(r.sides[0].undecodable, 1);
        assert!(!r.identical());
    }
}
