//! The rules of one committed entry, applied to the state in memory.
//!
//! An observation is the first copy of its key or a duplicate; a first copy
//! gets the next sequence of its Pulsar topic and a place in the outbox; the
//! leader's stamp (never this node's clock) moves the window and expires
//! what fell out of it; a receipt trims the outbox up to what was
//! published, and never moves back. Every node applies the same entries in
//! the same order and so holds the same state.
//!
//! Apply changes only [`Memory`]. It reads the disk in two cases, through
//! [`Written`]: records to expire that a checkpoint already wrote, and
//! outbox messages that came with a snapshot. Each read happens before the
//! first change, so an error leaves the memory as it was.

use std::collections::BTreeMap;

use super::memory::{Head, Memory, PendingRecord};
use super::{corrupt, StateStore};
use crate::index::{Index, Slot};
use crate::level::{Levels, KINDS, NAMES};
use crate::record::{self, Item, Run};
use crate::window;
use crate::StoreError;
use crate::{Command, Coverage, Key, KeyKind, Observation, OutboxMessage, Outcome, Response};

/// Per topic, the position and outbox charge of each first copy in an entry.
type RunMessages = Vec<(u32, u64)>;

/// Inline outbox messages as (sled key, encoded message).
pub(super) type InlineMessages = Vec<(Vec<u8>, Vec<u8>)>;

/// What apply reads of the state's disk.
pub(super) trait Written {
    /// Window record `rec`, as a checkpoint wrote it.
    fn record(&self, rec: u64) -> Result<Option<Vec<u8>>, StoreError>;
    /// The inline outbox messages of `topic` from sequence `from` to `upto`,
    /// as (sled key, encoded message).
    fn inline(&self, topic: &str, from: u64, upto: u64) -> Result<InlineMessages, StoreError>;
}

impl Written for StateStore {
    fn record(&self, rec: u64) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .window
            .get(record::record_key(rec))?
            .map(|v| v.to_vec()))
    }

    fn inline(&self, topic: &str, from: u64, upto: u64) -> Result<InlineMessages, StoreError> {
        let range = window::outbox_key(topic, from)..=window::outbox_key(topic, upto);
        self.inline
            .range(range)
            .map(|item| {
                let (k, v) = item?;
                Ok((k.to_vec(), v.to_vec()))
            })
            .collect()
    }
}

fn dec_seen(c: &mut Coverage) {
    c.seen = c.seen.saturating_sub(1);
}

/// How apply looks a copy up: at which level, and which older forms of
/// its key the window may still hold.
#[derive(Clone, Copy, Debug)]
pub(super) struct Scope {
    pub(super) level: u32,
    /// Records from before level 2 may remain: look a copy up by its bare
    /// key too.
    pub(super) bare: bool,
    /// Records from before level 3 may remain: look a copy up under the
    /// identities of its topic's other spellings too.
    pub(super) names: bool,
}

impl Memory {
    /// The [`Scope`] of the next lookup.
    pub(super) fn scope(&self) -> Scope {
        let level = self.levels.level;
        let expired_below = self.head.expired_below;
        Scope {
            level,
            bare: level >= KINDS && expired_below < self.levels.bare_below,
            names: level >= NAMES && expired_below < self.names_below,
        }
    }
}

/// The name the state gives `topic` at `level`: from level 3 its canonical
/// name ([`crate::topic::canonical`]), below it the spelling as written.
pub(super) fn topic_name(level: u32, topic: &str) -> std::borrow::Cow<'_, str> {
    if level >= NAMES {
        crate::topic::canonical(topic)
    } else {
        std::borrow::Cow::Borrowed(topic)
    }
}

