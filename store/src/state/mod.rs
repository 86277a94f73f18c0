//! The state machine: applied in memory, written to sled in checkpoints.
//!
//! Trees (byte layouts in [`crate::record`]):
//! - `window`: record id → the keys first seen in one entry, with their
//!   node and sequence; ids grow with the window clock, so expiry deletes
//!   whole records from the front
//! - `masks`:  record id → which nodes delivered each of its keys, when
//!   more than the first
//! - `runs`:   (pulsar topic, first seq) → where one entry's first-seen
//!   messages of that topic are in the Raft log, until published
//! - `inline`: (pulsar topic, seq) → [`OutboxMessage`], for unpublished
//!   messages that arrived in a snapshot rather than in the log
//! - `meta`:   the head: totals, coverage, topics, node bits, expiry
//!   position and the caller's applied marker; and the cluster level
//! - `set_aside`: id → a message sent to Pulsar as a marker, kept whole
//!   (`aside.rs`)
//!
//! **Why checkpoints.** sled 0.34 never moves a live page to reclaim a
//! segment, so its disk holds everything written during one window, not
//! just what is live. A sled transaction per entry wrote the head, coverage
//! and topics again for every entry of a few keys: 400 B and more per key
//! on disk. Now an entry is applied to memory (the key [`Index`] and the
//! head), and [`StateStore::checkpoint`] writes what changed since the last
//! one in one transaction: each key once, in a packed record, and the head
//! once. Messages published before a checkpoint never reach the state's disk.
//!
//! Durability is unchanged. The per-entry transactions were atomic but were
//! flushed only every second; after a crash the state came back at some
//! applied marker and openraft re-applied the log from there. A checkpoint
//! is atomic in the same way and carries its applied marker, so recovery is
//! the same. The log store checkpoints and flushes before it purges or
//! deletes entries, so the log always holds what a recovered state needs.
//!

mod applied;
mod apply;
mod aside;
mod checkpoint;
mod memory;
mod names;
mod query;
mod rebase;
mod snapshot;
#[cfg(test)]
mod testing;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::disk::{Db, Disk};
use crate::index::{Index, Slot};
use crate::record;
use crate::StoreError;
use crate::{Command, Response};
use memory::{Head, Memory};

pub use aside::{Kept, KeptEntry};
pub use snapshot::ResolveEntry;

const META_HEAD: &[u8] = b"head";
/// The cluster level ([`crate::level::Levels`]), once it rose above the base.
const META_LEVEL: &[u8] = b"level";
/// The cluster's generation (a `u64`), once a recovery started one.
const META_GENERATION: &[u8] = b"generation";
/// Where window records may still hold a topic's other spellings
/// (`Memory::names_below`), once the level rose to 3.
const META_NAMES: &[u8] = b"names";
/// Where window records may hold sequences a renumbering changed
/// (`Memory::renumbered_below`), once a rebase or a merge made one.
const META_RENUMBERED: &[u8] = b"renumbered";
/// Present while a snapshot is being imported (see `import_with_progress`).
const META_IMPORTING: &[u8] = b"importing";
/// The state's sled trees. Snapshot tags are positions in this list.
const TREES: [&str; 6] = [
    "sm_window",
    "sm_masks",
    "sm_runs",
    "sm_inline",
    "sm_meta",
    "sm_set_aside",
];

/// No log entry is held for the outbox.
pub const NO_HOLD: u64 = u64::MAX;

/// The replicated dedup state of one node.
#[derive(Clone)]
pub struct StateStore {
    /// The state's database; its durability goes through [`crate::disk`].
    db: Db,
    window: sled::Tree,
    masks: sled::Tree,
    runs: sled::Tree,
    inline: sled::Tree,
    meta: sled::Tree,
    /// Empty until the cluster level is 2 (an older release's snapshot
    /// import would not know its tag).
    aside: sled::Tree,
    inner: Arc<Mutex<Memory>>,
    /// When each entry's messages were applied (a measurement only).
    applied_at: Arc<Mutex<applied::AppliedAt>>,
    /// Synced before every checkpoint: the Raft log's database.
    log_db: Option<Db>,
    /// The applied level, for readers that must not hold the state open.
    level_cell: crate::level::LevelCell,
}

impl std::fmt::Debug for StateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateStore").finish_non_exhaustive()
    }
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, StoreError> {
    Ok(bincode::serialize(value)?)
}

fn decode<T: DeserializeOwned>(raw: &[u8]) -> Result<T, StoreError> {
    Ok(bincode::deserialize(raw)?)
}

