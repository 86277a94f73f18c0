//! The state machine on sled: one sled transaction per applied log entry.
//!
//! Trees:
//! - `seen`:     key → [`FirstSeen`]
//! - `expiry`:   (first-seen time, key) → () — the window index
//! - `outbox`:   (pulsar topic, seq) → [`OutboxMessage`] until published
//! - `topics`:   pulsar topic → [`TopicState`] (sequence and watermark)
//! - `coverage`: node id → [`Coverage`]
//! - `meta`:     totals and the caller's applied marker
//!
//! Apply is single-writer (openraft calls it from one task), so reads made
//! just before a transaction see the same state the transaction will.

use std::collections::BTreeMap;
use std::io::{Read, Write};

use serde::de::DeserializeOwned;
use serde::Serialize;
use sled::transaction::{ConflictableTransactionError, TransactionalTree};
use sled::Transactional;

use crate::model::{
    Command, Coverage, FirstSeen, Key, NodeId, Observation, OutboxMessage, Outcome, Response,
    TopicState, Totals,
};
use crate::window;
use crate::StoreError;

const META_TOTALS: &[u8] = b"totals";
const META_APPLIED: &[u8] = b"applied";
const TREES: [&str; 6] = [
    "sm_seen",
    "sm_expiry",
    "sm_outbox",
    "sm_topics",
    "sm_coverage",
    "sm_meta",
];

type TxResult<T> = Result<T, ConflictableTransactionError<StoreError>>;

/// The replicated dedup state of one node, in its sled database.
#[derive(Clone)]
pub struct StateStore {
    db: sled::Db,
    seen: sled::Tree,
    expiry: sled::Tree,
    outbox: sled::Tree,
    topics: sled::Tree,
    coverage: sled::Tree,
    meta: sled::Tree,
}

impl std::fmt::Debug for StateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateStore").finish_non_exhaustive()
    }
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, StoreError> {
    bincode::serialize(value).map_err(|e| StoreError::Codec(e.to_string()))
}

fn decode<T: DeserializeOwned>(raw: &[u8]) -> Result<T, StoreError> {
    bincode::deserialize(raw).map_err(|e| StoreError::Codec(e.to_string()))
}

fn abort(e: StoreError) -> ConflictableTransactionError<StoreError> {
    ConflictableTransactionError::Abort(e)
}

fn tx_get<T: DeserializeOwned>(tree: &TransactionalTree, key: &[u8]) -> TxResult<Option<T>> {
    match tree.get(key)? {
        Some(raw) => Ok(Some(decode(&raw).map_err(abort)?)),
        None => Ok(None),
    }
}

fn tx_put<T: Serialize>(tree: &TransactionalTree, key: &[u8], value: &T) -> TxResult<()> {
    tree.insert(key, encode(value).map_err(abort)?)?;
    Ok(())
}

impl StateStore {
    /// Opens (or creates) the state machine trees in `db`.
    pub fn open(db: &sled::Db) -> Result<Self, StoreError> {
        Ok(Self {
            db: db.clone(),
            seen: db.open_tree(TREES[0])?,
            expiry: db.open_tree(TREES[1])?,
            outbox: db.open_tree(TREES[2])?,
            topics: db.open_tree(TREES[3])?,
            coverage: db.open_tree(TREES[4])?,
            meta: db.open_tree(TREES[5])?,
        })
    }

    /// Applies one log entry atomically. `applied` is an opaque marker the
    /// caller (the Raft adapter) stores in the same transaction, so that the
    /// state and "how far it got" can never disagree after a crash.
    pub fn apply(&self, cmd: Option<&Command>, applied: &[u8]) -> Result<Response, StoreError> {
        match cmd {
            None => {
                self.meta.insert(META_APPLIED, applied)?;
                Ok(Response::None)
            }
            Some(Command::Observe {
                stamped_ms,
                window_ms,
                observations,
            }) => self.apply_observe(*stamped_ms, *window_ms, observations, applied),
            Some(Command::Published { pulsar_topic, seq }) => {
                self.apply_published(pulsar_topic, *seq, applied)
            }
        }
    }

