//! On the leader: batches that wait for a proposal slot go into one entry.
//!
//! Every node's batcher keeps two batches in flight, and the leader commits its
//! own and the forwarded ones. Proposed one entry per batch, a 2,000 msg/s
//! feed over three zones made 400 to 570 entries a second, each paying its own
//! replication messages, apply, response and wake-ups of every task that
//! watches the Raft metrics; on two cores those wake-ups were most of the
//! kernel time. Here at most [`IN_FLIGHT`] entries are being committed at
//! once, and whatever arrives meanwhile is merged into the next one. An idle
//! cluster still proposes a lone batch at once, so merging adds no wait.

use std::collections::VecDeque;
use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;

use firstseen_raft::{Command, Raft, Response};
use firstseen_store::{Batch, Outcome, Window};
use openraft::error::{ClientWriteError, RaftError};
use openraft::metrics::RaftServerMetrics;
use openraft::ServerState;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::clocks::Clocks;
use super::slim;
use super::spacing::{self, Room, Spacing};
use crate::cluster::wire::ForwardError;

/// Entries being committed at once. One merges the most: with two always,
/// the benchmark's peak made 511 entries/s and p99 47 ms; with one, 427 and
/// 43 ms (docs/benchmarks.md). A second (up to four) goes only once the
/// newest has waited 5 ms ([`spacing`]): between zones a commit takes a
/// round trip or more, and what arrived meanwhile need not wait for it.
const IN_FLIGHT: Spacing = Spacing {
    base: 1,
    most: 4,
    gap: Duration::from_millis(5),
};

/// Where a batch's answer goes, and when the batch reached the coalescer
/// (the start of its `queue` leg, `firstseen_commit_leg_seconds`).
type Reply = (oneshot::Sender<Result<Vec<Outcome>, ForwardError>>, Instant);

/// What the coalescer is asked to append.
enum Work {
    /// A batch of observations, answered once committed.
    Batch(Batch, Reply),
    /// The publisher's receipt for `topic` up to `seq`. Written beside the
    /// entries rather than in their slot: the next batch need not wait for
    /// it, and apply keeps the larger of two receipts in any order.
    Watermark { topic: String, seq: u64 },
    /// A command other than observations and receipts (the cluster level
    /// rising, a message set aside), answered once committed.
    Append {
        cmd: Command,
        reply: oneshot::Sender<Result<(), ForwardError>>,
    },
}

/// Handle to the merging task; cheap to clone.
#[derive(Clone)]
pub struct Coalescer {
    tx: mpsc::UnboundedSender<Work>,
    /// A leader whose disk is low commits nothing (`crate::diskspace`).
    disk: std::sync::Arc<crate::diskspace::DiskSpace>,
}

fn bytes(batch: &Batch) -> usize {
    batch
        .observations
        .iter()
        .map(|o| o.payload.len() + o.mqtt_topic.len() + o.pulsar_topic.len())
        .sum()
}

/// Takes the next entry's batches from the front of `queue`: the first
/// always, then the ones after it while the entry stays within
/// `max_bytes`, in order.
fn next_entry<T>(queue: &mut VecDeque<(Batch, T)>, max_bytes: usize) -> Vec<(Batch, T)> {
    let mut parts = Vec::new();
    let mut size = 0;
    while let Some((batch, _)) = queue.front() {
        let more = bytes(batch);
        if !parts.is_empty() && size + more > max_bytes {
            break;
        }
        size += more;
        parts.extend(queue.pop_front());
    }
    parts
}

/// The merging task's settings.
pub struct Settings {
    /// The dedup window, stamped into every entry beside the stamp.
    pub window: Window,
    /// This node's wall clock: its reading is the leader's own in each
    /// stamp.
    pub clock: crate::clock::SharedClock,
    /// Bounds a merged entry like a batch: the first batch always goes in,
    /// later ones only while they fit.
    pub max_bytes: usize,
    /// The Raft log, for the window's time when the applied state is behind
    /// it ([`window_clock`]).
    pub log: firstseen_raft::LogStore,
}

