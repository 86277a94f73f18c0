//! The log keeps every entry the outbox still reads from, whatever the
//! order of applies, receipts, snapshots, purges, reaper passes and
//! restarts: a seeded schedule of them on a node's real storage, checked
//! after every step against a model of the outbox.
//!
//! Until a first copy is published, its payload exists only in its log
//! entry; a reaper that deleted a purged entry the outbox still holds would
//! lose it (the reaper in `raft/src/log_store.rs` keeps them).
//!
//! `HOLD_SEEDS=N` runs N seeds (default 12), `HOLD_SEED=S` runs one.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use firstseen_raft::Storage;
use firstseen_raft::{Entry, LogId};
use firstseen_store::{Command, Observation};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{EntryPayload, RaftLogReader, RaftSnapshotBuilder};

const TOPICS: [&str; 2] = ["persistent://hold/t/a", "persistent://hold/t/b"];
const STEPS: usize = 120;

/// splitmix64, as in the simulations of the node crate.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn id(index: u64) -> LogId {
    firstseen_raft::log_id(1, 1, index)
}

/// What the outbox must hold: per topic, the payloads by sequence, and the
/// watermark.
#[derive(Default)]
struct Model {
    messages: BTreeMap<&'static str, Vec<Vec<u8>>>,
    published: BTreeMap<&'static str, u64>,
}

/// A running node's storage, with its reaper.
struct Node {
    storage: Storage,
    reaper: tokio::task::JoinHandle<()>,
}

async fn open(dir: &std::path::Path) -> Node {
    let deadline = Instant::now() + Duration::from_secs(10);
    let storage = loop {
        match firstseen_raft::open(dir).await {
            Ok(s) => break s,
            // sled's threads of the previous instance may still hold its lock.
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("storage did not reopen: {e}"),
        }
    };
    let mut storage = storage;
    let reaper = tokio::spawn(std::mem::replace(&mut storage.reaper, Box::pin(async {})));
    // What openraft does at start-up: the state is as of its last
    // checkpoint, and the committed entries after it are applied again.
    let (applied, _) = storage.state_machine.applied_state().await.unwrap();
    let from = applied.map_or(1, |a| a.index + 1);
    let entries = storage.log.try_get_log_entries(from..).await.unwrap();
    storage.state_machine.apply_entries(entries).await.unwrap();
    Node { storage, reaper }
}

impl Node {
    async fn stop(self) {
        let Node { storage, reaper } = self;
        drop(storage);
        // The reaper ends once the last handle of the log is gone.
        reaper.await.unwrap();
    }

    /// Appends and applies one entry.
    async fn commit(&mut self, index: u64, cmd: Command) {
        let entry = Entry {
            log_id: id(index),
            payload: EntryPayload::Normal(cmd),
        };
        self.storage
            .log
            .blocking_append([entry.clone()])
            .await
            .unwrap();
        self.storage
            .state_machine
            .apply_entries([entry])
            .await
            .unwrap();
    }

    /// Waits until the reaper has served a purge up to `index`.
    async fn reaped(&self, index: u64) {
        let mut served = self.storage.log.reaper_served();
        tokio::time::timeout(Duration::from_secs(30), async {
            while *served.borrow_and_update() <= index {
                served.changed().await.unwrap();
            }
        })
        .await
        .expect("the reaper served the purge within 30 s");
    }
}

/// Every unpublished message of the model reads back from the outbox.
fn check(node: &Node, model: &Model, seed: u64, step: usize, what: &str) {
    for topic in TOPICS {
        let published = model.published.get(topic).copied().unwrap_or(0);
        let all = model.messages.get(topic).cloned().unwrap_or_default();
        let want: Vec<(u64, Vec<u8>)> = all
            .into_iter()
            .enumerate()
            .map(|(i, p)| (i as u64 + 1, p))
            .filter(|(seq, _)| *seq > published)
            .collect();
        let got = node
            .storage
            .outbox
            .read(topic, published + 1, usize::MAX)
            .unwrap_or_else(|e| {
                panic!(
                    "seed {seed} step {step} ({what}): the outbox of {topic} cannot be read: {e}"
                )
            });
        let got: Vec<(u64, Vec<u8>)> = got.into_iter().map(|(s, m)| (s, m.payload)).collect();
        assert_eq!(
            got, want,
            "seed {seed} step {step} ({what}): outbox of {topic}"
        );
    }
}

async fn run(seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(seed);
    let mut node = open(dir.path()).await;
    let mut model = Model::default();
    let mut index = 0u64;
    let mut next_key = 0u64;
    for step in 0..STEPS {
        let what = match rng.below(10) {
            // New first copies, most of the time.
            0..=4 => {
                let n = 1 + rng.below(4);
                let mut observations = Vec::new();
                for _ in 0..n {
                    next_key += 1;
                    let topic = TOPICS[rng.below(2) as usize];
                    let payload = format!("{seed}/{next_key}").into_bytes();
                    let mut key = [0u8; 32];
                    key[..8].copy_from_slice(&next_key.to_be_bytes());
                    observations.push(Observation {
                        key,
                        mqtt_topic: "/hfp/hold".into(),
                        pulsar_topic: topic.into(),
                        payload: payload.clone(),
                        qos: 1,
                        retain: false,
                        node: 1,
                        received_ms: 0,
                    });
                    model.messages.entry(topic).or_default().push(payload);
                }
                index += 1;
                let cmd = Command::Observe {
                    stamped_ms: 1_000 + index,
                    window: firstseen_store::Window::from_ms(3_600_000),
                    observations,
                };
                node.commit(index, cmd).await;
                "observe"
            }
            // A receipt for part of a topic's outbox.
            5 | 6 => {
                let topic = TOPICS[rng.below(2) as usize];
                let total = model.messages.get(topic).map_or(0, |m| m.len() as u64);
                let done = model.published.get(topic).copied().unwrap_or(0);
                if total > done {
                    let seq = done + 1 + rng.below(total - done);
                    model.published.insert(topic, seq);
                    index += 1;
                    let cmd = Command::Published {
                        pulsar_topic: topic.into(),
                        seq,
                    };
                    node.commit(index, cmd).await;
                }
                "receipt"
            }
            // A snapshot, the purge behind it, and the reaper's pass.
            7 | 8 => {
                if index > 0 {
                    let mut builder = node.storage.state_machine.get_snapshot_builder().await;
                    builder.build_snapshot().await.unwrap();
                    node.storage.log.purge(id(index)).await.unwrap();
                    node.reaped(index).await;
                }
                "snapshot, purge and reap"
            }
            // A restart.
            _ => {
                node.stop().await;
                node = open(dir.path()).await;
                "restart"
            }
        };
        check(&node, &model, seed, step, what);
    }
    node.stop().await;
}

fn seeds() -> Vec<u64> {
    if let Ok(s) = std::env::var("HOLD_SEED") {
        return vec![s.parse().expect("HOLD_SEED is a number")];
    }
    let n: u64 = std::env::var("HOLD_SEEDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(12);
    let base = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    (0..n).map(|i| base * 1_000 + i).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_keeps_every_entry_the_outbox_reads_under_seeded_schedules() {
    let started = Instant::now();
    let seeds = seeds();
    for seed in &seeds {
        eprintln!("seed {seed} (replay: HOLD_SEED={seed})");
        run(*seed).await;
    }
    eprintln!(
        "{} seeds of {STEPS} steps in {:.1} s",
        seeds.len(),
        started.elapsed().as_secs_f64()
    );
}