    fn apply_observe(
        &self,
        stamped_ms: u64,
        window_ms: u64,
        observations: &[Observation],
        applied: &[u8],
    ) -> Result<Response, StoreError> {
        let before = self.totals()?;
        let clock = window::advance_clock(before.clock_ms, stamped_ms);
        let cutoff = window::expiry_cutoff(clock, window_ms);
        // Range scans are not available inside a sled transaction; with a
        // single writer, scanning just before it is equivalent.
        let mut expired = Vec::new();
        for item in self.expiry.range(..window::expiry_key(cutoff, &[0; 32])) {
            let (raw, _) = item?;
            let parsed = window::parse_expiry_key(&raw)
                .ok_or_else(|| StoreError::Corrupt("expiry index key of wrong length".into()))?;
            expired.push(parsed);
            if expired.len() >= window::MAX_EXPIRE_PER_ENTRY {
                break;
            }
        }

        let trees = (
            &self.seen,
            &self.expiry,
            &self.outbox,
            &self.topics,
            &self.coverage,
            &self.meta,
        );
        let result = trees.transaction(|(seen, expiry, outbox, topics, coverage, meta)| {
            let mut totals = before;
            totals.clock_ms = clock;
            let mut cov: BTreeMap<NodeId, Coverage> = BTreeMap::new();
            let load_cov = |node: NodeId, cov: &mut BTreeMap<NodeId, Coverage>| -> TxResult<()> {
                if let std::collections::btree_map::Entry::Vacant(slot) = cov.entry(node) {
                    slot.insert(tx_get(coverage, &node.to_be_bytes())?.unwrap_or_default());
                }
                Ok(())
            };

            for (ts, key) in &expired {
                expiry.remove(&window::expiry_key(*ts, key)[..])?;
                let Some(record) = tx_get::<FirstSeen>(seen, key)? else {
                    continue;
                };
                if record.ts_ms != *ts {
                    continue;
                }
                seen.remove(&key[..])?;
                for node in &record.seen_by {
                    load_cov(*node, &mut cov)?;
                    let c = cov.get_mut(node).expect("loaded above");
                    c.seen = c.seen.saturating_sub(1);
                }
                load_cov(record.node, &mut cov)?;
                let c = cov.get_mut(&record.node).expect("loaded above");
                c.first = c.first.saturating_sub(1);
                totals.window_keys = totals.window_keys.saturating_sub(1);
                totals.expired += 1;
            }

            let mut topic_cache: BTreeMap<&str, TopicState> = BTreeMap::new();
            let mut outcomes = Vec::with_capacity(observations.len());
            for obs in observations {
                totals.observed += 1;
                load_cov(obs.node, &mut cov)?;
                if let Some(mut record) = tx_get::<FirstSeen>(seen, &obs.key)? {
                    totals.duplicates += 1;
                    if !record.seen_by.contains(&obs.node) {
                        record.seen_by.push(obs.node);
                        tx_put(seen, &obs.key, &record)?;
                        cov.get_mut(&obs.node).expect("loaded above").seen += 1;
                    }
                    outcomes.push(Outcome::Duplicate {
                        seq: record.seq,
                        first_node: record.node,
                    });
                    continue;
                }
                let state = match topic_cache.get_mut(obs.pulsar_topic.as_str()) {
                    Some(s) => s,
                    None => {
                        let loaded =
                            tx_get(topics, obs.pulsar_topic.as_bytes())?.unwrap_or_default();
                        topic_cache
                            .entry(obs.pulsar_topic.as_str())
                            .or_insert(loaded)
                    }
                };
                state.last_seq += 1;
                let seq = state.last_seq;
                let record = FirstSeen {
                    ts_ms: clock,
                    seq,
                    node: obs.node,
                    seen_by: vec![obs.node],
                };
                tx_put(seen, &obs.key, &record)?;
                expiry.insert(&window::expiry_key(clock, &obs.key)[..], &[][..])?;
                let message = OutboxMessage {
                    key: obs.key,
                    mqtt_topic: obs.mqtt_topic.clone(),
                    payload: obs.payload.clone(),
                    node: obs.node,
                    first_seen_ms: clock,
                };
                tx_put(
                    outbox,
                    &window::outbox_key(&obs.pulsar_topic, seq),
                    &message,
                )?;
                totals.outbox_messages += 1;
                totals.outbox_bytes += window::outbox_charge(&obs.mqtt_topic, &obs.payload);
                totals.window_keys += 1;
                let c = cov.get_mut(&obs.node).expect("loaded above");
                c.seen += 1;
                c.first += 1;
                outcomes.push(Outcome::FirstSeen { seq });
            }

            for (topic, state) in &topic_cache {
                tx_put(topics, topic.as_bytes(), state)?;
            }
            for (node, c) in &cov {
                tx_put(coverage, &node.to_be_bytes(), c)?;
            }
            tx_put(meta, META_TOTALS, &totals)?;
            meta.insert(META_APPLIED, applied)?;
            Ok(Response::Observed(outcomes))
        });
        result.map_err(StoreError::from)
    }

