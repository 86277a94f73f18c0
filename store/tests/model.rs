//! The state machine against a plain model, over random histories.
//!
//! The model is what the dedup contract says, written the obvious way: a
//! `HashMap` of the keys in the window, a counter per topic, the outbox as
//! a sorted map. The state machine does the same with packed records,
//! node bits, checkpoints into sled and runs that point into the Raft log.
//! Every history proptest generates is applied to both, and after every
//! step every answer a node gives (the outcome of each copy, totals,
//! coverage, lookups, the outbox, the log hold) must agree.
//!
//! A history mixes entries from the leader (copies of a small set of keys
//! from three nodes, stamps that move the window forward, backward, or
//! jump past it), receipts from the publisher (behind, at and past what was
//! assigned), checkpoints, restarts that lose what the last checkpoint did
//! not write and re-apply the log from the applied marker (as openraft
//! does after a crash), and snapshots moved into a new store.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::Path;
use std::time::{Duration, Instant};

use firstseen_store::window::{self, MAX_EXPIRE_PER_ENTRY};
use firstseen_store::{
    Command, Coverage, NodeId, Observation, OutboxItem, Outcome, Response, StateStore,
};
use proptest::prelude::*;

const TOPICS: [&str; 2] = ["persistent://t/n/a", "persistent://t/n/b"];
const KEYS: u8 = 12;
const WINDOW_MS: u64 = 1_000;

#[derive(Clone, Debug)]
enum Step {
    /// An entry stamped `advance` ms after the previous stamp (negative:
    /// a new leader whose clock is behind), with (key, node, topic, slim)
    /// copies. A slim copy goes into the entry without its payload, as the
    /// leader proposes a copy of a key it believes held.
    Observe {
        advance: i64,
        copies: Vec<(u8, NodeId, usize, bool)>,
    },
    /// A receipt: `topic` is in Pulsar up to `last_seq + delta` (clamped at 0).
    Published {
        topic: usize,
        delta: i64,
    },
    Checkpoint,
    /// Crash and reopen: what no checkpoint wrote is lost, and the log is
    /// applied again from the marker the state kept.
    Restart,
    /// The state moves to a new store through a snapshot.
    Snapshot,
}

fn step() -> impl Strategy<Value = Step> {
    let copy = (
        0..KEYS,
        1..=3u64,
        0..TOPICS.len(),
        prop::bool::weighted(0.3),
    );
    prop_oneof![
        6 => (
            // Whole tenths of the window, so that records land exactly
            // on the cutoff often.
            prop_oneof![4 => 0i64..5, 1 => -3i64..0, 1 => 10i64..30].prop_map(|t| t * 100),
            prop::collection::vec(copy, 0..6)
        )
            .prop_map(|(advance, copies)| Step::Observe { advance, copies }),
        2 => (0..TOPICS.len(), -3i64..2).prop_map(|(topic, delta)| Step::Published { topic, delta }),
        1 => Just(Step::Checkpoint),
        1 => Just(Step::Restart),
        1 => Just(Step::Snapshot),
    ]
}

fn observation(key: u8, node: NodeId, topic: usize) -> Observation {
    Observation {
        key: [key; 32],
        mqtt_topic: format!("/hfp/{key}"),
        pulsar_topic: TOPICS[topic].to_string(),
        payload: vec![key; 1 + key as usize % 7],
        qos: 1,
        retain: false,
        node,
        received_ms: 0,
    }
}

/// One key in the model's window.
struct KeyState {
    topic: String,
    seq: u64,
    first: NodeId,
    seen_by: BTreeSet<NodeId>,
    ts: u64,
}

/// Where an unpublished message is: a log entry, or inline (it came with a
/// snapshot).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum At {
    Log { index: u64, pos: u32 },
    Inline,
}

#[derive(Default)]
struct Model {
    clock: u64,
    /// Entries that brought new keys, oldest first: (time, keys).
    records: VecDeque<(u64, Vec<[u8; 32]>)>,
    records_total: u64,
    keys: HashMap<[u8; 32], KeyState>,
    /// Per topic: last sequence assigned, last published.
    topics: BTreeMap<String, (u64, u64)>,
    outbox: BTreeMap<(String, u64), (At, u64, [u8; 32])>,
    observed: u64,
    duplicates: u64,
    expired: u64,
}