/// Where the window holds a copy: the key its first copy was stored under,
/// if one is held.
///
/// Below level 2, the bare key. From level 2, the copy's [`window::identity`]
/// (its key in the domain of its Pulsar topic and kind), and also its bare
/// key while records from before the level rose may remain (`bare`), so a
/// message first seen before it is still a duplicate after it. A copy of
/// unknown kind (proposed before its node saw the level rise) is held under
/// its bare key, and may find its message under any kind's identity.
///
/// From level 3 the topic is its canonical name; while records from before
/// the level rose may remain (`names`), a copy is also looked up under the
/// identities of the topic's other spellings (`fs` for
/// `persistent://public/default/fs`), so a message first seen under a short
/// name before the rise is still a duplicate under the full one after it.
pub(super) fn locate(index: &Index, scope: Scope, obs: &Observation, kind: KeyKind) -> Option<Key> {
    let held = |k: Key| index.get(&k).is_some().then_some(k);
    if scope.level < KINDS {
        return held(obs.key);
    }
    let topic = topic_name(scope.level, &obs.pulsar_topic);
    let spellings: Vec<String> = if scope.names && !obs.pulsar_topic.is_empty() {
        crate::topic::other_spellings(&topic)
    } else {
        Vec::new()
    };
    let names = || std::iter::once(topic.as_ref()).chain(spellings.iter().map(String::as_str));
    if kind != KeyKind::Unknown {
        return names()
            .find_map(|t| held(window::identity(t, kind, &obs.key)))
            .or_else(|| scope.bare.then(|| held(obs.key)).flatten());
    }
    held(obs.key).or_else(|| {
        // A slim copy from before kinds has no topic: it comes back
        // Missing, and the leader sends it again whole.
        (!obs.pulsar_topic.is_empty())
            .then(|| {
                names().find_map(|t| {
                    KeyKind::KNOWN
                        .iter()
                        .find_map(|k| held(window::identity(t, *k, &obs.key)))
                })
            })
            .flatten()
    })
}

/// The key a new first copy is stored under (see [`locate`]).
fn storage_key(level: u32, obs: &Observation, kind: KeyKind) -> Key {
    if level < KINDS || kind == KeyKind::Unknown {
        obs.key
    } else {
        window::identity(&topic_name(level, &obs.pulsar_topic), kind, &obs.key)
    }
}

impl Memory {
    /// Applies log entry `log_index`. `applied` is the caller's marker,
    /// written with the state it describes at the next checkpoint.
    pub(super) fn apply(
        &mut self,
        disk: &impl Written,
        cmd: Option<&Command>,
        log_index: u64,
        applied: &[u8],
    ) -> Result<Response, StoreError> {
        let response = match cmd {
            None => Response::None,
            Some(Command::Published { pulsar_topic, seq }) => {
                let topic = topic_name(self.levels.level, pulsar_topic).into_owned();
                self.published(disk, &topic, *seq)?
            }
            Some(Command::Level { level }) => self.raise_level(disk, *level)?,
            Some(Command::SetAside(s)) if self.levels.level >= NAMES => {
                let named = crate::SetAside {
                    pulsar_topic: crate::topic::canonical(&s.pulsar_topic).into_owned(),
                    ..(**s).clone()
                };
                self.aside.keep(&named, self.head.totals.clock_ms)?
            }
            Some(Command::SetAside(s)) => self.aside.keep(s, self.head.totals.clock_ms)?,
            Some(Command::Rebase(r)) => self.rebase(disk, r)?,
            Some(Command::Generation { generation }) => {
                self.generation = self.generation.max(*generation);
                Response::None
            }
            // Properties do not change what is applied: they travel with the
            // payload, which the outbox reads from the log entry.
            Some(cmd) => match cmd.as_observe() {
                Some((stamped_ms, window, observations)) => {
                    self.observe(disk, stamped_ms, window, observations, cmd, log_index)?
                }
                None => Response::None,
            },
        };
        self.head.applied = applied.to_vec();
        self.dirty = true;
        self.entries_since += 1;
        Ok(response)
    }

    /// The window records from `from` on whose time is before `cutoff`,
    /// stopping once [`window::MAX_EXPIRE_PER_ENTRY`] keys are reached.
    fn expiring(
        &self,
        disk: &impl Written,
        cutoff: u64,
    ) -> Result<Vec<(u64, Vec<Item>)>, StoreError> {
        let mut out = Vec::new();
        let mut keys = 0;
        let mut rec = self.head.expired_below;
        let first_pending = self.first_unwritten();
        while rec < self.head.totals.records && keys < window::MAX_EXPIRE_PER_ENTRY {
            let (ts, items) = if rec >= first_pending {
                let p = &self.pending[(rec - first_pending) as usize];
                (p.ts, p.items.clone())
            } else {
                let raw = disk
                    .record(rec)?
                    .ok_or_else(|| corrupt("a window record is missing"))?;
                if record::record_ts(&raw).ok_or_else(|| corrupt("window record"))? >= cutoff {
                    break;
                }
                record::decode_record(&raw).ok_or_else(|| corrupt("window record"))?
            };
            if ts >= cutoff {
                break;
            }
            keys += items.len();
            out.push((rec, items));
            rec += 1;
        }
        Ok(out)
    }