    fn apply_published(
        &self,
        topic: &str,
        seq: u64,
        applied: &[u8],
    ) -> Result<Response, StoreError> {
        let before = self.totals()?;
        let state: TopicState = match self.topics.get(topic.as_bytes())? {
            Some(raw) => decode(&raw)?,
            None => TopicState::default(),
        };
        // A receipt can never cover more than was assigned.
        let upto = seq.min(state.last_seq);
        let mut trimmed = Vec::new();
        if upto > state.published_seq {
            let range = window::outbox_key(topic, state.published_seq + 1)
                ..=window::outbox_key(topic, upto);
            for item in self.outbox.range(range) {
                let (k, v) = item?;
                let m: OutboxMessage = decode(&v)?;
                trimmed.push((k, window::outbox_charge(&m.mqtt_topic, &m.payload)));
            }
        }
        let trees = (&self.outbox, &self.topics, &self.meta);
        let result = trees.transaction(|(outbox, topics, meta)| {
            let mut totals = before;
            let mut state = state;
            for (k, charge) in &trimmed {
                outbox.remove(k)?;
                totals.outbox_messages = totals.outbox_messages.saturating_sub(1);
                totals.outbox_bytes = totals.outbox_bytes.saturating_sub(*charge);
            }
            state.published_seq = state.published_seq.max(upto);
            tx_put(topics, topic.as_bytes(), &state)?;
            tx_put(meta, META_TOTALS, &totals)?;
            meta.insert(META_APPLIED, applied)?;
            Ok(Response::Published {
                watermark: state.published_seq,
            })
        });
        result.map_err(StoreError::from)
    }

