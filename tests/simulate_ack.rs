//! The ack path in simulation: the node's own batcher (`src/batch/`), between
//! a model of an MQTT broker's persistent session and a model of the Raft
//! group, on tokio's paused clock, under seeded faults.
//!
//! What the models do, as the real parts do it:
//! - **The broker.** A publisher sends messages at QoS 1. The broker hands
//!   each to the node's connection with a packet id and keeps it until the
//!   node acks it. When the connection ends (the node crashed), the next
//!   connection gets every unacked message again first, in order, with new
//!   packet ids; an ack carrying an older connection's epoch is ignored, as
//!   the node's ack gate does.
//! - **The group.** A proposed batch commits after a delay, or fails before
//!   committing (no leader, leader changed), or commits and loses its reply
//!   (the proposer sees an error and proposes again: copies come back as
//!   duplicates). An entry already on its way commits even if the node that
//!   proposed it crashes meanwhile.
//!
//! The nemesis crashes the node (its batcher dropped mid-flight) and
//! restarts it, on a schedule drawn from the seed. The checker holds G4 on
//! every ack: a message is acked only once its copy is committed. After
//! the faults the node runs until every message is acked, and every message
//! sent must then be committed (nothing lost) and acked.
//!
//! `SIM_SEEDS=N` runs N seeds (default 300), `SIM_SEED=S` runs one, printing
//! its trace.

mod sim;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use firstseen::batch::port::{Acks, Commit};
use firstseen::batch::{BatchPolicy, Batcher};
use firstseen::diskspace::DiskSpace;
use firstseen::ingest::ack::{AckStats, AckToken};
use firstseen::ingest::Received;
use firstseen::propose::ProposeError;
use firstseen_store::{Batch, NodeId, Observation, Outcome, StateStore};
use futures::future::BoxFuture;
use sim::{check_seeds, lock, traced, Rng};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Messages the publisher sends per run.
const MESSAGES: u64 = 400;
/// Faults happen during this much simulated time.
const FAULTS_FOR: Duration = Duration::from_secs(10);
/// After the faults, every message must be acked within this.
const SETTLE_WITHIN: Duration = Duration::from_secs(60);

/// Everything the models share.
struct World {
    rng: Rng,
    started: Instant,
    trace: Vec<String>,
    problems: Vec<String>,
    // The broker's session.
    epoch: u64,
    next_pkid: u16,
    /// Packet id → message, for the current connection.
    inflight: BTreeMap<u16, u64>,
    /// Messages not yet acked, in the order they were first sent.
    unacked: BTreeSet<u64>,
    /// Messages to hand to the next connection that reads.
    outgoing: VecDeque<u64>,
    /// Wakes the connection when `outgoing` grows.
    wake: Arc<tokio::sync::Notify>,
    // The group.
    committed: BTreeSet<u64>,
    /// Whether the group refuses proposals for now (no leader).
    leaderless: bool,
}

type Shared = Arc<Mutex<World>>;

impl World {
    fn log(&mut self, line: String) {
        self.trace.push(traced(self.started, line));
    }
}

fn key_of(message: u64) -> [u8; 32] {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&message.to_be_bytes());
    key
}

fn message_of(key: &[u8; 32]) -> u64 {
    u64::from_be_bytes(key[..8].try_into().expect("8 bytes"))
}

fn received(message: u64, epoch: u64, pkid: u16) -> Received {
    Received {
        observation: Some(Observation {
            key: key_of(message),
            mqtt_topic: "/hfp/sim".into(),
            pulsar_topic: "persistent://sim/t/a".into(),
            payload: message.to_be_bytes().to_vec(),
            qos: 1,
            retain: false,
            node: 1,
            received_ms: 0,
        }),
        properties: None,
        kind: firstseen_store::KeyKind::TopicPayload,
        ack: Some(AckToken {
            upstream: 0,
            epoch,
            pkid,
            qos: 1,
        }),
        received_at: tokio::time::Instant::now(),
    }
}

/// The group model.
struct Group(Shared);