/// The window clock a new stamp builds on: the applied state's, or the last
/// stamp in this leader's log when that is later.
///
/// A leader's state can be behind its log, even empty (the previous term's
/// entries not yet applied, or re-applied after a restart with its state
/// rebuilt). Its window clock then read 0, and `window::leader_stamp`
/// takes 0 for "nothing stamped yet": the leader's own clock went through
/// uncapped, and a clock a day ahead stamped an entry that, applied after
/// the older ones, moved the window a day and expired every key. Every
/// entry in the leader's log is applied before anything it appends, so the
/// log's last stamp is a floor the state will reach. Read once per term:
/// after that the state holds this leader's own stamps. An error reading
/// either is an error: there is no safe guess.
fn window_clock(
    state: &firstseen_store::StateStore,
    log: &firstseen_raft::LogStore,
    floor: &mut Option<(u64, u64)>,
    term: u64,
) -> Result<u64, firstseen_store::StoreError> {
    let from_log = match *floor {
        Some((t, ms)) if t == term => ms,
        _ => {
            let ms = log.last_stamp()?.unwrap_or(0);
            *floor = Some((term, ms));
            ms
        }
    };
    Ok(state.totals()?.clock_ms.max(from_log))
}

impl Coalescer {
    /// The handle, and the task to run under the node's supervisor until
    /// `stop`. The task owns every write it starts: when it ends, those it
    /// did not see through are dropped with it (their callers hear that the
    /// node is stopping; what was committed stays committed).
    pub fn new(
        raft: Raft,
        state: firstseen_store::StateStore,
        settings: Settings,
        disk: std::sync::Arc<crate::diskspace::DiskSpace>,
        stop: CancellationToken,
    ) -> (Self, impl Future<Output = ()> + Send + 'static) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Self { tx, disk }, run(raft, state, settings, rx, stop))
    }

    /// Commits `batch` (possibly in one entry with other batches) and
    /// returns its outcomes, in order, once the entry is committed.
    pub async fn commit(&self, batch: Batch) -> Result<Vec<Outcome>, ForwardError> {
        if let Some(reason) = self.disk.reason() {
            return Err(ForwardError::DiskLow { reason });
        }
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Work::Batch(batch, (reply, Instant::now())))
            .map_err(|_| ForwardError::ShuttingDown)?;
        answer.await.map_err(|_| ForwardError::ShuttingDown)?
    }

    /// Appends `cmd` (the cluster level rising, a message set aside) and
    /// returns once it is committed.
    pub async fn append(&self, cmd: Command) -> Result<(), ForwardError> {
        if let Some(reason) = self.disk.reason() {
            return Err(ForwardError::DiskLow { reason });
        }
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Work::Append { cmd, reply })
            .map_err(|_| ForwardError::ShuttingDown)?;
        answer.await.map_err(|_| ForwardError::ShuttingDown)?
    }

    /// Appends the receipt `Published{topic, seq}` without waiting for it.
    /// One that is lost (a stop, a lost leadership) is covered by the next.
    pub fn watermark(&self, topic: String, seq: u64) {
        if self.tx.send(Work::Watermark { topic, seq }).is_err() {
            tracing::debug!("watermark not proposed: the node is stopping");
        }
    }
}