    /// The marker stored with the last applied entry, if any.
    pub fn applied_marker(&self) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.meta.get(META_APPLIED)?.map(|v| v.to_vec()))
    }

    /// Totals over the whole state.
    pub fn totals(&self) -> Result<Totals, StoreError> {
        match self.meta.get(META_TOTALS)? {
            Some(raw) => decode(&raw),
            None => Ok(Totals::default()),
        }
    }

    /// Sequence and watermark of one Pulsar topic.
    pub fn topic_state(&self, topic: &str) -> Result<TopicState, StoreError> {
        match self.topics.get(topic.as_bytes())? {
            Some(raw) => decode(&raw),
            None => Ok(TopicState::default()),
        }
    }

    /// Every Pulsar topic the state machine has assigned sequences on.
    pub fn topics(&self) -> Result<Vec<(String, TopicState)>, StoreError> {
        let mut out = Vec::new();
        for item in self.topics.iter() {
            let (k, v) = item?;
            let name = String::from_utf8(k.to_vec())
                .map_err(|_| StoreError::Corrupt("topic name is not UTF-8".into()))?;
            out.push((name, decode(&v)?));
        }
        Ok(out)
    }

    /// Up to `limit` outbox messages of `topic`, from sequence `from` on, in order.
    pub fn outbox_from(
        &self,
        topic: &str,
        from: u64,
        limit: usize,
    ) -> Result<Vec<(u64, OutboxMessage)>, StoreError> {
        let range = window::outbox_key(topic, from)..=window::outbox_key(topic, u64::MAX);
        let mut out = Vec::new();
        for item in self.outbox.range(range).take(limit) {
            let (k, v) = item?;
            let seq = window::outbox_seq(&k)
                .ok_or_else(|| StoreError::Corrupt("outbox key too short".into()))?;
            out.push((seq, decode(&v)?));
        }
        Ok(out)
    }

    /// Coverage of every node that has delivered anything in the window.
    pub fn coverage(&self) -> Result<Vec<(NodeId, Coverage)>, StoreError> {
        let mut out = Vec::new();
        for item in self.coverage.iter() {
            let (k, v) = item?;
            let id = u64::from_be_bytes(
                k.as_ref()
                    .try_into()
                    .map_err(|_| StoreError::Corrupt("coverage key of wrong length".into()))?,
            );
            out.push((id, decode(&v)?));
        }
        Ok(out)
    }

    /// The first-seen record of a key, if it is in the window.
    pub fn lookup(&self, key: &Key) -> Result<Option<FirstSeen>, StoreError> {
        match self.seen.get(key)? {
            Some(raw) => Ok(Some(decode(&raw)?)),
            None => Ok(None),
        }
    }

    /// Bytes sled uses on disk for this database (the Raft log has its own).
    pub fn size_on_disk(&self) -> Result<u64, StoreError> {
        Ok(self.db.size_on_disk()?)
    }

    /// Makes everything applied so far durable.
    pub async fn flush(&self) -> Result<(), StoreError> {
        self.db.flush_async().await?;
        Ok(())
    }

    /// Streams the whole state into `out` as length-prefixed records, tree by
    /// tree, without building it in memory. The format is private to firstseen
    /// and read back by [`StateStore::import`].
    pub fn export<W: Write>(&self, out: &mut W) -> Result<u64, StoreError> {
        let mut records = 0u64;
        for (index, tree) in self.trees().iter().enumerate() {
            for item in tree.iter() {
                let (k, v) = item?;
                write_record(out, index as u8, &k, &v)?;
                records += 1;
            }
        }
        // A terminator distinguishes a complete snapshot from a truncated one.
        out.write_all(&[0xff])?;
        Ok(records)
    }

    /// Replaces the whole state with a stream written by [`StateStore::export`].
    pub fn import<R: Read>(&self, input: &mut R) -> Result<u64, StoreError> {
        self.import_with_progress(input, |_| {})
    }

    /// [`StateStore::import`], calling `progress` with the record count every
    /// 100,000 records (a snapshot of a busy window has millions).
    pub fn import_with_progress<R: Read>(
        &self,
        input: &mut R,
        mut progress: impl FnMut(u64),
    ) -> Result<u64, StoreError> {
        for tree in self.trees() {
            tree.clear()?;
        }
        let trees = self.trees();
        let mut records = 0u64;
        loop {
            let mut tag = [0u8; 1];
            input.read_exact(&mut tag)?;
            if tag[0] == 0xff {
                break;
            }
            let tree = trees.get(tag[0] as usize).ok_or_else(|| {
                StoreError::Corrupt(format!("snapshot names unknown tree {}", tag[0]))
            })?;
            let k = read_chunk(input)?;
            let v = read_chunk(input)?;
            tree.insert(k, v)?;
            records += 1;
            if records % 100_000 == 0 {
                progress(records);
            }
        }
        Ok(records)
    }

    fn trees(&self) -> [&sled::Tree; 6] {
        [
            &self.seen,
            &self.expiry,
            &self.outbox,
            &self.topics,
            &self.coverage,
            &self.meta,
        ]
    }
}

fn write_record<W: Write>(out: &mut W, tag: u8, k: &[u8], v: &[u8]) -> Result<(), StoreError> {
    out.write_all(&[tag])?;
    out.write_all(&(k.len() as u32).to_be_bytes())?;
    out.write_all(k)?;
    out.write_all(&(v.len() as u32).to_be_bytes())?;
    out.write_all(v)?;
    Ok(())
}

