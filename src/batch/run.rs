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
        // tokio's clock, so that a simulation on a paused clock drives the
        // linger as it drives everything else.
        pending.push(first, Instant::now());
        let mut closed = false;
        while !pending.is_full(&b.policy) {
            let deadline = pending
                .deadline(&b.policy)
                .expect("batch has a first message");
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
            batch.push(o.clone(), i.properties.clone());
        }
    }
    let observations = &batch.observations;
    if !observations.is_empty() {
        if !wait_for_quota(b).await {
            return false;
        }
        let started = Instant::now();
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
        metrics::histogram!("firstseen_commit_seconds").record(started.elapsed().as_secs_f64());
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
