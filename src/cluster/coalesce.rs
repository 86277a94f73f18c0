//! On the leader: batches that wait for a proposal slot go into one entry.
//!
//! Every node's batcher keeps one batch in flight, and the leader commits its
//! own and the forwarded ones. Proposed one entry per batch, a 2,000 msg/s
//! feed over three zones made 400 to 570 entries a second, each paying its own
//! replication messages, apply, response and wake-ups of every task that
//! watches the Raft metrics; on two cores those wake-ups were most of the
//! kernel time. Here at most [`IN_FLIGHT`] entries are being committed at
//! once, and whatever arrives meanwhile is merged into the next one. An idle
//! cluster still proposes a lone batch at once, so merging adds no wait.

use std::future::Future;
use std::sync::Arc;

use firstseen_raft::{Member, NodeId, Raft, Response};
use firstseen_store::{Batch, Observation, Outcome};
use openraft::error::{ClientWriteError, RaftError};
use openraft::metrics::RaftServerMetrics;
use openraft::ServerState;
use tokio::sync::{mpsc, oneshot, watch, Semaphore};

use super::wire::ForwardError;
use crate::now_ms;

/// Entries being committed at once. One merges the most: with two, the
/// benchmark's peak made 511 entries/s and p99 47 ms; with one, 427 and
/// 43 ms (docs/benchmarks.md).
const IN_FLIGHT: usize = 1;

type Reply = oneshot::Sender<Result<Vec<Outcome>, ForwardError>>;

/// Handle to the merging task; cheap to clone.
#[derive(Clone)]
pub struct Coalescer {
    tx: mpsc::UnboundedSender<(Batch, Reply)>,
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

impl Coalescer {
    /// Starts the task. `max_bytes` bounds a merged entry like a batch: the
    /// first batch always goes in, later ones only while they fit.
    pub fn start(
        raft: Raft,
        state: firstseen_store::StateStore,
        window_ms: u64,
        max_bytes: usize,
        disk: std::sync::Arc<crate::diskspace::DiskSpace>,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(raft, state, window_ms, max_bytes, rx));
        Self { tx, disk }
    }

    /// Commits `batch` (possibly in one entry with other batches) and
    /// returns its outcomes, in order, once the entry is committed.
    pub async fn commit(&self, batch: Batch) -> Result<Vec<Outcome>, ForwardError> {
        if let Some(reason) = self.disk.reason() {
            return Err(ForwardError::Failed(format!(
                "leader cannot commit: {reason}"
            )));
        }
        let (reply, answer) = oneshot::channel();
        self.tx
            .send((batch, reply))
            .map_err(|_| ForwardError::Failed("node is shutting down".into()))?;
        answer
            .await
            .map_err(|_| ForwardError::Failed("node is shutting down".into()))?
    }
}

/// The latest clock reading of each node, from the observations this leader
/// commits: what [`firstseen_store::window::leader_stamp`] stamps with.
#[derive(Default)]
struct Clocks {
    /// Node → (its latest reading, when this leader got it).
    latest: std::collections::BTreeMap<u64, (u64, std::time::Instant)>,
    last_stamp: Option<std::time::Instant>,
}

/// A reading older than this is not evidence of the node's clock now.
const FRESH: std::time::Duration = std::time::Duration::from_secs(10);

impl Clocks {
    /// Records each node's newest reading in these observations, replacing
    /// what it said before even when that was later.
    ///
    /// Why replace: a node whose clock jumped a day ahead and back would
    /// otherwise keep its jumped reading here (no honest reading beats it)
    /// for as long as it counts as fresh. A second node's skew within those
    /// 10 s then made two of three readings wrong, the median jumped an
    /// hour, and the window expired every key at once: duplicates in Pulsar
    /// (nemesis seed 21, a one-day jump on node 3 followed 6 s later by a
    /// one-hour skew on node 2).
    fn saw(&mut self, observations: &[Observation]) {
        self.saw_at(observations, std::time::Instant::now());
    }

    fn saw_at(&mut self, observations: &[Observation], now: std::time::Instant) {
        let mut newest = std::collections::BTreeMap::<u64, u64>::new();
        for o in observations {
            let e = newest.entry(o.node).or_insert(o.received_ms);
            *e = (*e).max(o.received_ms);
        }
        for (node, ms) in newest {
            self.latest.insert(node, (ms, now));
        }
    }

    /// Readings of the voters other than `me` that are recent enough.
    fn fresh(&self, voters: &[u64], me: u64, now: std::time::Instant) -> Vec<u64> {
        voters
            .iter()
            .filter(|v| **v != me)
            .filter_map(|v| self.latest.get(v))
            .filter(|(_, at)| now.saturating_duration_since(*at) < FRESH)
            .map(|(ms, _)| *ms)
            .collect()
    }

    /// The stamp for the next entry, on the leader `me`.
    fn stamp(&mut self, raft: &Raft, me: u64, own_ms: u64, window_clock_ms: u64) -> u64 {
        let m = raft.metrics().borrow().clone();
        let voters: Vec<u64> = m.membership_config.membership().voter_ids().collect();
        let fresh = self.fresh(&voters, me, std::time::Instant::now());
        let now = std::time::Instant::now();
        let elapsed = self
            .last_stamp
            .map_or(0, |t| now.duration_since(t).as_millis() as u64);
        self.last_stamp = Some(now);
        firstseen_store::window::leader_stamp(
            own_ms,
            &fresh,
            voters.len().max(1),
            window_clock_ms,
            elapsed,
        )
    }
}