async fn run(
    raft: Raft,
    state: firstseen_store::StateStore,
    settings: Settings,
    mut rx: mpsc::UnboundedReceiver<Work>,
    stop: CancellationToken,
) {
    let mut queue: VecDeque<(Batch, Reply)> = VecDeque::new();
    let mut entries = JoinSet::new();
    // When the newest entry in flight was proposed (for [`IN_FLIGHT`]).
    let mut newest: Option<Instant> = None;
    let mut watermarks = JoinSet::new();
    let mut clocks = Clocks::default();
    // The log's last stamp, read once per term (see [`window_clock`]).
    let mut floor: Option<(u64, u64)> = None;
    // How often this node notes the window clock it has applied, leader or
    // not: a new leader's first stamp may then move the window clock by
    // the time since it saw the last one applied (at most this much late).
    let mut window_tick = tokio::time::interval(Duration::from_millis(100));
    window_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut open = true;
    loop {
        // Everything that arrived while the last entry was committed goes
        // into the next one.
        while let Ok(work) = rx.try_recv() {
            match work {
                Work::Batch(b, reply) => queue.push_back((b, reply)),
                Work::Watermark { topic, seq } => {
                    watermarks.spawn(watermark(raft.clone(), topic, seq));
                }
                Work::Append { cmd, reply } => {
                    watermarks.spawn(append(raft.clone(), cmd, reply));
                }
            }
        }
        while !queue.is_empty()
            && IN_FLIGHT.room(entries.len(), newest, Instant::now()) == Room::Now
        {
            let parts = next_entry(&mut queue, settings.max_bytes);
            let now = Instant::now();
            newest = Some(now);
            let queued = metrics::histogram!("firstseen_commit_leg_seconds", "leg" => "queue");
            for (b, (_, arrived)) in &parts {
                clocks.saw(&b.observations, now);
                queued.record(now.saturating_duration_since(*arrived).as_secs_f64());
            }
            let (me, voters, term) = {
                let m = raft.metrics();
                let m = m.borrow();
                let voters: Vec<u64> = m.membership_config.membership().voter_ids().collect();
                (m.id, voters, m.current_term)
            };
            let window_clock = match window_clock(&state, &settings.log, &mut floor, term) {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!(error = %e, "cannot read the window clock: batches not committed");
                    let detail = format!("window clock: {e}");
                    for (_, (reply, _)) in parts {
                        let _ = reply.send(Err(ForwardError::NotCommitted {
                            detail: detail.clone(),
                        }));
                    }
                    continue;
                }
            };
            let stamped_ms = clocks.stamp(&voters, me, settings.clock.now_ms(), window_clock, now);
            entries.spawn(entry(
                raft.clone(),
                state.clone(),
                stamped_ms,
                settings.window,
                parts,
            ));
        }
        let room = IN_FLIGHT.room(entries.len(), newest, Instant::now());
        tokio::select! {
            Some(done) = entries.join_next(), if !entries.is_empty() => {
                if let Err(e) = done {
                    if e.is_panic() {
                        std::panic::resume_unwind(e.into_panic());
                    }
                }
            }
            _ = spacing::until(room), if !queue.is_empty() => {}
            Some(_) = watermarks.join_next(), if !watermarks.is_empty() => {}
            _ = window_tick.tick() => {
                if let Ok(t) = state.totals() {
                    clocks.window_is(t.clock_ms, Instant::now());
                }
            }
            work = rx.recv(), if open => match work {
                Some(Work::Batch(b, reply)) => queue.push_back((b, reply)),
                Some(Work::Watermark { topic, seq }) => {
                    watermarks.spawn(watermark(raft.clone(), topic, seq));
                }
                Some(Work::Append { cmd, reply }) => {
                    watermarks.spawn(append(raft.clone(), cmd, reply));
                }
                None => open = false,
            },
            _ = stop.cancelled() => return,
        }
    }
}