impl Commit for Group {
    fn propose(&self, batch: Batch) -> BoxFuture<'_, Result<Vec<Outcome>, ProposeError>> {
        let world = self.0.clone();
        Box::pin(async move {
            let messages: Vec<u64> = batch
                .observations
                .iter()
                .map(|o| message_of(&o.key))
                .collect();
            let (delay, fate, leaderless) = {
                let mut w = lock(&world);
                (w.rng.ms(1, 120), w.rng.below(10), w.leaderless)
            };
            if leaderless {
                tokio::time::sleep(Duration::from_millis(5)).await;
                return Err(ProposeError::NoLeader);
            }
            if fate == 0 {
                tokio::time::sleep(delay).await;
                lock(&world).log(format!(
                    "propose of {} failed before commit",
                    messages.len()
                ));
                return Err(ProposeError::LeaderChanged { from: 1 });
            }
            // Once appended, the entry commits whatever happens to the
            // proposer: the commit runs on a task of its own.
            let (tx, rx) = tokio::sync::oneshot::channel();
            let commit = world.clone();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let mut w = lock(&commit);
                let mut outcomes = Vec::new();
                for m in &messages {
                    if w.committed.insert(*m) {
                        outcomes.push(Outcome::FirstSeen { seq: *m });
                    } else {
                        outcomes.push(Outcome::Duplicate {
                            seq: *m,
                            first_node: 1,
                        });
                    }
                }
                w.log(format!("committed {} messages", messages.len()));
                let _ = tx.send(outcomes);
            });
            let outcomes = rx.await.map_err(|_| ProposeError::NoLeader)?;
            if fate == 1 {
                lock(&world).log("the commit's reply was lost".into());
                return Err(ProposeError::LeaderChanged { from: 1 });
            }
            Ok(outcomes)
        })
    }

    fn leader(&self) -> Option<NodeId> {
        (!lock(&self.0).leaderless).then_some(1)
    }

    fn leader_moves(&self, _from: Option<NodeId>, limit: Duration) -> BoxFuture<'_, ()> {
        Box::pin(tokio::time::sleep(limit.min(Duration::from_millis(20))))
    }
}

/// The broker's session, as the node's ack gate reaches it.
struct Session(Shared);

impl Acks for Session {
    fn upstreams(&self) -> usize {
        1
    }

    fn ack(&self, _upstream: usize, tokens: &[AckToken]) -> AckStats {
        let mut w = lock(&self.0);
        let mut stats = AckStats::default();
        for t in tokens {
            if t.epoch != w.epoch {
                stats.stale += 1;
                continue;
            }
            let Some(message) = w.inflight.remove(&t.pkid) else {
                w.problems.push(format!(
                    "ack for packet id {} that is not in flight",
                    t.pkid
                ));
                continue;
            };
            // G4: the broker forgets an acked message, so it must be in the
            // group already.
            if !w.committed.contains(&message) {
                w.problems
                    .push(format!("message {message} acked before it was committed"));
            }
            w.unacked.remove(&message);
            stats.sent += 1;
        }
        stats
    }
}

/// One life of the node: a connection that reads from the broker into a
/// batcher, until the node crashes.
async fn node_life(world: Shared, state: StateStore, disk: Arc<DiskSpace>) {
    let epoch = {
        let mut w = lock(&world);
        w.epoch += 1;
        w.inflight.clear();
        // Unacked messages first, in order, then the rest.
        let mut again: Vec<u64> = w.unacked.iter().copied().collect();
        again.retain(|m| !w.outgoing.contains(m));
        for m in again.into_iter().rev() {
            w.outgoing.push_front(m);
        }
        let epoch = w.epoch;
        w.log(format!("node connects (epoch {epoch})"));
        epoch
    };
    let (tx, rx) = mpsc::channel(64);
    let batcher = Batcher {
        policy: BatchPolicy {
            max_messages: 20,
            max_bytes: 1 << 20,
            linger: Duration::from_millis(5),
        },
        proposer: Arc::new(Group(world.clone())),
        acks: Arc::new(Session(world.clone())),
        state,
        quota_bytes: u64::MAX,
        disk,
        shutdown: CancellationToken::new(),
    };
    let wake = lock(&world).wake.clone();
    let reader = async move {
        loop {
            let next = {
                let mut w = lock(&world);
                w.outgoing.pop_front().map(|m| {
                    let pkid = w.next_pkid;
                    w.next_pkid = w.next_pkid.wrapping_add(1).max(1);
                    w.inflight.insert(pkid, m);
                    (m, pkid)
                })
            };
            match next {
                Some((m, pkid)) => {
                    if tx.send(received(m, epoch, pkid)).await.is_err() {
                        return;
                    }
                }
                None => wake.notified().await,
            }
        }
    };
    tokio::join!(firstseen::batch::run(batcher, rx), reader);
}