impl Model {
    fn observe(
        &mut self,
        stamped: u64,
        obs: &[Observation],
        slim: &[bool],
        index: u64,
    ) -> Vec<Outcome> {
        self.clock = self.clock.max(stamped);
        let cutoff = self.clock.saturating_sub(WINDOW_MS);
        let mut budget = 0;
        while let Some((ts, keys)) = self.records.front() {
            if *ts >= cutoff || budget >= MAX_EXPIRE_PER_ENTRY {
                break;
            }
            budget += keys.len();
            for k in keys {
                if self.keys.remove(k).is_some() {
                    self.expired += 1;
                }
            }
            self.records.pop_front();
        }
        let mut new_keys = Vec::new();
        let mut out = Vec::new();
        for (pos, o) in obs.iter().enumerate() {
            if slim[pos] && !self.keys.contains_key(&o.key) {
                out.push(Outcome::Missing);
                continue;
            }
            self.observed += 1;
            if let Some(k) = self.keys.get_mut(&o.key) {
                self.duplicates += 1;
                k.seen_by.insert(o.node);
                out.push(Outcome::Duplicate {
                    seq: k.seq,
                    first_node: k.first,
                });
                continue;
            }
            let t = self.topics.entry(o.pulsar_topic.clone()).or_default();
            t.0 += 1;
            let seq = t.0;
            self.keys.insert(
                o.key,
                KeyState {
                    topic: o.pulsar_topic.clone(),
                    seq,
                    first: o.node,
                    seen_by: BTreeSet::from([o.node]),
                    ts: self.clock,
                },
            );
            let charge = window::outbox_charge(&o.mqtt_topic, &o.payload, None);
            let at = At::Log {
                index,
                pos: pos as u32,
            };
            self.outbox
                .insert((o.pulsar_topic.clone(), seq), (at, charge, o.key));
            new_keys.push(o.key);
            out.push(Outcome::FirstSeen { seq });
        }
        if !new_keys.is_empty() {
            self.records.push_back((self.clock, new_keys));
            self.records_total += 1;
        }
        out
    }

    fn published(&mut self, topic: &str, seq: u64) -> u64 {
        let t = self.topics.entry(topic.to_string()).or_default();
        let upto = seq.min(t.0);
        if upto > t.1 {
            t.1 = upto;
            self.outbox.retain(|(tp, s), _| tp != topic || *s > upto);
        }
        t.1
    }

    fn hold(&self) -> u64 {
        self.outbox
            .values()
            .filter_map(|(at, _, _)| match at {
                At::Log { index, .. } => Some(*index),
                At::Inline => None,
            })
            .min()
            .unwrap_or(firstseen_store::state::NO_HOLD)
    }
}

/// Opens a store in `dir`, retrying while sled's threads of a dropped
/// handle still hold the file lock.
fn open(dir: &Path) -> (sled::Db, StateStore) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match sled::Config::new().path(dir).flush_every_ms(None).open() {
            Ok(db) => {
                let s = StateStore::open(&db).expect("open the state");
                return (db, s);
            }
            Err(e) if Instant::now() < deadline && e.to_string().contains("lock") => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("open {}: {e}", dir.display()),
        }
    }
}

