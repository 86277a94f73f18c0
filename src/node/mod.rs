//! One firstseen node: the pipeline's layers as one ordered list
//! ([`order`]): proposals, cluster, observe, publish, acks, batch, intake.
//! They start in that order and stop in reverse within
//! `node.shutdown_timeout_secs`: intake first, then the last batch
//! (committed and acked), the acks, the publisher, HTTP and the watchdogs,
//! the group's tasks, the coalescer, and last Raft and storage (the one
//! place this order is written out; [`run`] builds the list). The core
//! that decides is built in [`core`], shared with the whole-cluster
//! simulation; [`supervise`] makes the node fail fast when a task ends
//! early. Its `[node]` section is declared with the aggregate config
//! (`crate::config::NodeConfig`): the node reads the config, the config
//! names nothing of the node.

pub mod core;
pub mod order;
pub mod reload;
pub mod supervise;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use self::core::{Core, Parts, Ports, Stops, StopsAt};
use self::order::{Share, StopOrder};
use crate::cluster::server;
use crate::cluster::Cluster;
use crate::config::Config;
use crate::http::{self, AppState};
use crate::ingest::route::Route;
use crate::ingest::Upstream;
use crate::publish::adapter::PulsarBroker;
use crate::Error;

/// Messages buffered between the ingest tasks and the batcher. Beyond it,
/// ingest waits, and the broker's in-flight window bounds the rest.
const INGEST_QUEUE: usize = 20_000;