    /// The cluster's level rises to `level`; an older or equal one changes
    /// nothing. Refused, before anything changes, when this release does
    /// not know it.
    fn raise_level(&mut self, disk: &impl Written, level: u32) -> Result<Response, StoreError> {
        crate::level::check(level)?;
        if level > self.levels.level {
            if self.levels.level < NAMES && level >= NAMES {
                // Fallible reads first, inside: nothing changed on error.
                // Every record so far may hold a topic's other spellings,
                // if a topic had one: every spelling a copy was stored
                // under is a topic of the state (none is ever dropped), so
                // with all of them canonical the window holds no other
                // spelling, and copies are not looked up under any (three
                // more identities and lookups per copy for a window).
                if self.name_topics(disk)? {
                    self.names_below = self.head.totals.records;
                }
            }
            self.levels = Levels {
                level,
                // Every record so far holds bare keys.
                bare_below: self.head.totals.records.max(self.levels.bare_below),
            };
        }
        Ok(Response::None)
    }

    fn observe(
        &mut self,
        disk: &impl Written,
        stamped_ms: u64,
        window: crate::Window,
        observations: &[Observation],
        cmd: &Command,
        log_index: u64,
    ) -> Result<Response, StoreError> {
        let slim = cmd.slim();
        let clock = window::advance_clock(self.head.totals.clock_ms, stamped_ms);
        let cutoff = window::expiry_cutoff(clock, window);
        // The only fallible step, done before anything changes.
        let expiring = self.expiring(disk, cutoff)?;

        let Memory {
            head,
            levels,
            names_below,
            index,
            pending,
            masks,
            runs,
            runs_new,
            ..
        } = self;
        let Head {
            totals,
            coverage,
            topics,
            bits,
            expired_below,
            ..
        } = head;
        totals.clock_ms = clock;
        for (rec, items) in expiring {
            for it in items {
                let Some(slot) = index.remove_from(&it.key, rec) else {
                    continue;
                };
                for node in bits.nodes_in(slot.mask) {
                    dec_seen(coverage.entry(node).or_default());
                }
                if let Some(node) = bits.node_of(slot.node_bit) {
                    let c = coverage.entry(node).or_default();
                    c.first = c.first.saturating_sub(1);
                }
                totals.window_keys = totals.window_keys.saturating_sub(1);
                totals.expired += 1;
            }
            *expired_below = rec + 1;
        }
        while pending.front().is_some_and(|p| p.rec < *expired_below) {
            pending.pop_front();
        }
        masks.retain(|rec, _| *rec >= *expired_below);

        let rec_id = totals.records;
        let mut new_items: Vec<Item> = Vec::new();
        let mut new_masks: Vec<u64> = Vec::new();
        // Per topic: first sequence, then (position, charge) per message.
        let mut new_runs: BTreeMap<std::borrow::Cow<'_, str>, (u64, RunMessages)> = BTreeMap::new();
        let mut outcomes = Vec::with_capacity(observations.len());
        let mut slim = slim.iter().copied().peekable();
        let level = levels.level;
        for (pos, obs) in observations.iter().enumerate() {
            let is_slim = slim.next_if_eq(&(pos as u32)).is_some();
            // Per copy: a bare key stored by an earlier copy of this entry
            // counts too.
            let scope = Scope {
                level,
                bare: level >= KINDS && *expired_below < levels.bare_below,
                names: level >= NAMES && *expired_below < *names_below,
            };
            let kind = cmd.kind(pos);
            let found = locate(index, scope, obs, kind);
            if is_slim && found.is_none() {
                // Without its payload it cannot be the first copy: nothing
                // changes, and the leader sends it again whole.
                outcomes.push(Outcome::Missing);
                continue;
            }
            totals.observed += 1;
            let bit = bits.assign(obs.node, |n| {
                coverage.get(&n).is_none_or(|c| c.seen == 0 && c.first == 0)
            });
            let bit_mask = record::first_mask(bit);
            if let Some(slot) = found.and_then(|k| index.get_mut(&k)) {
                totals.duplicates += 1;
                if slot.mask & bit_mask != bit_mask {
                    slot.mask |= bit_mask;
                    coverage.entry(obs.node).or_default().seen += 1;
                    let (rec, item, mask) = (slot.rec, slot.item as usize, slot.mask);
                    if rec == rec_id {
                        // Only a slot made by this very entry can point here.
                        *new_masks
                            .get_mut(item)
                            .ok_or_else(|| corrupt("a window slot ahead of the head"))? = mask;
                    } else if let Some(p) = pending
                        .front()
                        .map(|f| f.rec)
                        .and_then(|f| rec.checked_sub(f))
                        .and_then(|i| pending.get_mut(i as usize))
                    {
                        *p.masks
                            .get_mut(item)
                            .ok_or_else(|| corrupt("a window slot beyond its record"))? = mask;
                    } else {
                        masks.entry(rec).or_default().insert(item as u32, mask);
                    }
                }
                outcomes.push(Outcome::Duplicate {
                    seq: slot.seq,
                    first_node: bits.node_of(slot.node_bit).unwrap_or_default(),
                });
                continue;
            }
            let topic = topic_name(level, &obs.pulsar_topic);
            let state = topics.entry(topic.clone().into_owned()).or_default();
            state.last_seq += 1;
            let seq = state.last_seq;
            let charge = window::outbox_charge(&obs.mqtt_topic, &obs.payload, cmd.properties(pos));
            let stored = storage_key(level, obs, kind);
            if level >= KINDS && stored == obs.key {
                // A bare key at level 2: looked up bare until it expires.
                levels.bare_below = levels.bare_below.max(rec_id + 1);
            }
            index.insert(
                stored,
                Slot {
                    rec: rec_id,
                    seq,
                    mask: bit_mask,
                    item: new_items.len() as u32,
                    node_bit: bit,
                },
            );
            new_items.push(Item {
                key: stored,
                node_bit: bit,
                seq,
            });
            new_masks.push(0);
            new_runs
                .entry(topic)
                .or_insert((seq, Vec::new()))
                .1
                .push((pos as u32, charge));
            totals.outbox_messages += 1;
            totals.outbox_bytes += charge;
            totals.window_keys += 1;
            if bit != record::UNTRACKED {
                let c = coverage.entry(obs.node).or_default();
                c.seen += 1;
                c.first += 1;
            }
            outcomes.push(Outcome::FirstSeen { seq });
        }
        if !new_items.is_empty() {
            // A later copy in the same entry set a full mask; the record
            // stores only what differs from the first node.
            for (m, it) in new_masks.iter_mut().zip(&new_items) {
                if *m == record::first_mask(it.node_bit) {
                    *m = 0;
                }
            }
            pending.push_back(PendingRecord {
                rec: rec_id,
                ts: clock,
                items: new_items,
                masks: new_masks,
            });
            totals.records += 1;
        }
        for (topic, (first, messages)) in new_runs {
            let key = window::outbox_key(&topic, first);
            runs.insert(
                key.clone(),
                Run {
                    log_index,
                    first_seen_ms: clock,
                    messages,
                },
            );
            runs_new.insert(key);
        }
        Ok(Response::Observed(outcomes))
    }