fn read_chunk<R: Read>(input: &mut R) -> Result<Vec<u8>, StoreError> {
    let mut len = [0u8; 4];
    input.read_exact(&mut len)?;
    let len = u32::from_be_bytes(len) as usize;
    // Keys and values are small; a huge length means a corrupt stream, not a
    // reason to allocate gigabytes.
    if len > 64 * 1024 * 1024 {
        return Err(StoreError::Corrupt(format!(
            "snapshot record of {len} bytes"
        )));
    }
    let mut buf = vec![0u8; len];
    input.read_exact(&mut buf)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> StateStore {
        let db = sled::Config::new().temporary(true).open().unwrap();
        StateStore::open(&db).unwrap()
    }

    fn obs(key: u8, node: NodeId, topic: &str) -> Observation {
        Observation {
            key: [key; 32],
            mqtt_topic: format!("/hfp/{key}"),
            pulsar_topic: topic.into(),
            payload: vec![key; 10],
            qos: 1,
            retain: false,
            node,
            received_ms: 0,
        }
    }

    fn observe(stamped_ms: u64, window_ms: u64, observations: Vec<Observation>) -> Command {
        Command::Observe {
            stamped_ms,
            window_ms,
            observations,
        }
    }

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
            b"1",
        )
        .unwrap();
        s.apply(Some(&observe(1_200, 500, vec![obs(3, 1, "a")])), b"2")
            .unwrap();
        // A leader with a clock behind the last stamp cannot move the window back.
        s.apply(Some(&observe(900, 500, vec![])), b"3").unwrap();
        assert!(s.lookup(&[1; 32]).unwrap().is_some());
        // At 1,600 the window starts at 1,100: keys 1 and 2 go, 3 stays.
        s.apply(Some(&observe(1_600, 500, vec![])), b"4").unwrap();
        assert!(s.lookup(&[1; 32]).unwrap().is_none());
        assert!(s.lookup(&[3; 32]).unwrap().is_some());
        let t = s.totals().unwrap();
        assert_eq!((t.window_keys, t.expired, t.clock_ms), (1, 2, 1_600));
        let cov: BTreeMap<_, _> = s.coverage().unwrap().into_iter().collect();
        assert_eq!(cov[&1], Coverage { seen: 1, first: 1 });
        assert_eq!(cov[&2], Coverage { seen: 0, first: 0 });
        // After expiry a copy counts as new again: the window is the contract.
        let r = s
            .apply(Some(&observe(1_601, 500, vec![obs(1, 2, "a")])), b"5")
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
            b"1",
        )
        .unwrap();
        let r = s
            .apply(
                Some(&Command::Published {
                    pulsar_topic: "a".into(),
                    seq: 3,
                }),
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
            b"4",
        )
        .unwrap();
        assert_eq!(s.topic_state("a").unwrap().published_seq, 5);
        let t = s.totals().unwrap();
        assert_eq!((t.outbox_messages, t.outbox_bytes), (0, 0));
    }

    #[test]
    fn export_and_import_round_trip() {
        let a = store();
        a.apply(
            Some(&observe(1, 60_000, vec![obs(1, 1, "a"), obs(2, 2, "b")])),
            b"7",
        )
        .unwrap();
        let mut buf = Vec::new();
        a.export(&mut buf).unwrap();
        let b = store();
        b.apply(Some(&observe(1, 60_000, vec![obs(9, 1, "z")])), b"1")
            .unwrap();
        b.import(&mut buf.as_slice()).unwrap();
        assert_eq!(b.totals().unwrap(), a.totals().unwrap());
        assert!(b.lookup(&[9; 32]).unwrap().is_none());
        assert_eq!(b.applied_marker().unwrap().as_deref(), Some(&b"7"[..]));
        // A truncated stream is an error, not a silently partial state.
        let mut short = &buf[..buf.len() - 1];
        assert!(b.import(&mut short).is_err());
    }
}
