//! The batcher task.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::port::{Acks, Commit};
use super::{BatchPolicy, Pending};
use crate::ingest::ack::AckToken;
use crate::ingest::Received;
use crate::propose::ProposeError;
use crate::telemetry::{self, Stage};
use firstseen_store::{Outcome, StateStore};

/// What the batcher needs besides its input.
pub struct Batcher {
    pub policy: BatchPolicy,
    /// The group: the node's [`crate::propose::Proposer`].
    pub group: Arc<dyn Commit>,
    /// The upstream sessions: the node's ack gates, indexed like the config.
    pub acks: Arc<dyn Acks>,
    pub state: StateStore,
    pub quota_bytes: u64,
    /// While the disk is below its reserve nothing is proposed either.
    pub disk: Arc<crate::diskspace::DiskSpace>,
    /// Cancelled when the node shuts down: a batch that cannot be committed
    /// is then abandoned unacked (the broker redelivers it).
    pub shutdown: CancellationToken,
}

/// Runs until every ingest task has dropped its sender and the last batch is
/// committed and acked.
pub async fn run(mut b: Batcher, mut rx: mpsc::Receiver<Received>) {
    let mut pending = Pending::default();
    loop {
        let Some(first) = rx.recv().await else { break };
        // The linger runs from the first message's arrival, not from when
        // the batcher got to it: a message that waited out the previous
        // batch's commit in the channel has lingered already. Counting from
        // the pick-up made it wait a commit and then a whole linger (tokio's
        // clock, so that a simulation on a paused clock drives it too).
        let arrived = first.received_at;
        pending.push(first, arrived);
        let mut closed = false;
        while !pending.is_full(&b.policy) {
            let deadline = pending
                .deadline(&b.policy)
                .expect("batch has a first message");
            if deadline <= Instant::now() {
                // Lingered enough: what is already queued goes along, and
                // nothing waits for more.
                while !pending.is_full(&b.policy) {
                    match rx.try_recv() {
                        Ok(item) => pending.push(item, Instant::now()),
                        Err(mpsc::error::TryRecvError::Empty) => break,
                        Err(mpsc::error::TryRecvError::Disconnected) => {
                            closed = true;
                            break;
                        }
                    }
                }
                break;
            }
            tokio::select! {
                item = rx.recv() => match item {
                    Some(item) => pending.push(item, Instant::now()),
                    None => { closed = true; break }
                },
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        if !flush(&mut b, pending.take()).await {
            break;
        }
        if closed {
            break;
        }
    }
    tracing::info!("batcher stopped");
}

/// Commits one batch and acks it. Returns false when shutdown interrupted it.
async fn flush(b: &mut Batcher, items: Vec<Received>) -> bool {
    let mut batch = firstseen_store::Batch::default();
    for i in &items {
        if let Some(o) = &i.observation {
            batch.push_kind(o.clone(), i.properties.clone(), i.kind);
        }
    }
    let observations = &batch.observations;
    if !observations.is_empty() {
        if !wait_for_quota(b).await {
            return false;
        }
        let started = Instant::now();
        for i in items.iter().filter(|i| i.observation.is_some()) {
            telemetry::stage(Stage::Receive, started - i.received_at, 1);
        }
        let mut delay = Duration::from_millis(50);
        let outcomes = loop {
            let leader = b.group.leader();
            match b.group.propose(batch.clone()).await {
                Ok(outcomes) => break outcomes,
                Err(e) => {
                    metrics::counter!("firstseen_propose_errors_total").increment(1);
                    let changed = matches!(e, ProposeError::LeaderChanged { .. });
                    if changed {
                        tracing::info!(error = %e, messages = observations.len(), "leader changed: sending the batch to the new one");
                    } else {
                        tracing::warn!(error = %e, messages = observations.len(), retry_in_ms = delay.as_millis() as u64, "batch not committed; retrying");
                    }
                    // Retried as soon as a new leader is known, or after the
                    // backoff if the leader stays the same.
                    let next_leader = async {
                        if !changed {
                            b.group.leader_moves(leader, delay).await
                        }
                    };
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = next_leader => {}
                        _ = b.shutdown.cancelled() => return false,
                    }
                    if !changed {
                        delay = (delay * 2).min(Duration::from_secs(2));
                    }
                }
            }
        };
        let first = outcomes
            .iter()
            .filter(|o| matches!(o, Outcome::FirstSeen { .. }))
            .count() as u64;
        let dups = outcomes.len() as u64 - first;
        metrics::counter!("firstseen_first_seen_total").increment(first);
        metrics::counter!("firstseen_duplicates_total").increment(dups);
        metrics::counter!("firstseen_batches_total").increment(1);
        let commit = started.elapsed();
        metrics::histogram!("firstseen_commit_seconds").record(commit.as_secs_f64());
        telemetry::stage(Stage::Commit, commit, observations.len() as u64);
        metrics::histogram!("firstseen_batch_messages").record(observations.len() as f64);
    }
    // G4: everything in `items` is now either committed (its entry, or an
    // earlier copy's, is in the state machine) or set aside durably. Acks go
    // out in receive order, per upstream.
    for upstream in 0..b.acks.upstreams() {
        let tokens: Vec<AckToken> = items
            .iter()
            .filter_map(|i| i.ack)
            .filter(|a| a.upstream == upstream)
            .collect();
        if tokens.is_empty() {
            continue;
        }
        let stats = b.acks.ack(upstream, &tokens);
        if stats.stale > 0 || stats.dropped > 0 {
            tracing::debug!(
                upstream,
                stale = stats.stale,
                dropped = stats.dropped,
                "acks not sent; the broker redelivers those messages"
            );
        }
        metrics::counter!("firstseen_acks_total").increment(stats.sent);
    }
    true
}

/// G5 backpressure: while the outbox is over its quota, or this node's disk
/// is below its reserve, nothing new is committed, so nothing is acked and
/// the broker keeps the messages.
async fn wait_for_quota(b: &Batcher) -> bool {
    let mut warned = false;
    loop {
        let bytes = b.state.totals().map(|t| t.outbox_bytes).unwrap_or(0);
        let disk_low = b.disk.is_low();
        if bytes < b.quota_bytes && !disk_low {
            if warned {
                tracing::info!(outbox_bytes = bytes, "accepting again");
                metrics::gauge!("firstseen_backpressure").set(0.0);
            }
            return true;
        }
        if !warned {
            if disk_low {
                tracing::warn!(
                    free_bytes = b.disk.free(),
                    reserve_bytes = b.disk.reserve(),
                    "disk below its reserve; holding upstream acks"
                );
            } else {
                tracing::warn!(
                    outbox_bytes = bytes,
                    quota_bytes = b.quota_bytes,
                    "outbox over quota; holding upstream acks"
                );
            }
            metrics::gauge!("firstseen_backpressure").set(1.0);
            warned = true;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            _ = b.shutdown.cancelled() => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{test_message, BatchPolicy};
    use crate::ingest::ack::AckStats;
    use firstseen_raft::NodeId;
    use firstseen_store::Batch;
    use futures::future::BoxFuture;
    use std::sync::Mutex;

    /// A group that commits after `commit`, recording when each batch was
    /// proposed and how many messages it held.
    struct Slow {
        commit: Duration,
        proposed: Mutex<Vec<(Instant, usize)>>,
    }

    impl Commit for Slow {
        fn propose(&self, batch: Batch) -> BoxFuture<'_, Result<Vec<Outcome>, ProposeError>> {
            self.proposed
                .lock()
                .unwrap()
                .push((Instant::now(), batch.observations.len()));
            Box::pin(async move {
                tokio::time::sleep(self.commit).await;
                Ok(batch
                    .observations
                    .iter()
                    .map(|_| Outcome::FirstSeen { seq: 1 })
                    .collect())
            })
        }
        fn leader(&self) -> Option<NodeId> {
            Some(1)
        }
        fn leader_moves(&self, _: Option<NodeId>, _: Duration) -> BoxFuture<'_, ()> {
            Box::pin(std::future::pending())
        }
    }

    struct NoAcks;
    impl Acks for NoAcks {
        fn upstreams(&self) -> usize {
            0
        }
        fn ack(&self, _: usize, _: &[AckToken]) -> AckStats {
            AckStats::default()
        }
    }

    /// Messages that arrive while a batch commits have waited a commit's
    /// time already: the next batch leaves as soon as the commit returns,
    /// not a whole linger later. Before the fix the second proposal came at
    /// 12 ms (the commit ending at 10 ms, then a 2-ms linger from the
    /// pick-up).
    #[tokio::test(start_paused = true)]
    async fn messages_that_waited_out_a_commit_do_not_linger_again() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new().temporary(true).open().unwrap();
        let group = Arc::new(Slow {
            commit: Duration::from_millis(8),
            proposed: Mutex::new(Vec::new()),
        });
        let batcher = Batcher {
            policy: BatchPolicy {
                max_messages: 100,
                max_bytes: 1 << 20,
                linger: Duration::from_millis(2),
            },
            group: group.clone(),
            acks: Arc::new(NoAcks),
            state: StateStore::open(&db).unwrap(),
            quota_bytes: u64::MAX,
            disk: crate::diskspace::DiskSpace::new(dir.path().to_path_buf(), 0),
            shutdown: CancellationToken::new(),
        };
        let (tx, rx) = mpsc::channel(64);
        let t0 = Instant::now();
        let task = tokio::spawn(run(batcher, rx));
        tx.send(test_message(1, 1)).await.unwrap();
        // Lingers 2 ms for company, then commits for 8 ms; two more arrive
        // at 4 and 5 ms, during the commit.
        tokio::time::sleep(Duration::from_millis(4)).await;
        tx.send(test_message(2, 1)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
        tx.send(test_message(3, 1)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(tx);
        task.await.unwrap();
        let proposed: Vec<(u128, usize)> = group
            .proposed
            .lock()
            .unwrap()
            .iter()
            .map(|(at, n)| ((*at - t0).as_millis(), *n))
            .collect();
        assert_eq!(proposed, vec![(2, 1), (10, 2)]);
    }
}