fn marker(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

/// Every answer the store gives, compared with the model's.
fn agree(s: &StateStore, m: &Model) -> Result<(), TestCaseError> {
    let t = s.totals().unwrap();
    let outbox_bytes: u64 = m.outbox.values().map(|(_, c, _)| c).sum();
    prop_assert_eq!(
        (
            t.clock_ms,
            t.window_keys,
            t.observed,
            t.duplicates,
            t.expired,
            t.records,
            t.outbox_messages,
            t.outbox_bytes
        ),
        (
            m.clock,
            m.keys.len() as u64,
            m.observed,
            m.duplicates,
            m.expired,
            m.records_total,
            m.outbox.len() as u64,
            outbox_bytes
        ),
        "totals"
    );
    prop_assert_eq!(s.indexed_keys(), m.keys.len());
    for k in 0..KEYS {
        let key = [k; 32];
        let got = s.lookup(&key).unwrap();
        match m.keys.get(&key) {
            None => prop_assert!(got.is_none(), "key {} should have expired", k),
            Some(want) => {
                let mut got = got.expect("a key in the window");
                // Nodes come in the order they got their bits.
                got.seen_by.sort_unstable();
                prop_assert_eq!(
                    (got.seq, got.node, got.ts_ms, got.seen_by),
                    (
                        want.seq,
                        want.first,
                        want.ts,
                        want.seen_by.iter().copied().collect::<Vec<_>>()
                    ),
                    "lookup of key {} on {}",
                    k,
                    want.topic
                );
            }
        }
    }
    let mut coverage: BTreeMap<NodeId, Coverage> = BTreeMap::new();
    for k in m.keys.values() {
        coverage.entry(k.first).or_default().first += 1;
        for n in &k.seen_by {
            coverage.entry(*n).or_default().seen += 1;
        }
    }
    let got: BTreeMap<NodeId, Coverage> = s
        .coverage()
        .unwrap()
        .into_iter()
        .filter(|(_, c)| *c != Coverage::default())
        .collect();
    prop_assert_eq!(got, coverage, "coverage");
    for topic in TOPICS {
        let state = s.topic_state(topic).unwrap();
        let (last, published) = m.topics.get(topic).copied().unwrap_or_default();
        prop_assert_eq!((state.last_seq, state.published_seq), (last, published));
        let got: Vec<(u64, At, [u8; 32])> = s
            .outbox_from(topic, 0, 10_000)
            .unwrap()
            .into_iter()
            .map(|(seq, item)| match item {
                OutboxItem::InLog { log_index, pos, .. } => (
                    seq,
                    At::Log {
                        index: log_index,
                        pos,
                    },
                    [0; 32],
                ),
                OutboxItem::Inline(msg) => (seq, At::Inline, msg.key),
            })
            .collect();
        let want: Vec<(u64, At, [u8; 32])> = m
            .outbox
            .range((topic.to_string(), 0)..=(topic.to_string(), u64::MAX))
            .map(|((_, seq), (at, _, key))| {
                // A message in the log is read from there; only an inline
                // one carries its key.
                let key = if *at == At::Inline { *key } else { [0; 32] };
                (*seq, *at, key)
            })
            .collect();
        prop_assert_eq!(got, want, "outbox of {}", topic);
    }
    prop_assert_eq!(s.log_hold(), m.hold(), "log hold");
    Ok(())
}

fn run(steps: Vec<Step>) -> Result<(), TestCaseError> {
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let mut which = 0;
    let (mut db, mut s) = open(dirs[which].path());
    let mut m = Model::default();
    // The Raft log: entry i is log[i - 1].
    let mut log: Vec<Command> = Vec::new();
    let mut stamp: u64 = 10_000;
    for step in steps {
        match step {
            Step::Observe { advance, copies } => {
                stamp = stamp.saturating_add_signed(advance);
                let obs: Vec<Observation> = copies
                    .iter()
                    .map(|(k, n, t, slim)| {
                        let o = observation(*k, *n, *t);
                        if *slim {
                            Observation {
                                payload: Vec::new(),
                                mqtt_topic: String::new(),
                                pulsar_topic: String::new(),
                                ..o
                            }
                        } else {
                            o
                        }
                    })
                    .collect();
                let slim: Vec<bool> = copies.iter().map(|c| c.3).collect();
                let positions: Vec<u32> = (0..slim.len() as u32)
                    .filter(|i| slim[*i as usize])
                    .collect();
                let cmd = if positions.is_empty() {
                    Command::Observe {
                        stamped_ms: stamp,
                        window: firstseen_store::Window::from_ms(WINDOW_MS),
                        observations: obs.clone(),
                    }
                } else {
                    Command::ObserveSlim {
                        stamped_ms: stamp,
                        window: firstseen_store::Window::from_ms(WINDOW_MS),
                        observations: obs.clone(),
                        properties: Vec::new(),
                        slim: positions,
                    }
                };
                log.push(cmd);
                let index = log.len() as u64;
                let got = s.apply(log.last(), index, &marker(index)).unwrap();
                let want = m.observe(stamp, &obs, &slim, index);
                prop_assert_eq!(got, Response::Observed(want), "entry {}", index);
            }
            Step::Published { topic, delta } => {
                let last = m.topics.get(TOPICS[topic]).map_or(0, |t| t.0);
                let seq = last.saturating_add_signed(delta);
                log.push(Command::Published {
                    pulsar_topic: TOPICS[topic].to_string(),
                    seq,
                });
                let index = log.len() as u64;
                let got = s.apply(log.last(), index, &marker(index)).unwrap();
                let want = m.published(TOPICS[topic], seq);
                prop_assert_eq!(got, Response::Published { watermark: want });
            }
            Step::Checkpoint => s.checkpoint().unwrap(),
            Step::Restart => {
                drop(s);
                drop(db);
                (db, s) = open(dirs[which].path());
                let from = match s.applied_marker().unwrap() {
                    Some(raw) => u64::from_be_bytes(raw.try_into().expect("an 8-byte marker")),
                    None => 0,
                };
                prop_assert!(from <= log.len() as u64);
                for index in from + 1..=log.len() as u64 {
                    s.apply(Some(&log[index as usize - 1]), index, &marker(index))
                        .unwrap();
                }
            }
            Step::Snapshot => {
                let mut buf = Vec::new();
                s.export(&mut buf, &mut |i| Ok(log[i as usize - 1].clone()))
                    .unwrap();
                which = 1 - which;
                drop(s);
                drop(db);
                (db, s) = open(dirs[which].path());
                s.import(&mut buf.as_slice()).unwrap();
                // The new store holds every unpublished message itself.
                for (at, _, _) in m.outbox.values_mut() {
                    *at = At::Inline;
                }
            }
        }
        agree(&s, &m)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("MODEL_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(128),
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_state_machine_agrees_with_the_model(steps in prop::collection::vec(step(), 1..60)) {
        run(steps)?;
    }
}