fn corrupt(what: &str) -> StoreError {
    StoreError::Corrupt(what.to_string())
}

impl StateStore {
    /// Opens (or creates) the state in a bare sled database and loads it into
    /// memory. For tests and tools; a node opens it on its [`Disk`] with
    /// [`StateStore::open_on`].
    pub fn open(db: &sled::Db) -> Result<Self, StoreError> {
        Self::open_with_log(&Db::wrap("state", db.clone()), None)
    }

    /// Opens the state of a node: in `disk.state`, with entries that come
    /// from `disk.log`.
    pub fn open_on(disk: &Disk) -> Result<Self, StoreError> {
        Self::open_with_log(&disk.state, Some(disk.log.clone()))
    }

    /// [`StateStore::open`] for a state whose entries come from a log in
    /// `log_db`, which is synced before every checkpoint.
    ///
    /// A follower may apply an entry before its own copy of it is synced
    /// (the leader and another follower made it committed). A checkpoint
    /// written then, and a power cut, would leave a state referring to an
    /// entry the log lost: the outbox reads payloads from the log. Syncing
    /// the log first means every entry a checkpoint covers is stable before
    /// the checkpoint can be.
    pub fn open_with_log(db: &Db, log_db: Option<Db>) -> Result<Self, StoreError> {
        let sled = db.sled();
        let store = Self {
            db: db.clone(),
            window: sled.open_tree(TREES[0])?,
            masks: sled.open_tree(TREES[1])?,
            runs: sled.open_tree(TREES[2])?,
            inline: sled.open_tree(TREES[3])?,
            meta: sled.open_tree(TREES[4])?,
            aside: sled.open_tree(TREES[5])?,
            inner: Arc::default(),
            applied_at: Arc::default(),
            log_db,
            level_cell: Default::default(),
        };
        store.reload()?;
        Ok(store)
    }

