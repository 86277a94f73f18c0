//! `firstseen run` and `firstseen check-config`.

use std::path::PathBuf;
use std::process::ExitCode;

use tokio_util::sync::CancellationToken;

use crate::config::Config;

/// Runs a node from the config at `path` until SIGINT or SIGTERM; a second
/// signal exits at once.
pub async fn run(path: PathBuf) -> ExitCode {
    let config = match Config::load(&path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    let upstreams: Vec<String> = config.upstreams.iter().map(|u| u.name.clone()).collect();
    let metrics = crate::telemetry::install_metrics(config.node.id, &config.node.zone, &upstreams);
    let shutdown = CancellationToken::new();
    let node = crate::node::run(config, Some(path), metrics, shutdown.clone());
    tokio::pin!(node);
    let outcome = tokio::select! {
        r = &mut node => r,
        _ = wait_for_signal() => {
            shutdown.cancel();
            // The node stops within node.shutdown_timeout_secs; an operator
            // who cannot wait that long signals again.
            tokio::select! {
                r = &mut node => r,
                _ = wait_for_signal() => {
                    eprintln!("second signal: exiting at once");
                    std::process::exit(130);
                }
            }
        }
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "node failed");
            ExitCode::from(2)
        }
    }
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// Loads the config at `path` and reports every problem, or a summary.
pub fn check_config(path: PathBuf) -> ExitCode {
    match Config::load(&path) {
        Ok(c) => {
            println!(
                "{}: OK (node {} in zone {}, {} upstream(s), {} route(s))",
                path.display(),
                c.node.id,
                c.node.zone,
                c.upstreams.len(),
                c.routes.len()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}
