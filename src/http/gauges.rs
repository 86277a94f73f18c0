//! The gauges that follow the state (outbox, window, term, disk, coverage)
//! and the status page's chart samples, taken once a second from the same
//! status the API serves, so that no message pays for them.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::AppState;

/// One point of the status page's charts, taken every [`SAMPLE_EVERY`].
#[derive(Clone, Serialize)]
pub struct Sample {
    pub at_ms: u64,
    /// Copies this node received from its upstreams (cumulative).
    pub received: u64,
    /// Copies committed cluster-wide (cumulative).
    pub observed: u64,
    /// Of those, duplicates (cumulative).
    pub duplicates: u64,
    /// Messages confirmed in Pulsar, over all topics (cumulative).
    pub published: u64,
    pub outbox_messages: u64,
}

/// Chart resolution and span: 5 s samples over 15 minutes.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);
const SAMPLES: usize = 180;

/// Publishes state-derived gauges once a second (per interval, not per
/// message), and records a chart sample every [`SAMPLE_EVERY`].
pub async fn gauges(app: Arc<AppState>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut ticks = 0u64;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.cancelled() => break,
        }
        let Ok(s) = app.status() else { continue };
        {
            let mut w = firstseen_store::lock::lock(&app.publishing);
            let published = s.topics.iter().map(|t| t.published_seq).sum();
            let backlog = s.topics.iter().map(|t| t.backlog).sum();
            w.note(published, backlog, tokio::time::Instant::now());
        }
        metrics::gauge!("firstseen_outbox_messages").set(s.totals.outbox_messages as f64);
        metrics::gauge!("firstseen_outbox_bytes").set(s.totals.outbox_bytes as f64);
        metrics::gauge!("firstseen_window_keys").set(s.totals.window_keys as f64);
        metrics::gauge!("firstseen_raft_term").set(s.term as f64);
        metrics::gauge!("firstseen_raft_is_leader").set(if s.is_leader { 1.0 } else { 0.0 });
        metrics::gauge!("firstseen_raft_leader_id").set(s.leader.unwrap_or(0) as f64);
        metrics::gauge!("firstseen_raft_applied_index").set(s.last_applied.unwrap_or(0) as f64);
        metrics::gauge!("firstseen_disk_bytes").set(s.disk_bytes as f64);
        let snapshot: u64 = std::fs::read_dir(&app.snapshot_dir)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("snap-"))
                    .filter_map(|e| e.metadata().ok())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0);
        metrics::gauge!("firstseen_snapshot_bytes").set(snapshot as f64);
        for c in &s.coverage {
            // "member", not "node": every series already carries this node's
            // own id as the global label `node`.
            let labels = [
                ("member", c.node.to_string()),
                ("member_zone", c.zone.clone()),
            ];
            metrics::gauge!("firstseen_coverage_seen_ratio", &labels).set(c.seen_ratio);
            metrics::gauge!("firstseen_coverage_first_ratio", &labels).set(c.first_ratio);
        }
        if ticks.is_multiple_of(SAMPLE_EVERY.as_secs()) {
            let sample = Sample {
                at_ms: crate::now_ms(),
                received: s.upstreams.iter().map(|u| u.received).sum(),
                observed: s.totals.observed,
                duplicates: s.totals.duplicates,
                published: s.topics.iter().map(|t| t.published_seq).sum(),
                outbox_messages: s.totals.outbox_messages,
            };
            {
                let mut h = firstseen_store::lock::lock(&app.history);
                if h.len() == SAMPLES {
                    h.pop_front();
                }
                h.push_back(sample);
            }
        }
        ticks += 1;
    }
}