    fn published(
        &mut self,
        disk: &impl Written,
        topic: &str,
        seq: u64,
    ) -> Result<Response, StoreError> {
        let mut state = self.head.topics.get(topic).copied().unwrap_or_default();
        // A receipt can never cover more than was assigned.
        let upto = seq.min(state.last_seq);
        let before = state.published_seq;
        if upto <= before {
            return Ok(Response::Published { watermark: before });
        }
        // Inline messages came with a snapshot; read (fallibly) before any
        // change. Their records are deleted at the next checkpoint.
        let mut inline = Vec::new();
        for (k, v) in disk.inline(topic, before + 1, upto)? {
            let m = OutboxMessage::decode(&v)?;
            inline.push((
                k,
                window::outbox_charge(&m.mqtt_topic, &m.payload, m.properties.as_deref()),
            ));
        }
        let totals = &mut self.head.totals;
        for (k, charge) in inline {
            totals.outbox_messages = totals.outbox_messages.saturating_sub(1);
            totals.outbox_bytes = totals.outbox_bytes.saturating_sub(charge);
            self.inline_gone.push(k);
        }
        let mut done = Vec::new();
        let range = window::outbox_key(topic, 0)..=window::outbox_key(topic, upto);
        for (k, run) in self.runs.range(range) {
            let first = window::outbox_seq(k).unwrap_or_default();
            for (i, (_, charge)) in run.messages.iter().enumerate() {
                let s = first + i as u64;
                if s > before && s <= upto {
                    totals.outbox_messages = totals.outbox_messages.saturating_sub(1);
                    totals.outbox_bytes = totals.outbox_bytes.saturating_sub(*charge);
                }
            }
            if first + run.messages.len() as u64 <= upto + 1 {
                done.push(k.clone());
            }
        }
        for k in done {
            self.runs.remove(&k);
            // A run published before any checkpoint wrote it never reaches disk.
            if !self.runs_new.remove(&k) {
                self.runs_gone.insert(k);
            }
        }
        state.published_seq = upto;
        self.head.topics.insert(topic.to_string(), state);
        Ok(Response::Published { watermark: upto })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::testing::{obs, observe, store};
    use crate::{Command, Coverage, Outcome, Response};

    #[test]
    fn keeps_the_first_copy_and_numbers_topics_without_gaps() {
        let s = store();
        let r = s
            .apply(
                Some(&observe(
                    1_000,
                    60_000,
                    vec![
                        obs(1, 1, "a"),
                        obs(2, 2, "a"),
                        obs(1, 2, "a"),
                        obs(3, 1, "b"),
                    ],
                )),
                1,
                b"1",
            )
            .unwrap();
        assert_eq!(
            r,
            Response::Observed(vec![
                Outcome::FirstSeen { seq: 1 },
                Outcome::FirstSeen { seq: 2 },
                Outcome::Duplicate {
                    seq: 1,
                    first_node: 1
                },
                Outcome::FirstSeen { seq: 1 },
            ])
        );
        let r = s
            .apply(
                Some(&observe(
                    1_001,
                    60_000,
                    vec![obs(2, 1, "a"), obs(4, 3, "a")],
                )),
                2,
                b"2",
            )
            .unwrap();
        assert_eq!(
            r,
            Response::Observed(vec![
                Outcome::Duplicate {
                    seq: 2,
                    first_node: 2
                },
                Outcome::FirstSeen { seq: 3 }
            ])
        );
        assert_eq!(s.topic_state("a").unwrap().last_seq, 3);
        let seqs: Vec<u64> = s
            .outbox_from("a", 1, 100)
            .unwrap()
            .iter()
            .map(|(q, _)| *q)
            .collect();
        assert_eq!(seqs, vec![1, 2, 3]);
        let t = s.totals().unwrap();
        assert_eq!(
            (t.observed, t.duplicates, t.window_keys, t.outbox_messages),
            (6, 2, 4, 4)
        );
        assert_eq!(s.applied_marker().unwrap().as_deref(), Some(&b"2"[..]));
    }

    fn slim(o: crate::Observation) -> crate::Observation {
        crate::Observation {
            payload: Vec::new(),
            mqtt_topic: String::new(),
            pulsar_topic: String::new(),
            ..o
        }
    }

    fn observe_slim(
        stamped_ms: u64,
        observations: Vec<crate::Observation>,
        at: Vec<u32>,
    ) -> Command {
        Command::ObserveSlim {
            stamped_ms,
            window: crate::Window::from_ms(500),
            observations,
            properties: Vec::new(),
            slim: at,
        }
    }

    /// A copy proposed without its payload counts as a duplicate of a key
    /// the state holds, and changes nothing when the state does not hold
    /// its key (expired since the leader looked, or never there): it comes
    /// back Missing, so nobody acks it on the strength of a payload nobody
    /// stored.
    #[test]
    fn a_slim_copy_is_a_duplicate_or_missing_never_first() {
        let s = store();
        s.apply(Some(&observe(1_000, 500, vec![obs(1, 1, "a")])), 1, b"1")
            .unwrap();
        let before = s.totals().unwrap();
        let r = s
            .apply(
                Some(&observe_slim(
                    1_100,
                    vec![
                        slim(obs(1, 2, "a")),
                        slim(obs(2, 2, "a")),
                        obs(3, 3, "a"),
                        slim(obs(3, 1, "a")),
                    ],
                    vec![0, 1, 3],
                )),
                2,
                b"2",
            )
            .unwrap();
        assert_eq!(
            r,
            Response::Observed(vec![
                Outcome::Duplicate {
                    seq: 1,
                    first_node: 1
                },
                Outcome::Missing,
                Outcome::FirstSeen { seq: 2 },
                Outcome::Duplicate {
                    seq: 2,
                    first_node: 3
                },
            ])
        );
        assert!(
            s.lookup(&[2; 32]).unwrap().is_none(),
            "a Missing copy stores nothing"
        );
        let after = s.totals().unwrap();
        assert_eq!(
            after.observed - before.observed,
            3,
            "Missing is not counted"
        );
        assert_eq!(after.window_keys, 2);
        let seen_by = s.lookup(&[1; 32]).unwrap().unwrap().seen_by;
        assert_eq!(seen_by, vec![1, 2], "a slim copy still counts for its zone");
        // Expired by this very entry's stamp: Missing, not first.
        let r = s
            .apply(
                Some(&observe_slim(1_700, vec![slim(obs(1, 3, "a"))], vec![0])),
                3,
                b"3",
            )
            .unwrap();
        assert_eq!(r, Response::Observed(vec![Outcome::Missing]));
        assert_eq!(s.topic_state("a").unwrap().last_seq, 2, "no sequence spent");
    }

    #[test]
    fn counts_coverage_once_per_node_and_key() {
        let s = store();
        s.apply(
            Some(&observe(
                1,
                60_000,
                vec![
                    obs(1, 1, "a"),
                    obs(1, 1, "a"),
                    obs(1, 2, "a"),
                    obs(2, 2, "a"),
                ],
            )),
            1,
            b"1",
        )
        .unwrap();
        let cov: BTreeMap<_, _> = s.coverage().unwrap().into_iter().collect();
        assert_eq!(cov[&1], Coverage { seen: 1, first: 1 });
        assert_eq!(cov[&2], Coverage { seen: 2, first: 1 });
    }

    #[test]
    fn expires_by_leader_stamp_and_forgets_coverage() {
        let s = store();
        s.apply(
            Some(&observe(1_000, 500, vec![obs(1, 1, "a"), obs(2, 2, "a")])),
            1,
            b"1",
        )
        .unwrap();
        s.apply(Some(&observe(1_200, 500, vec![obs(3, 1, "a")])), 2, b"2")
            .unwrap();
        // A leader with a clock behind the last stamp cannot move the window back.
        s.apply(Some(&observe(900, 500, vec![])), 3, b"3").unwrap();
        assert!(s.lookup(&[1; 32]).unwrap().is_some());
        // At 1,600 the window starts at 1,100: keys 1 and 2 go, 3 stays.
        s.apply(Some(&observe(1_600, 500, vec![])), 4, b"4")
            .unwrap();
        assert!(s.lookup(&[1; 32]).unwrap().is_none());
        assert!(s.lookup(&[3; 32]).unwrap().is_some());
        let t = s.totals().unwrap();
        assert_eq!((t.window_keys, t.expired, t.clock_ms), (1, 2, 1_600));
        let cov: BTreeMap<_, _> = s.coverage().unwrap().into_iter().collect();
        assert_eq!(cov[&1], Coverage { seen: 1, first: 1 });
        assert_eq!(cov[&2], Coverage { seen: 0, first: 0 });
        // After expiry a copy counts as new again: the window is the contract.
        let r = s
            .apply(Some(&observe(1_601, 500, vec![obs(1, 2, "a")])), 5, b"5")
            .unwrap();
        assert_eq!(r, Response::Observed(vec![Outcome::FirstSeen { seq: 4 }]));
    }

    #[test]
    fn published_trims_the_outbox_and_never_goes_back() {
        let s = store();
        s.apply(
            Some(&observe(
                1,
                60_000,
                (1..=5).map(|k| obs(k, 1, "a")).collect(),
            )),
            1,
            b"1",
        )
        .unwrap();
        let r = s
            .apply(
                Some(&Command::Published {
                    pulsar_topic: "a".into(),
                    seq: 3,
                }),
                2,
                b"2",
            )
            .unwrap();
        assert_eq!(r, Response::Published { watermark: 3 });
        let left: Vec<u64> = s
            .outbox_from("a", 0, 10)
            .unwrap()
            .iter()
            .map(|(q, _)| *q)
            .collect();
        assert_eq!(left, vec![4, 5]);
        let r = s
            .apply(
                Some(&Command::Published {
                    pulsar_topic: "a".into(),
                    seq: 2,
                }),
                3,
                b"3",
            )
            .unwrap();
        assert_eq!(r, Response::Published { watermark: 3 });
        // A receipt beyond the last assigned sequence is clamped.
        s.apply(
            Some(&Command::Published {
                pulsar_topic: "a".into(),
                seq: 99,
            }),
            4,
            b"4",
        )
        .unwrap();
        assert_eq!(s.topic_state("a").unwrap().published_seq, 5);
        let t = s.totals().unwrap();
        assert_eq!((t.outbox_messages, t.outbox_bytes), (0, 0));
    }

    fn kinded(stamped_ms: u64, copies: Vec<(crate::Observation, KindOf)>) -> Command {
        let kinds = copies.iter().map(|(_, k)| *k).collect();
        Command::ObserveKinds {
            stamped_ms,
            window: crate::Window::from_ms(60_000),
            observations: copies.into_iter().map(|(o, _)| o).collect(),
            properties: Vec::new(),
            slim: Vec::new(),
            kinds,
        }
    }

    type KindOf = crate::KeyKind;

    fn outcomes(s: &crate::StateStore, cmd: &Command, at: u64) -> Vec<Outcome> {
        match s.apply(Some(cmd), at, &at.to_be_bytes()).unwrap() {
            Response::Observed(o) => o,
            other => panic!("{other:?}"),
        }
    }

    fn first(o: &Outcome) -> bool {
        matches!(o, Outcome::FirstSeen { .. })
    }

    #[test]
    fn the_level_rises_never_falls_and_refuses_what_this_release_does_not_know() {
        let s = store();
        assert_eq!(s.level(), 1);
        s.apply(Some(&Command::Level { level: 2 }), 1, b"1")
            .unwrap();
        assert_eq!(s.level(), 2);
        s.apply(Some(&Command::Level { level: 1 }), 2, b"2")
            .unwrap();
        assert_eq!(s.level(), 2, "never goes back");
        let unknown = crate::level::SUPPORTED + 1;
        let e = s
            .apply(Some(&Command::Level { level: unknown }), 3, b"3")
            .unwrap_err();
        assert!(e.to_string().contains(&format!("level {unknown}")), "{e}");
        assert_eq!(s.applied_marker().unwrap().as_deref(), Some(&b"2"[..]));
    }

    /// A recovery's generation is applied, never goes back, survives a
    /// restart and travels in the snapshot (a member added to a recovered
    /// cluster learns it so).
    #[test]
    fn the_generation_is_kept_across_a_restart_and_a_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = super::super::testing::reopenable(dir.path());
            let s = crate::StateStore::open(&db).unwrap();
            assert_eq!(s.generation(), 0);
            s.apply(Some(&Command::Generation { generation: 2 }), 1, b"1")
                .unwrap();
            s.apply(Some(&Command::Generation { generation: 1 }), 2, b"2")
                .unwrap();
            assert_eq!(s.generation(), 2, "never goes back");
            s.flush().unwrap();
        }
        let db = super::super::testing::reopenable(dir.path());
        let s = crate::StateStore::open(&db).unwrap();
        assert_eq!(s.generation(), 2);
        let mut buf = Vec::new();
        s.export(&mut buf, &mut |_| unreachable!("no outbox"))
            .unwrap();
        let b = store();
        b.import(&mut buf.as_slice()).unwrap();
        assert_eq!(b.generation(), 2);
    }

    /// The collisions a route's sender could craft: a `payload` key equal
    /// to another route's `topic+payload` key, and one key on two topics.
    /// At level 1 the later copy was a duplicate, acked and never
    /// published; at level 2 each is first seen in its own topic and kind.
    #[test]
    fn at_level_two_a_key_is_first_seen_per_topic_and_kind() {
        use crate::KeyKind::{Payload, TopicPayload};
        let collide = vec![
            (obs(1, 1, "t"), TopicPayload),
            (obs(1, 1, "t"), Payload),
            (obs(1, 1, "u"), TopicPayload),
            (obs(1, 2, "t"), TopicPayload),
        ];
        let at_one = store();
        let plain = observe(
            1_000,
            60_000,
            collide.iter().map(|(o, _)| o.clone()).collect(),
        );
        let o = outcomes(&at_one, &plain, 1);
        assert_eq!(o.iter().filter(|o| first(o)).count(), 1, "level 1: {o:?}");

        let s = store();
        s.apply(Some(&Command::Level { level: 2 }), 1, b"1")
            .unwrap();
        let o = outcomes(&s, &kinded(1_000, collide), 2);
        assert_eq!(
            o.iter().map(first).collect::<Vec<_>>(),
            vec![true, true, true, false],
            "{o:?}"
        );
        assert_eq!(s.topic_state("t").unwrap().last_seq, 2);
        assert_eq!(s.topic_state("u").unwrap().last_seq, 1);
        assert!(s
            .lookup_copy("u", TopicPayload, &[1; 32])
            .unwrap()
            .is_some());
        assert!(s
            .lookup_copy("v", TopicPayload, &[1; 32])
            .unwrap()
            .is_none());
    }

    /// A message first seen before the level rose is still a duplicate after
    /// it, whatever kind its later copies carry; so is one whose first copy
    /// came with an unknown kind (a batch formed before its node saw the
    /// level rise), and the other way round.
    #[test]
    fn copies_on_either_side_of_the_level_rising_are_one_message() {
        use crate::KeyKind::{TopicPayload, Unknown};
        let s = store();
        assert!(first(
            &outcomes(&s, &observe(1_000, 60_000, vec![obs(1, 1, "t")]), 1)[0]
        ));
        s.apply(Some(&Command::Level { level: 2 }), 2, b"2")
            .unwrap();
        let o = outcomes(
            &s,
            &kinded(
                2_000,
                vec![
                    (obs(1, 2, "t"), TopicPayload),
                    (obs(2, 1, "t"), Unknown),
                    (obs(3, 1, "t"), TopicPayload),
                ],
            ),
            3,
        );
        assert!(!first(&o[0]), "first seen before the level rose: {o:?}");
        assert!(first(&o[1]) && first(&o[2]), "{o:?}");
        let o = outcomes(
            &s,
            &kinded(
                3_000,
                vec![(obs(2, 2, "t"), TopicPayload), (obs(3, 3, "t"), Unknown)],
            ),
            4,
        );
        assert_eq!(o.iter().filter(|o| first(o)).count(), 0, "{o:?}");
        // An entry written at level 1 after the level rose (stamped before
        // its leader applied the change): copies of unknown kind.
        let o = outcomes(&s, &observe(4_000, 60_000, vec![obs(3, 2, "t")]), 5);
        assert!(!first(&o[0]), "{o:?}");
        assert_eq!(s.topic_state("t").unwrap().last_seq, 3);
    }

    #[test]
    fn the_level_survives_a_restart_and_a_newer_one_is_not_opened() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = super::super::testing::reopenable(dir.path());
            let s = crate::StateStore::open(&db).unwrap();
            s.apply(Some(&Command::Level { level: 2 }), 1, b"1")
                .unwrap();
            s.flush().unwrap();
        }
        {
            let db = super::super::testing::reopenable(dir.path());
            let s = crate::StateStore::open(&db).unwrap();
            assert_eq!(s.level(), 2);
            // As a later release would leave it.
            let later = crate::level::Levels {
                level: crate::level::SUPPORTED + 1,
                bare_below: 0,
            };
            db.open_tree("sm_meta")
                .unwrap()
                .insert(b"level", bincode::serialize(&later).unwrap())
                .unwrap();
            db.flush().unwrap();
        }
        let db = super::super::testing::reopenable(dir.path());
        let e = crate::StateStore::open(&db).unwrap_err();
        let later = crate::level::SUPPORTED + 1;
        assert!(
            e.to_string()
                .contains(&format!("the cluster runs at level {later}")),
            "{e}"
        );
    }
}