/// Commits the batches of one entry as one entry and answers each batch with
/// its own outcomes.
async fn entry(
    raft: Raft,
    state: firstseen_store::StateStore,
    stamped_ms: u64,
    window: Window,
    parts: Vec<(Batch, Reply)>,
) {
    let sizes: Vec<usize> = parts.iter().map(|(b, _)| b.len()).collect();
    let mut merged = Batch::default();
    let mut replies = Vec::with_capacity(parts.len());
    for (b, (reply, _)) in parts {
        merged.extend(b);
        replies.push(reply);
    }
    let proposed = Instant::now();
    // The formats of the level applied now: an entry appended after the
    // level rose but written at the old one is read as copies of unknown
    // kind, which apply handles.
    let level = state.level();
    let held = state.held(
        merged
            .observations
            .iter()
            .enumerate()
            .map(|(i, o)| (o, merged.kind(i))),
    );
    let stripped = slim::strip(&mut merged, &held, level);
    let result = commit_slim(&raft, level, stamped_ms, window, merged, stripped).await;
    if result.is_ok() {
        metrics::histogram!("firstseen_commit_leg_seconds", "leg" => "entry")
            .record(proposed.elapsed().as_secs_f64());
    }
    match result {
        Ok(outcomes) => {
            let mut outcomes = outcomes.into_iter();
            for (reply, n) in replies.into_iter().zip(sizes) {
                let _ = reply.send(Ok(outcomes.by_ref().take(n).collect()));
            }
        }
        Err(e) => {
            for reply in replies {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}

/// Commits `batch` with the copies in `stripped` slim, then any of those
/// that came back [`Outcome::Missing`] whole, and returns one outcome per
/// copy, in order.
async fn commit_slim(
    raft: &Raft,
    level: u32,
    stamped_ms: u64,
    window: Window,
    batch: Batch,
    stripped: slim::Stripped,
) -> Result<Vec<Outcome>, ForwardError> {
    let total = batch.len();
    let cmd = batch.into_command_at(level, stamped_ms, window, stripped.positions.clone());
    let mut outcomes = propose(raft, cmd, total).await?;
    let (positions, again) = slim::resend(stripped, &outcomes);
    if !again.is_empty() {
        metrics::counter!("firstseen_slim_resent_total").increment(again.len() as u64);
        let n = again.len();
        let whole = propose(
            raft,
            again.into_command_at(level, stamped_ms, window, Vec::new()),
            n,
        )
        .await?;
        for (pos, outcome) in positions.into_iter().zip(whole) {
            outcomes[pos] = outcome;
        }
    }
    // A whole copy is never Missing; were one to reach a batcher it would be
    // acked without being stored, so the batch is failed and sent again.
    if outcomes.iter().any(|o| matches!(o, Outcome::Missing)) {
        return Err(ForwardError::Inconsistent {
            detail: "a copy came back missing after it was sent whole".into(),
        });
    }
    Ok(outcomes)
}

/// Appends one receipt; a leader that loses its term gives up on it like
/// on an entry (see [`until_deposed`]).
async fn watermark(raft: Raft, topic: String, seq: u64) {
    let cmd = Command::Published {
        pulsar_topic: topic,
        seq,
    };
    match until_deposed(raft.client_write(cmd), raft.server_metrics()).await {
        Some(Ok(_)) => {}
        Some(Err(e)) => {
            tracing::debug!(error = %e, "watermark not committed; the next one covers it")
        }
        None => tracing::debug!("watermark abandoned: no longer leading"),
    }
}

/// Appends `cmd` and answers once it is committed.
async fn append(raft: Raft, cmd: Command, reply: oneshot::Sender<Result<(), ForwardError>>) {
    let server = raft.server_metrics();
    let result = match until_deposed(raft.client_write(cmd), server.clone()).await {
        Some(Ok(_)) => Ok(()),
        Some(Err(e)) => Err(ForwardError::NotCommitted {
            detail: e.to_string(),
        }),
        None => Err(ForwardError::NotLeader {
            leader: server.borrow().current_leader,
        }),
    };
    let _ = reply.send(result);
}

/// One entry of `total` copies, with the stamp the leader chose: only a
/// leader appends, so the window clock only ever reads leader stamps.
async fn propose(raft: &Raft, cmd: Command, total: usize) -> Result<Vec<Outcome>, ForwardError> {
    let server = raft.server_metrics();
    let Some(written) = until_deposed(raft.client_write(cmd), server.clone()).await else {
        return Err(ForwardError::NotLeader {
            leader: server.borrow().current_leader,
        });
    };
    match written {
        Ok(resp) => match resp.data {
            Response::Observed(outcomes) if outcomes.len() == total => Ok(outcomes),
            Response::Observed(outcomes) => Err(ForwardError::Inconsistent {
                detail: format!("{} outcomes for {total} observations", outcomes.len()),
            }),
            other => Err(ForwardError::Inconsistent {
                detail: format!("unexpected response to a batch: {other:?}"),
            }),
        },
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
            Err(ForwardError::NotLeader {
                leader: f.leader_id,
            })
        }
        Err(e) => Err(ForwardError::NotCommitted {
            detail: e.to_string(),
        }),
    }
}

/// Awaits `write`, or returns `None` once this node has stopped leading in
/// the term it was in when the write began.
///
/// Why: openraft 0.9 answers a write when its entry is applied, and fails it
/// when the entry is truncated; nothing else drains its responders. A leader
/// that steps down and then installs a snapshot covering its entry imports
/// that entry without applying it, so the write waits forever. With its
/// entries in flight ([`IN_FLIGHT`]) stuck so, every later batch through this node then
/// waited too, once it led again (nemesis seed 288942358, release replay:
/// node 2 led in term 6, installed three snapshots in term 9, led again in
/// term 10, and every forward to it timed out for the rest of the run).
/// The batch goes back to its batcher, which proposes it again; whatever of
/// it did commit comes back as duplicates of itself, as after any repeated
/// forward, and acking those is what G4 allows.
async fn until_deposed<F: Future>(
    write: F,
    mut server: watch::Receiver<RaftServerMetrics<firstseen_raft::TypeConfig>>,
) -> Option<F::Output> {
    let (term, leading) = {
        let m = server.borrow_and_update();
        (m.vote.leader_id().term, m.state == ServerState::Leader)
    };
    let deposed = server.wait_for(|m| {
        m.vote.leader_id().term != term || (leading && m.state != ServerState::Leader)
    });
    tokio::select! {
        biased;
        r = write => Some(r),
        // A closed channel means Raft stopped: the write ends on its own.
        Ok(_) = deposed => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    fn server(term: u64, state: ServerState) -> RaftServerMetrics<firstseen_raft::TypeConfig> {
        RaftServerMetrics {
            id: 1,
            vote: openraft::Vote::new_committed(term, 1),
            state,
            current_leader: (state == ServerState::Leader).then_some(1),
            membership_config: Arc::new(Default::default()),
            committed_membership_config: Arc::new(Default::default()),
        }
    }

    /// A write that openraft never answers (its entry came in by snapshot
    /// after this node stepped down) ends when the term does.
    #[tokio::test]
    async fn a_write_that_is_never_answered_ends_with_the_term() {
        let (tx, rx) = watch::channel(server(6, ServerState::Leader));
        let pending = tokio::spawn(until_deposed(std::future::pending::<()>(), rx));
        tokio::task::yield_now().await;
        assert!(!pending.is_finished(), "still leading: the write waits");
        tx.send(server(9, ServerState::Follower)).unwrap();
        let ended = tokio::time::timeout(Duration::from_secs(5), pending).await;
        assert!(
            matches!(ended, Ok(Ok(None))),
            "still waiting after the term changed"
        );
    }

    #[tokio::test]
    async fn a_write_answered_while_leading_is_returned() {
        let (tx, rx) = watch::channel(server(6, ServerState::Leader));
        let (answer, answered) = oneshot::channel::<u32>();
        let write = async move { answered.await.unwrap() };
        let pending = tokio::spawn(until_deposed(write, rx));
        // A change that is not a change of term or role leaves it waiting.
        tx.send(server(6, ServerState::Leader)).unwrap();
        tokio::task::yield_now().await;
        answer.send(7).unwrap();
        assert_eq!(pending.await.unwrap(), Some(7));
    }

    fn batch(payload: usize) -> Batch {
        let mut b = Batch::default();
        b.observations.push(firstseen_store::Observation {
            key: [0; 32],
            mqtt_topic: "t".into(),
            pulsar_topic: "p".into(),
            payload: vec![0; payload],
            qos: 1,
            retain: false,
            node: 1,
            received_ms: 0,
        });
        b
    }

    #[test]
    fn an_entry_takes_the_first_batch_always_and_the_rest_while_they_fit() {
        // Each batch is its payload plus "t" and "p": 2 bytes more.
        let mut q: VecDeque<(Batch, u8)> = [
            (batch(98), 1),
            (batch(48), 2),
            (batch(48), 3),
            (batch(8), 4),
        ]
        .into();
        let g = next_entry(&mut q, 100);
        assert_eq!(g.iter().map(|(_, i)| *i).collect::<Vec<_>>(), vec![1]);
        let g = next_entry(&mut q, 100);
        assert_eq!(g.iter().map(|(_, i)| *i).collect::<Vec<_>>(), vec![2, 3]);
        let mut big: VecDeque<(Batch, u8)> = [(batch(500), 5), (batch(1), 6)].into();
        let g = next_entry(&mut big, 100);
        assert_eq!(g.iter().map(|(_, i)| *i).collect::<Vec<_>>(), vec![5]);
        assert_eq!(q.len(), 1);
        assert!(next_entry(&mut VecDeque::<(Batch, u8)>::new(), 100).is_empty());
    }

    /// A leader whose applied state is behind its log, even empty (its state
    /// rebuilt, or the previous term's entries not yet applied), with its
    /// clock a day ahead. The window clock it stamps from is the log's last
    /// stamp, so the stamp stays at the window's time. From the empty
    /// state's 0, `leader_stamp` took the leader's clock uncapped: applied
    /// after the older entries, that stamp moved the window a day and
    /// expired every key (this test fails that way without the log's floor:
    /// the stamp is a day ahead).
    #[tokio::test]
    async fn a_leader_whose_state_is_behind_its_log_stamps_from_the_log() {
        use firstseen_raft::Entry;
        use openraft::storage::RaftLogStorageExt;
        use openraft::EntryPayload;
        const T0: u64 = 1_700_000_000_000;
        const DAY: u64 = 86_400_000;
        let tmp = tempfile::tempdir().unwrap();
        let mut storage = firstseen_raft::open(tmp.path()).await.unwrap();
        let id = |i| firstseen_raft::log_id(5, 1, i);
        let mut entries = vec![Entry {
            log_id: id(0),
            payload: EntryPayload::Blank,
        }];
        for i in 1..=3u64 {
            entries.push(Entry {
                log_id: id(i),
                payload: EntryPayload::Normal(Command::Observe {
                    stamped_ms: T0 + i,
                    window: Window::from_ms(3_600_000),
                    observations: Vec::new(),
                }),
            });
        }
        // A receipt after the last observing entry: passed over.
        entries.push(Entry {
            log_id: id(4),
            payload: EntryPayload::Normal(Command::Published {
                pulsar_topic: "t".into(),
                seq: 1,
            }),
        });
        storage.log.blocking_append(entries).await.unwrap();
        assert_eq!(
            storage.state.totals().unwrap().clock_ms,
            0,
            "nothing applied"
        );

        let mut floor = None;
        let clock = window_clock(&storage.state, &storage.log, &mut floor, 5).unwrap();
        assert_eq!(clock, T0 + 3);
        assert_eq!(floor, Some((5, T0 + 3)), "read once per term");
        let stamp = Clocks::default().stamp(&[1, 2, 3], 1, T0 + DAY, clock, Instant::now());
        assert_eq!(stamp, T0 + 3, "the leader's day-ahead clock is capped");
    }
}
