//! One firstseen node: wires ingest → batch → Raft → publish → ack and stops
//! them in that order.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::batch::{self, BatchPolicy, Batcher};
use crate::cluster::coalesce::Coalescer;
use crate::cluster::server::{self, PeerService};
use crate::cluster::{Cluster, Proposer};
use crate::config::Config;
use crate::http::{self, AppState};
use crate::ingest::route::Route;
use crate::ingest::Upstream;
use crate::publish::Publisher;
use crate::Error;

/// Messages buffered between the ingest tasks and the batcher. Beyond it,
/// ingest waits, and the broker's in-flight window bounds the rest.
const INGEST_QUEUE: usize = 20_000;

/// Runs a node until `shutdown` is cancelled, then stops it in order:
/// ingest, the last batch (committed and acked), the publisher, Raft, and a
/// final sled flush.
pub async fn run(
    config: Config,
    metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let listener = tokio::net::TcpListener::bind(config.node.http_listen)
        .await
        .map_err(|e| Error::Config(format!("node.http_listen {}: {e}", config.node.http_listen)))?;
    // Bound before Raft starts, so a taken port fails the start clearly and
    // peers can reach this node as soon as it votes.
    let peer_listener = match config.cluster.listen {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| Error::Config(format!("cluster.listen {addr}: {e}")))?,
        ),
        None => None,
    };
    let cluster = Cluster::start(&config).await?;
    tracing::info!(node = config.node.id, zone = %config.node.zone, http = %config.node.http_listen, peers = ?config.cluster.listen, "node started");
    let proposer = Proposer {
        raft: cluster.raft.clone(),
        node_id: config.node.id,
        peers: cluster.peers.clone(),
        coalescer: Coalescer::start(
            cluster.raft.clone(),
            config.dedup.window_secs * 1_000,
            config.batch.max_bytes,
        ),
    };

    let routes: Arc<Vec<Route>> = Arc::new(
        config
            .routes
            .iter()
            .map(|r| Route {
                filter: r.filter.clone(),
                pulsar_topic: r.pulsar_topic.clone(),
                key: r.key,
            })
            .collect(),
    );
    let upstreams = Upstream::from_config(&config, routes);
    let gates = upstreams.iter().map(|u| u.gate.clone()).collect();
    let app = Arc::new(AppState {
        node_id: config.node.id,
        zone: config.node.zone.clone(),
        raft: cluster.raft.clone(),
        state: cluster.state.clone(),
        log_db: cluster.log_db.clone(),
        upstreams: upstreams
            .iter()
            .map(|u| (u.config.name.clone(), u.status.clone()))
            .collect(),
        metrics,
        key: cluster.key.clone(),
        snapshot_file: config.node.data_dir.join("raft/snapshots/current.snap"),
        history: Default::default(),
    });

    let services = CancellationToken::new();
    let peer_task = peer_listener.map(|listener| {
        let service = Arc::new(PeerService {
            node_id: config.node.id,
            raft: cluster.raft.clone(),
            key: cluster.key.clone(),
            proposer: proposer.clone(),
            tls: cluster.tls.clone(),
        });
        tokio::spawn(server::serve(listener, service, services.clone()))
    });
    let http_task = tokio::spawn(http::serve(listener, app.clone(), services.clone()));
    let gauge_task = tokio::spawn(http::gauges(app.clone(), services.clone()));
    tokio::spawn(crate::cluster::log_leadership(
        cluster.raft.clone(),
        services.clone(),
    ));
    let publisher = tokio::spawn(
        Publisher {
            raft: cluster.raft.clone(),
            state: cluster.state.clone(),
            outbox: cluster.outbox.clone(),
            node_id: config.node.id,
            config: config.pulsar.clone(),
            shutdown: services.clone(),
        }
        .run(),
    );

    let (tx, rx) = mpsc::channel(INGEST_QUEUE);
    let batcher = tokio::spawn(batch::run(
        Batcher {
            policy: BatchPolicy {
                max_messages: config.batch.max_messages,
                max_bytes: config.batch.max_bytes,
                linger: Duration::from_millis(config.batch.linger_ms),
            },
            proposer,
            gates,
            state: cluster.state.clone(),
            quota_bytes: config.outbox.quota_bytes,
            shutdown: shutdown.clone(),
        },
        rx,
    ));
    let acks_done = CancellationToken::new();
    let mut ingest = Vec::new();
    for u in upstreams {
        let name = u.config.name.clone();
        let task = u.run(tx.clone(), shutdown.clone(), acks_done.clone());
        ingest.push(tokio::spawn(async move {
            if let Err(e) = task.await {
                tracing::error!(upstream = %name, error = %e, "upstream task failed");
            }
        }));
    }
    drop(tx);

    shutdown.cancelled().await;
    tracing::info!("shutting down: ingest, batcher, publisher, raft, storage");
    // Ingest tasks drop their senders on shutdown; the batcher then commits
    // and acks what it holds and ends.
    let _ = batcher.await;
    acks_done.cancel();
    for t in ingest {
        let _ = t.await;
    }
    services.cancel();
    let _ = publisher.await;
    let _ = gauge_task.await;
    let _ = http_task.await;
    if let Some(t) = peer_task {
        let _ = t.await;
    }
    cluster.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}
