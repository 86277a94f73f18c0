//! One firstseen node: wires ingest → batch → Raft → publish → ack and stops
//! them in that order, within `node.shutdown_timeout_secs`. The core that
//! decides is built in [`core`], shared with the whole-cluster simulation;
//! this file adds the process around it: listeners, HTTP, watchdogs, ingest
//! and the stop order.

pub mod config;
pub mod core;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use self::core::{Core, Parts, Ports, Stops};
use crate::cluster::server;
use crate::cluster::Cluster;
use crate::config::Config;
use crate::http::{self, AppState};
use crate::ingest::route::Route;
use crate::ingest::Upstream;
use crate::publish::adapter::PulsarBroker;
use crate::supervise::Supervisor;
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
        .map_err(|source| Error::Bind {
            key: "node.http_listen",
            addr: config.node.http_listen,
            source,
        })?;
    // Bound before Raft starts, so a taken port fails the start clearly and
    // peers can reach this node as soon as it votes.
    let peer_listener = match config.cluster.listen {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| Error::Bind {
                    key: "cluster.listen",
                    addr,
                    source,
                })?,
        ),
        None => None,
    };
    // Every task of the node runs under the supervisor; a long-running one
    // that ends before the stop stops the node (see crate::supervise).
    let mut tasks = Supervisor::new(shutdown.clone());
    let mut cluster = Cluster::start(&config, tasks.tracker()).await?;
    let disk = crate::diskspace::DiskSpace::new(
        config.node.data_dir.clone(),
        config.node.disk_reserve_bytes,
    );
    tracing::info!(node = config.node.id, zone = %config.node.zone, http = %config.node.http_listen, peers = ?config.cluster.listen, "node started");
    let services = CancellationToken::new();
    let proposals = CancellationToken::new();
    let clock = crate::clock::SystemClock::shared();

    let dead_letter = crate::ingest::deadletter::DeadLetter::open(
        config.node.data_dir.join("dead-letter"),
        crate::ingest::deadletter::Bounds {
            max_bytes: config.dead_letter.max_bytes,
            retention_ms: config.dead_letter.retention_secs.saturating_mul(1000),
        },
    );
    let upstreams = Upstream::from_config(
        &config,
        Route::all(&config.routes),
        disk.clone(),
        clock.clone(),
        dead_letter.clone(),
    );
    let gates: Vec<_> = upstreams.iter().map(|u| u.gate.clone()).collect();
    let (tx, rx) = mpsc::channel(INGEST_QUEUE);
    let core = Core::build(
        &config,
        Parts {
            raft: cluster.raft.clone(),
            state: cluster.state.clone(),
            outbox: cluster.outbox.clone(),
            liveness: cluster.liveness.clone(),
            key: cluster.key.clone(),
            tls: cluster.tls.clone(),
            disk: disk.clone(),
            dead_letter: dead_letter.clone(),
        },
        Ports {
            call: Arc::new(cluster.peers.clone()),
            clock,
            broker: PulsarBroker {
                config: config.pulsar.clone(),
                state: cluster.state.clone(),
                ours: crate::publish::tail::Ours::of(
                    config.cluster.secret_file.is_some().then_some(&cluster.key),
                ),
            },
            acks: Arc::new(gates),
        },
        Stops {
            batch: shutdown.clone(),
            services: services.clone(),
            proposals: proposals.clone(),
        },
        rx,
    );
    let coalescer_task = tasks.spawn("coalescer", core.coalescer);
    // Deletes purged log entries; it would run until the storage closes.
    let reaper_task = cluster.reaper.take().map(|reaping| {
        let stop = services.clone();
        tasks.spawn("log reaper", async move {
            tokio::select! {
                _ = reaping => {}
                _ = stop.cancelled() => {}
            }
        })
    });

    let app = Arc::new(AppState {
        node_id: config.node.id,
        zone: config.node.zone.clone(),
        raft: cluster.raft.clone(),
        state: cluster.state.clone(),
        log_db: cluster.disk.log.clone(),
        upstreams: upstreams
            .iter()
            .map(|u| (u.config.name.clone(), u.status.clone()))
            .collect(),
        metrics,
        key: crate::cluster::load_admin_key(&config, &cluster.key)?,
        allow_plaintext_admin: config.node.allow_plaintext_admin,
        admin_refusals: crate::telemetry::RefusalLog::new(
            "firstseen_admin_refused_total",
            "admin request",
        ),
        snapshot_dir: config.node.data_dir.join("raft/snapshots"),
        history: Default::default(),
        disk: disk.clone(),
        liveness: cluster.liveness.clone(),
        timing: cluster.timing,
        publishing: Default::default(),
    });

    let peer_task = peer_listener.map(|listener| {
        tasks.spawn(
            "peer listener",
            server::serve(listener, core.peer_service.clone(), services.clone()),
        )
    });
    let http_tls = match &config.node.http_tls {
        Some(t) => Some(
            crate::tls::http::server_config(t)
                .map_err(|e| Error::setting(format!("node.http_tls.{}", e.key), e.problem))?,
        ),
        None => None,
    };
    let (listener, accepting) =
        http::listener::Listener::start(listener, http_tls, services.clone(), tasks.tracker())?;
    let accept_task = tasks.spawn("http accept", accepting);
    let http_task = tasks.spawn("http", http::serve(listener, app.clone(), services.clone()));
    let gauge_task = tasks.spawn("gauges", http::gauges(app.clone(), services.clone()));
    let leadership_task = tasks.spawn(
        "leadership log",
        crate::cluster::log_leadership(cluster.raft.clone(), services.clone()),
    );
    let disk_task = tasks.spawn("disk space", disk.clone().watch(services.clone()));
    let sweep_task = tasks.spawn("dead-letter retention", dead_letter.sweep(services.clone()));
    let watchdog_task = tasks.spawn(
        "storage watchdog",
        crate::watchdog::watch(
            cluster.raft.clone(),
            cluster.disk.log.clone(),
            cluster.disk.state.clone(),
            services.clone(),
        ),
    );
    let elect_task = tasks.spawn("elections", core.elections);
    let lease_task = tasks.spawn("lease", core.lease);
    let heartbeat_task = tasks.spawn(
        "heartbeats",
        crate::cluster::follow_disk(cluster.raft.clone(), disk.clone(), services.clone()),
    );
    let publisher = tasks.spawn("publisher", core.publisher);
    let batcher = tasks.spawn("batcher", core.batcher);
    let acks_done = CancellationToken::new();
    let mut ingest = Vec::new();
    for u in upstreams {
        let name = u.config.name.clone();
        let task = u.run(tx.clone(), shutdown.clone(), acks_done.clone());
        ingest.push(tasks.spawn("upstream", async move {
            if let Err(e) = task.await {
                tracing::error!(upstream = %name, error = %e, "upstream task failed");
            }
        }));
    }
    drop(tx);

    let early = tokio::select! {
        _ = shutdown.cancelled() => None,
        e = tasks.early() => Some(e),
    };
    if let Some(e) = &early {
        tracing::error!(error = %e, "stopping the node: a task it cannot run without has ended; a supervisor restarts it from what is on stable storage");
        shutdown.cancel();
    }
    let bound = Duration::from_secs(config.node.shutdown_timeout_secs);
    let deadline = tokio::time::Instant::now() + bound;
    tracing::info!(
        bound_secs = bound.as_secs(),
        "shutting down: ingest, batcher, publisher, raft, storage"
    );
    // Each stage gets what is left of the bound; a stage that does not end
    // in time is abandoned. Nothing is lost by that: a batch that was not
    // committed was not acked either, and the broker's persistent session
    // redelivers it to whichever node runs next. Half the bound goes to the
    // last batch, so that a node without a quorum still flushes and exits.
    let batch_deadline = tokio::time::Instant::now() + bound / 2;
    if !finish(batcher, batch_deadline, "batcher").await {
        tracing::warn!(
            "the last batch was not committed in time; its messages stay unacked with the broker"
        );
    }
    acks_done.cancel();
    for t in ingest {
        finish(t, deadline, "upstream").await;
    }
    services.cancel();
    finish(publisher, deadline, "publisher").await;
    for t in [
        gauge_task,
        http_task,
        accept_task,
        disk_task,
        sweep_task,
        watchdog_task,
        heartbeat_task,
        elect_task,
        lease_task,
        leadership_task,
    ] {
        finish(t, deadline, "service").await;
    }
    for t in peer_task.into_iter().chain(reaper_task) {
        finish(t, deadline, "service").await;
    }
    proposals.cancel();
    finish(coalescer_task, deadline, "coalescer").await;
    // Raft and the final sync get at least a moment even when the stages
    // before used the whole bound: everything acked is already durable, so
    // this only shortens the next start.
    let last = deadline.max(tokio::time::Instant::now() + Duration::from_secs(1));
    if tokio::time::timeout_at(last, cluster.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("raft and storage did not stop in time; leaving the rest to recovery");
    }
    // The children (peer connections, dials, handshakes) end with the
    // peers and the listeners; none is left running behind the exit.
    let left = tasks.wait_all(last).await;
    if left > 0 {
        tracing::warn!(tasks = left, "tasks still running at exit");
    }
    tracing::info!("stopped");
    match early {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

/// Waits for a task until `deadline`, then aborts it. Returns whether it
/// ended by itself. A task that panicked is logged, not hidden.
async fn finish(
    mut task: tokio::task::JoinHandle<()>,
    deadline: tokio::time::Instant,
    what: &str,
) -> bool {
    match tokio::time::timeout_at(deadline, &mut task).await {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            tracing::error!(task = what, error = %e, "task failed");
            true
        }
        Err(_) => {
            tracing::warn!(task = what, "did not stop in time; abandoned");
            task.abort();
            false
        }
    }
}