async fn run(
    raft: Raft,
    state: firstseen_store::StateStore,
    window_ms: u64,
    max_bytes: usize,
    mut rx: mpsc::UnboundedReceiver<(Batch, Reply)>,
) {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut carry = None;
    let mut clocks = Clocks::default();
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let first = match carry.take() {
            Some(first) => first,
            None => match rx.recv().await {
                Some(first) => first,
                None => return,
            },
        };
        let mut size = bytes(&first.0);
        let mut group = vec![first];
        while let Ok(next) = rx.try_recv() {
            let more = bytes(&next.0);
            if size + more > max_bytes {
                carry = Some(next);
                break;
            }
            size += more;
            group.push(next);
        }
        let raft = raft.clone();
        for (b, _) in &group {
            clocks.saw(&b.observations);
        }
        let me = raft.metrics().borrow().id;
        let window_clock = state.totals().map(|t| t.clock_ms).unwrap_or(0);
        let stamped_ms = clocks.stamp(&raft, me, now_ms(), window_clock);
        tokio::spawn(async move {
            let _slot = slot;
            let sizes: Vec<usize> = group.iter().map(|(b, _)| b.len()).collect();
            let mut merged = Batch::default();
            let mut replies = Vec::with_capacity(group.len());
            for (b, reply) in group {
                merged.extend(b);
                replies.push(reply);
            }
            let total = merged.len();
            let result = match propose(&raft, window_ms, stamped_ms, merged).await {
                Ok(outcomes) if outcomes.len() != total => Err(ForwardError::Failed(format!(
                    "{} outcomes for {total} observations",
                    outcomes.len()
                ))),
                other => other,
            };
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
        });
    }
}

/// One entry, with the stamp the leader chose: only a leader appends, so the
/// window clock only ever reads leader stamps.
async fn propose(
    raft: &Raft,
    window_ms: u64,
    stamped_ms: u64,
    batch: Batch,
) -> Result<Vec<Outcome>, ForwardError> {
    let cmd = batch.into_command(stamped_ms, window_ms);
    let server = raft.server_metrics();
    let Some(written) = until_deposed(raft.client_write(cmd), server.clone()).await else {
        return Err(ForwardError::NotLeader {
            leader: server.borrow().current_leader,
        });
    };
    match written {
        Ok(resp) => match resp.data {
            Response::Observed(outcomes) => Ok(outcomes),
            other => Err(ForwardError::Failed(format!(
                "unexpected response to a batch: {other:?}"
            ))),
        },
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
            Err(ForwardError::NotLeader {
                leader: f.leader_id,
            })
        }
        Err(e) => Err(ForwardError::Failed(e.to_string())),
    }
}

/// Awaits `write`, or returns `None` once this node has stopped leading in
/// the term it was in when the write began.
///
/// Why: openraft 0.9 answers a write when its entry is applied, and fails it
/// when the entry is truncated; nothing else drains its responders. A leader
/// that steps down and then installs a snapshot covering its entry imports
/// that entry without applying it, so the write waits forever. With one
/// entry in flight ([`IN_FLIGHT`]), every later batch through this node then
/// waited too, once it led again (nemesis seed 288942358, release replay:
/// node 2 led in term 6, installed three snapshots in term 9, led again in
/// term 10, and every forward to it timed out for the rest of the run).
/// The batch goes back to its batcher, which proposes it again; whatever of
/// it did commit comes back as duplicates of itself, as after any repeated
/// forward, and acking those is what G4 allows.
async fn until_deposed<F: Future>(
    write: F,
    mut server: watch::Receiver<RaftServerMetrics<NodeId, Member>>,
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
    use firstseen_store::window::leader_stamp;
    use std::time::{Duration, Instant};

    fn seen(node: u64, received_ms: u64) -> Observation {
        Observation {
            key: [0; 32],
            mqtt_topic: "t".into(),
            pulsar_topic: "p".into(),
            payload: vec![],
            qos: 1,
            retain: false,
            node,
            received_ms,
        }
    }

    /// Seed 21's schedule, replayed on the leader (node 1): node 3's clock
    /// jumps a day ahead and back, then node 2's skews an hour ahead within
    /// the freshness horizon. Only one clock is wrong at a time, so the
    /// stamp must stay near the true time.
    #[test]
    fn a_clock_that_jumped_back_is_not_remembered_ahead() {
        const DAY: u64 = 86_400_000;
        const HOUR: u64 = 3_600_000;
        let t0 = 1_000_000_000_000;
        let start = Instant::now();
        let mut clocks = Clocks::default();
        clocks.saw_at(&[seen(3, t0 + DAY)], start);
        clocks.saw_at(&[seen(3, t0 + 5_000)], start + Duration::from_secs(5));
        clocks.saw_at(
            &[seen(2, t0 + 6_000 + HOUR)],
            start + Duration::from_secs(6),
        );
        let now = start + Duration::from_secs(6);
        let fresh = clocks.fresh(&[1, 2, 3], 1, now);
        let stamp = leader_stamp(t0 + 6_000, &fresh, 3, t0, 0);
        assert!(
            stamp < t0 + 60_000,
            "stamped {} s ahead",
            (stamp - t0) / 1000
        );
    }

    fn server(term: u64, state: ServerState) -> RaftServerMetrics<NodeId, Member> {
        RaftServerMetrics {
            id: 1,
            vote: openraft::Vote::new_committed(term, 1),
            state,
            current_leader: (state == ServerState::Leader).then_some(1),
            membership_config: Arc::new(Default::default()),
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

    #[test]
    fn readings_older_than_the_horizon_do_not_count() {
        let start = Instant::now();
        let mut clocks = Clocks::default();
        clocks.saw_at(&[seen(2, 5), seen(2, 9), seen(3, 7)], start);
        assert_eq!(clocks.fresh(&[1, 2, 3], 1, start), vec![9, 7]);
        assert!(clocks.fresh(&[1, 2, 3], 1, start + FRESH).is_empty());
    }
}