    fn lock(&self) -> MutexGuard<'_, Memory> {
        // Every change is made after the fallible reads it needs, so a panic
        // cannot leave a half-applied entry behind.
        crate::lock::lock(&self.inner)
    }

    /// Replaces the memory state with what sled holds: the last checkpoint.
    fn reload(&self) -> Result<(), StoreError> {
        if self.meta.contains_key(META_IMPORTING)? {
            return Err(corrupt(
                "a snapshot import was cut short: the state holds part of it",
            ));
        }
        let head: Head = match self.meta.get(META_HEAD)? {
            Some(raw) => decode(&raw)?,
            None => Head::default(),
        };
        let levels: crate::level::Levels = match self.meta.get(META_LEVEL)? {
            Some(raw) => decode(&raw)?,
            None => Default::default(),
        };
        let names_below: u64 = match self.meta.get(META_NAMES)? {
            Some(raw) => decode(&raw)?,
            None => 0,
        };
        let renumbered_below: u64 = match self.meta.get(META_RENUMBERED)? {
            Some(raw) => decode(&raw)?,
            None => 0,
        };
        let generation: u64 = match self.meta.get(META_GENERATION)? {
            Some(raw) => decode(&raw)?,
            None => 0,
        };
        // A state of a level this release does not know is not opened: its
        // log holds entries it cannot apply.
        crate::level::check(levels.level)?;
        let mut index = Index::default();
        let mut written_from = None;
        for item in self.window.range(record::record_key(head.expired_below)..) {
            let (k, v) = item?;
            let rec = record::parse_record_key(&k).ok_or_else(|| corrupt("window record id"))?;
            // One checkpoint writes the records and the head in one sled
            // transaction, so a record the head does not count cannot come
            // from a sound file. The soak found one after every node lost
            // power: sled kept a newer record and an older head, and the next
            // apply of a copy of that record's key panicked on every start.
            // Refused here as corrupt, the state is rebuilt from the snapshot
            // and the log instead.
            if rec >= head.totals.records {
                return Err(corrupt(&format!(
                    "window record {rec}, but the head counts {} records: the head and the window are from different checkpoints",
                    head.totals.records
                )));
            }
            written_from.get_or_insert(rec);
            let (_, items) = record::decode_record(&v).ok_or_else(|| corrupt("window record"))?;
            let masks = match self.masks.get(&k)? {
                Some(raw) => record::decode_masks(&raw).ok_or_else(|| corrupt("masks record"))?,
                None => Vec::new(),
            };
            for (i, it) in items.iter().enumerate() {
                let extra = masks.get(i).copied().unwrap_or(0);
                index.insert(
                    it.key,
                    Slot {
                        rec,
                        seq: it.seq,
                        mask: record::first_mask(it.node_bit) | extra,
                        item: i as u32,
                        node_bit: it.node_bit,
                    },
                );
            }
        }
        let mut runs = BTreeMap::new();
        for item in self.runs.iter() {
            let (k, v) = item?;
            runs.insert(
                k.to_vec(),
                record::decode_run(&v).ok_or_else(|| corrupt("outbox run"))?,
            );
        }
        let mut inner = Memory {
            written_from: written_from.unwrap_or(head.expired_below),
            head,
            levels,
            names_below,
            renumbered_below,
            generation,
            aside: aside::Aside::load(&self.aside)?,
            index,
            runs,
            ..Memory::default()
        };
        inner.durable_hold = inner.hold();
        self.level_cell.set(inner.levels.level);
        *self.lock() = inner;
        Ok(())
    }

    /// Lowest log index an unpublished message is read from, or [`NO_HOLD`].
    pub fn log_hold(&self) -> u64 {
        self.lock().hold()
    }

    /// [`StateStore::log_hold`] as of the last checkpoint. Once that
    /// checkpoint is flushed, the log may delete every entry below it.
    pub fn durable_hold(&self) -> u64 {
        self.lock().durable_hold
    }

    /// Applies log entry `log_index`. `applied` is an opaque marker the
    /// caller (the Raft adapter) gets back from [`StateStore::applied_marker`]
    /// after a restart; it is written in the same checkpoint as the state it
    /// describes, so the two can never disagree after a crash.
    pub fn apply(
        &self,
        cmd: Option<&Command>,
        log_index: u64,
        applied: &[u8],
    ) -> Result<Response, StoreError> {
        let mut memory = self.lock();
        let response = memory.apply(self, cmd, log_index, applied)?;
        self.level_cell.set(memory.levels.level);
        // Noted on every node, though only the leader reads it: a follower
        // elected leader then measures the backlog it takes over too.
        if let Some(observations) = cmd.and_then(Command::observations) {
            let now = Instant::now();
            let mut at = crate::lock::lock(&self.applied_at);
            let mut last: Option<&str> = None;
            for o in observations {
                // Usually one topic per entry: look each up once per run.
                if last == Some(o.pulsar_topic.as_str()) {
                    continue;
                }
                last = Some(o.pulsar_topic.as_str());
                if let Some(t) = memory.head.topics.get(&o.pulsar_topic) {
                    at.note(&o.pulsar_topic, t.last_seq, now);
                }
            }
        }
        if memory.checkpoint_due(Instant::now()) {
            self.checkpoint_locked(&mut memory)?;
        }
        Ok(response)
    }

    /// When the entry that assigned `seq` of `topic` was applied here, if
    /// this process applied it and still remembers (about the last 4,096
    /// entries per topic). For the `publish` stage's measurement only.
    pub fn applied_at(&self, topic: &str, seq: u64) -> Option<Instant> {
        crate::lock::lock(&self.applied_at).find(topic, seq)
    }

    /// The state database's directory, for errors that name its files.
    pub fn dir(&self) -> Option<&std::path::Path> {
        self.db.dir()
    }

    /// Bytes sled uses on disk for this database (the Raft log has its own).
    pub fn size_on_disk(&self) -> Result<u64, StoreError> {
        self.db.size_on_disk()
    }

    /// Writes a checkpoint and makes it durable. Blocking (a sync of each
    /// database): call it from a blocking thread.
    pub fn flush(&self) -> Result<(), StoreError> {
        self.checkpoint()?;
        self.db.sync()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::testing::{obs, observe, reopenable};
    use super::{StateStore, META_HEAD};
    use crate::StoreError;
    use crate::{Coverage, Outcome, Response};

    #[test]
    fn a_reopened_store_rebuilds_its_index_and_coverage() {
        let dir = tempfile::tempdir().unwrap();
        let open = || reopenable(dir.path());
        {
            let db = open();
            let s = StateStore::open(&db).unwrap();
            s.apply(Some(&observe(1_000, 500, vec![obs(1, 1, "a")])), 1, b"1")
                .unwrap();
            s.apply(
                Some(&observe(1_100, 500, vec![obs(1, 2, "a"), obs(2, 2, "a")])),
                2,
                b"2",
            )
            .unwrap();
            s.checkpoint().unwrap();
            db.flush().unwrap();
        }
        let db = open();
        let s = StateStore::open(&db).unwrap();
        assert_eq!(s.indexed_keys(), 2);
        let first = s.lookup(&[1; 32]).unwrap().unwrap();
        assert_eq!((first.seq, first.node, first.seen_by), (1, 1, vec![1, 2]));
        // Still a duplicate after the restart, and node 3 counts once.
        let r = s
            .apply(
                Some(&observe(1_200, 500, vec![obs(1, 3, "a"), obs(1, 3, "a")])),
                3,
                b"3",
            )
            .unwrap();
        assert_eq!(
            r,
            Response::Observed(vec![
                Outcome::Duplicate {
                    seq: 1,
                    first_node: 1
                };
                2
            ])
        );
        // Key 1 expires with all three nodes' coverage; key 2 stays.
        s.apply(Some(&observe(1_550, 500, vec![])), 4, b"4")
            .unwrap();
        let cov: BTreeMap<_, _> = s.coverage().unwrap().into_iter().collect();
        assert_eq!(cov[&1], Coverage { seen: 0, first: 0 });
        assert_eq!(cov[&2], Coverage { seen: 1, first: 1 });
        assert_eq!(cov[&3], Coverage { seen: 0, first: 0 });
        assert_eq!(s.indexed_keys(), 1);
    }

    /// A head older than the window records beside it (sled kept one
    /// checkpoint's records and an older one's head after a power cut, in
    /// the soak) is refused as corrupt at open, so the node rebuilds the
    /// state; it used to open, and applying a copy of the newer record's
    /// key then panicked on every start.
    #[test]
    fn a_head_older_than_the_window_is_refused_as_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let open = || reopenable(dir.path());
        {
            let db = open();
            let s = StateStore::open(&db).unwrap();
            s.apply(Some(&observe(1_000, 60_000, vec![obs(1, 1, "a")])), 1, b"1")
                .unwrap();
            s.checkpoint().unwrap();
            let old_head = s.meta.get(META_HEAD).unwrap().unwrap();
            s.apply(Some(&observe(1_100, 60_000, vec![obs(2, 1, "a")])), 2, b"2")
                .unwrap();
            s.checkpoint().unwrap();
            s.meta.insert(META_HEAD, old_head).unwrap();
            db.flush().unwrap();
        }
        let db = open();
        match StateStore::open(&db) {
            Err(StoreError::Corrupt(why)) => {
                assert!(why.contains("different checkpoints"), "{why}")
            }
            Err(e) => panic!("expected Corrupt, got {e}"),
            Ok(s) => {
                // What the old code went on to do.
                let r = s.apply(Some(&observe(1_200, 60_000, vec![obs(2, 2, "a")])), 3, b"3");
                panic!("opened an inconsistent state; the next apply gave {r:?}");
            }
        }
    }

    /// A snapshot import that stops part-way (the process killed, or the
    /// stream failing) leaves a state that refuses to load, so the node
    /// rebuilds it from its current snapshot. Before the marker, the
    /// cleared meta tree made a half-imported window load as a fresh state
    /// onto which the log was re-applied.
    #[test]
    fn an_import_cut_short_is_refused_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let open = || reopenable(dir.path());
        let mut stream = Vec::new();
        {
            let source = super::testing::store();
            let log: Vec<_> = (1..=20u8)
                .map(|k| observe(1_000, 60_000, vec![obs(k, 1, "a")]))
                .collect();
            for (i, cmd) in log.iter().enumerate() {
                source.apply(Some(cmd), i as u64 + 1, b"m").unwrap();
            }
            source
                .export(
                    &mut stream,
                    &mut |index| Ok(log[index as usize - 1].clone()),
                )
                .unwrap();
        }
        {
            let db = open();
            let s = StateStore::open(&db).unwrap();
            s.apply(
                Some(&observe(1_000, 60_000, vec![obs(99, 1, "a")])),
                1,
                b"1",
            )
            .unwrap();
            s.checkpoint().unwrap();
            // The stream ends in the middle of its records.
            let mut cut = &stream[..stream.len() / 2];
            assert!(s.import(&mut cut).is_err());
            db.flush().unwrap();
        }
        let db = open();
        match StateStore::open(&db) {
            Err(StoreError::Corrupt(why)) => assert!(why.contains("import was cut short"), "{why}"),
            Err(e) => panic!("expected Corrupt, got {e}"),
            Ok(s) => panic!(
                "a half-imported state loaded: {} keys, applied marker {:?}",
                s.indexed_keys(),
                s.applied_marker().unwrap()
            ),
        }
    }
}