/// Runs a node until `shutdown` is cancelled, then stops it in the order
/// the module describes.
pub async fn run(
    config: Config,
    config_path: Option<std::path::PathBuf>,
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
    let mut order = StopOrder::new(shutdown.clone());
    let cx = config.node.cx();
    let mut cluster = Cluster::start(&config.cluster, &cx, order.tracker()).await?;
    let disk = crate::diskspace::DiskSpace::new(
        config.node.data_dir.clone(),
        config.node.disk_reserve_bytes,
    );
    tracing::info!(node = config.node.id, zone = %config.node.zone, http = %config.node.http_listen, peers = ?config.cluster.listen, "node started");

    // The node's layers in the order they start; they stop in reverse, each
    // once the ones after it have ended (see `order`).
    let proposals = order.add("proposals", Share::Whole);
    let raft = order.add("cluster", Share::Whole);
    let observe = order.add("observe", Share::Whole);
    let publish = order.add("publish", Share::Whole);
    let acks = order.add("acks", Share::Whole);
    // Half the bound goes to the last batch, so that a node without a
    // quorum still flushes and exits.
    let batch = order.add(
        "batch",
        Share::Half {
            late: "the last batch was not committed in time; its messages stay unacked with the broker",
        },
    );
    let intake = order.add("intake", Share::Whole);

    let clock = crate::clock::SystemClock::shared();
    let dead_letter = config.dead_letter.open(&cx);
    let routes = crate::ingest::route::LiveRoutes::new(Route::all(&config.routes));
    let upstreams = Upstream::build(
        &config.upstreams,
        &config.dedup,
        &cx,
        routes.clone(),
        disk.clone(),
        clock.clone(),
        dead_letter.clone(),
    );
    let gates: Vec<_> = upstreams.iter().map(|u| u.gate.clone()).collect();
    let ours = crate::publish::tail::Ours::new(
        &cluster.key,
        &crate::cluster::previous_keys(&config.cluster)?,
        config.cluster.secret_file.is_none(),
    )
    .with_retired(crate::publish::proof::Retired::load(
        &config
            .node
            .data_dir
            .join(crate::publish::proof::RETIRED_FILE),
    )?);
    let superseded = ours.superseded().clone();
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
            ours: ours.clone(),
            incoming: cluster.incoming.clone(),
        },
        Ports {
            call: Arc::new(cluster.peers.clone()),
            clock,
            broker: PulsarBroker {
                config: config.pulsar.clone(),
                state: cluster.state.clone(),
                ours,
            },
            acks: Arc::new(gates),
        },
        Stops {
            batch: order.token(batch),
            publish: order.token(publish),
            services: order.token(raft),
            proposals: order.token(proposals),
        },
        rx,
    );
    // A restart may respell a topic as a reload may: refused the same way
    // below cluster level 3, before anything starts (a review found it was
    // checked on reload only). The level is the one this node's state has
    // applied; a node behind a rise starts with the old spelling, catches
    // up, and takes the new one by reload.
    let held: Vec<String> = cluster
        .state
        .topics()?
        .into_iter()
        .map(|(t, _)| t)
        .collect();
    if let Err(e) = reload::spelling_change(
        cluster.state.level(),
        held.iter().map(String::as_str),
        "cluster's state",
        &config,
    ) {
        let key = match &e {
            reload::ReloadError::Spelling { route, .. } => format!("routes[{route}].pulsar_topic"),
            _ => "routes".to_string(),
        };
        return Err(Error::Setting {
            key,
            problem: e.to_string(),
        });
    }
    let reloader = Arc::new(
        reload::Reloader::new(
            config_path,
            config.clone(),
            routes,
            core.formats.clone(),
            upstreams.iter().map(|u| u.subscriptions.clone()).collect(),
        )
        .with_state(cluster.state.clone()),
    );
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
        key: http::admin_key(config.node.admin_token_file.as_deref(), &cluster.key)?,
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
        superseded,
        levels: core.level_gate.clone(),
        reloader: reloader.clone(),
    });
    let http_tls = match &config.node.http_tls {
        Some(t) => Some(
            crate::tls::http::server_config(t)
                .map_err(|e| Error::setting(format!("node.http_tls.{}", e.key), e.problem))?,
        ),
        None => None,
    };

    // The last step that can fail comes before the first task starts, so a
    // start that fails leaves nothing running.
    let (listener, accepting) =
        http::listener::Listener::start(listener, http_tls, order.token(observe), order.tracker())?;

    // The core's tasks, each in the layer whose stop ends it.
    for (at, name, task) in core.tasks {
        let layer = match at {
            StopsAt::Proposals => proposals,
            StopsAt::Services => raft,
            StopsAt::Publish => publish,
            StopsAt::Batch => batch,
        };
        order.spawn(layer, name, task);
    }
    let stop = order.token(raft);
    if let Some(listener) = peer_listener {
        let serving = server::serve(listener, core.peer_service.clone(), stop.clone());
        order.spawn(raft, "peer listener", serving);
    }
    // Deletes purged log entries; it would run until the storage closes.
    if let Some(reaping) = cluster.reaper.take() {
        let stop = stop.clone();
        order.spawn(raft, "log reaper", async move {
            tokio::select! {
                _ = reaping => {}
                _ = stop.cancelled() => {}
            }
        });
    }
    let following = crate::cluster::follow_disk(cluster.raft.clone(), disk.clone(), stop.clone());
    order.spawn(raft, "heartbeats", following);
    let leadership = crate::cluster::log_leadership(cluster.raft.clone(), stop);
    order.spawn(raft, "leadership log", leadership);

    let stop = order.token(observe);
    order.spawn(observe, "http accept", accepting);
    order.spawn(
        observe,
        "http",
        http::serve(listener, app.clone(), stop.clone()),
    );
    order.spawn(observe, "gauges", http::gauges(app, stop.clone()));
    order.spawn(
        observe,
        "reload on SIGHUP",
        reload_on_hangup(reloader, stop.clone()),
    );
    order.spawn(observe, "disk space", disk.clone().watch(stop.clone()));
    order.spawn(
        observe,
        "dead-letter retention",
        dead_letter.sweep(stop.clone()),
    );
    let watching = crate::watchdog::watch(
        cluster.raft.clone(),
        cluster.disk.log.clone(),
        cluster.disk.state.clone(),
        stop,
    );
    order.spawn(observe, "storage watchdog", watching);

    for u in upstreams {
        let name = u.config.name.clone();
        let task = u.run(tx.clone(), order.token(intake), order.token(acks));
        order.spawn(acks, "upstream", async move {
            if let Err(e) = task.await {
                tracing::error!(upstream = %name, error = %e, "upstream task failed");
            }
        });
    }
    drop(tx);

    let early = tokio::select! {
        _ = shutdown.cancelled() => None,
        e = order.early() => Some(e),
    };
    if let Some(e) = &early {
        tracing::error!(error = %e, "stopping the node: a task it cannot run without has ended; a supervisor restarts it from what is on stable storage");
        shutdown.cancel();
    }
    let bound = Duration::from_secs(config.node.shutdown_timeout_secs);
    tracing::info!(
        bound_secs = bound.as_secs(),
        layers = %order.stop_order(),
        "shutting down: the layers in this order, then raft and storage"
    );
    // A layer that does not end in time is abandoned. Nothing is lost by
    // that: a batch that was not committed was not acked either, and the
    // broker's persistent session redelivers it to whichever node runs next.
    let deadline = order.stop(bound).await;
    // Raft and the final sync get at least a moment even when the layers
    // used the whole bound: everything acked is already durable, so this
    // only shortens the next start.
    let last = deadline.max(tokio::time::Instant::now() + Duration::from_secs(1));
    if tokio::time::timeout_at(last, cluster.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("raft and storage did not stop in time; leaving the rest to recovery");
    }
    // The children (peer connections, dials, handshakes) end with the
    // peers and the listeners; none is left running behind the exit.
    let left = order.wait_all(last).await;
    if left > 0 {
        tracing::warn!(tasks = left, "tasks still running at exit");
    }
    tracing::info!("stopped");
    match early {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

/// Reads the config file again at every SIGHUP (`reload`), until `stop`.
async fn reload_on_hangup(reloader: Arc<reload::Reloader>, stop: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut hangup) = signal(SignalKind::hangup()) else {
        tracing::warn!(
            "cannot listen for SIGHUP: the config is reloaded only through POST /admin/reload"
        );
        stop.cancelled().await;
        return;
    };
    loop {
        tokio::select! {
            _ = hangup.recv() => match reloader.reload() {
                Ok(applied) => tracing::info!(routes = applied.routes, subscriptions = ?applied.subscriptions, "config reloaded (SIGHUP)"),
                Err(e) => tracing::error!(error = %e, "config not reloaded (SIGHUP)"),
            },
            _ = stop.cancelled() => return,
        }
    }
}