/// Runs one seed; returns its trace and what the checker found.
fn run(seed: u64) -> (Vec<String>, Vec<String>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime");
    // No flusher thread: a temporary database's drop then does not wait
    // for one.
    let sled = sled::Config::new()
        .temporary(true)
        .flush_every_ms(None)
        .open()
        .expect("temporary sled");
    let state = StateStore::open(&sled).expect("state");
    rt.block_on(async move {
        let disk = DiskSpace::new(std::env::temp_dir(), 0);
        let mut rng = Rng(seed);
        let world: Shared = Arc::new(Mutex::new(World {
            rng: Rng(rng.next()),
            started: Instant::now(),
            trace: Vec::new(),
            problems: Vec::new(),
            epoch: 0,
            next_pkid: 1,
            inflight: BTreeMap::new(),
            unacked: BTreeSet::new(),
            outgoing: VecDeque::new(),
            wake: Arc::new(tokio::sync::Notify::new()),
            committed: BTreeSet::new(),
            leaderless: false,
        }));
        // The publisher: MESSAGES messages spread over the fault period.
        let publisher = {
            let world = world.clone();
            let mut rng = Rng(rng.next());
            tokio::spawn(async move {
                for m in 0..MESSAGES {
                    tokio::time::sleep(rng.ms(0, 2 * FAULTS_FOR.as_millis() as u64 / MESSAGES))
                        .await;
                    let mut w = lock(&world);
                    w.unacked.insert(m);
                    w.outgoing.push_back(m);
                    w.wake.notify_one();
                }
            })
        };
        // The nemesis: the node crashes and restarts, and the group loses
        // its leader for a while, at times drawn from the seed.
        let end = Instant::now() + FAULTS_FOR;
        let mut life = tokio::spawn(node_life(world.clone(), state.clone(), disk.clone()));
        while Instant::now() < end {
            tokio::time::sleep(rng.ms(50, 1_500)).await;
            match rng.below(3) {
                0 => {
                    life.abort();
                    let _ = (&mut life).await;
                    lock(&world).log("node crashed".into());
                    tokio::time::sleep(rng.ms(0, 300)).await;
                    life = tokio::spawn(node_life(world.clone(), state.clone(), disk.clone()));
                }
                1 => {
                    let out = rng.ms(10, 800);
                    lock(&world).leaderless = true;
                    lock(&world).log(format!("no leader for {} ms", out.as_millis()));
                    tokio::time::sleep(out).await;
                    lock(&world).leaderless = false;
                }
                _ => {}
            }
        }
        publisher.await.expect("publisher");
        lock(&world).log("faults over".into());
        let settle = Instant::now() + SETTLE_WITHIN;
        while Instant::now() < settle && !lock(&world).unacked.is_empty() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        life.abort();
        let mut w = lock(&world);
        let lost: Vec<u64> = (0..MESSAGES).filter(|m| !w.committed.contains(m)).collect();
        if !lost.is_empty() {
            let n = lost.len();
            w.problems.push(format!(
                "{n} messages never committed (first: {:?})",
                &lost[..n.min(10)]
            ));
        }
        if !w.unacked.is_empty() {
            let n = w.unacked.len();
            w.problems.push(format!(
                "{n} messages still unacked {SETTLE_WITHIN:?} after the faults"
            ));
        }
        (
            std::mem::take(&mut w.trace),
            std::mem::take(&mut w.problems),
        )
    })
}

#[test]
fn nothing_is_acked_before_commit_and_nothing_is_lost_under_seeded_faults() {
    check_seeds("simulate_ack", 300, FAULTS_FOR, run);
}
