//! The `firstseen` command: parses arguments, sets up logging, and hands over
//! to the library. Exit codes: 0 success, 1 a check found problems (invalid
//! config, verify found duplicates or gaps), 2 the command could not run.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use firstseen::config::{Config, PulsarConfig};
use firstseen::http::Status;
use tokio_util::sync::CancellationToken;

// The profile at 4,000 msg/s spent ~16% of each node's time in glibc malloc
// and free (docs/benchmarks.md): every batch allocates payload buffers on one
// task and frees them on another, which is mimalloc's strong case.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "firstseen",
    version,
    about = "Replicated MQTT → Pulsar bridge that keeps exactly the first copy of each message"
)]
struct Cli {
    /// Log format for this process.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "text",
        env = "FIRSTSEEN_LOG_FORMAT"
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run a node until SIGINT or SIGTERM.
    Run {
        /// Node configuration (TOML; FIRSTSEEN__* variables override keys).
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Validate a configuration file without starting anything. Exit 1 and
    /// list every problem, by key, if it is invalid.
    CheckConfig {
        /// The file to check.
        file: PathBuf,
    },
    /// Read Pulsar topics back and report duplicate keys and gaps or repeats
    /// in firstseen-seq. Exit 1 if any are found.
    Verify {
        /// Take the Pulsar URL and topics (all routes) from this config.
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Pulsar service URL (instead of --config).
        #[arg(long)]
        pulsar_url: Option<String>,
        /// Topic to audit; repeat for several. Default: every route's topic.
        #[arg(long)]
        topic: Vec<String>,
        /// Also fail unless each topic holds exactly this many messages.
        #[arg(long)]
        expect: Option<u64>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// Give up when no message arrives for this long before the end.
        #[arg(long, default_value_t = 30)]
        idle_secs: u64,
    },
    /// Add or remove cluster members through any node's admin API (the
    /// request is sent on to the leader). Exit 2 if the change failed.
    Members {
        #[command(subcommand)]
        action: MembersAction,
        /// Base URL of any node's HTTP API.
        #[arg(long, global = true, default_value = "http://127.0.0.1:8080")]
        url: String,
        /// The file with what authorises admin requests: the node's
        /// admin token (node.admin_token_file), or the cluster secret when
        /// the node has none.
        #[arg(
            long,
            global = true,
            env = "FIRSTSEEN_SECRET_FILE",
            alias = "token-file"
        )]
        secret_file: Option<PathBuf>,
        /// CA (PEM) to trust for an https:// URL, besides the system's roots.
        #[arg(long, global = true, env = "FIRSTSEEN_CA_FILE")]
        ca_file: Option<PathBuf>,
    },
    /// Show a node's view of the cluster, from its HTTP API.
    Status {
        /// Base URL of any node's HTTP API.
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        url: String,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
        /// Print one summary line (for watching with a loop).
        #[arg(long, conflicts_with = "json")]
        brief: bool,
        /// CA (PEM) to trust for an https:// URL, besides the system's roots.
        #[arg(long, env = "FIRSTSEEN_CA_FILE")]
        ca_file: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum MembersAction {
    /// Add a node: it joins as a learner, catches up (by snapshot if
    /// needed), then becomes a voter.
    Add {
        #[arg(long)]
        id: u64,
        #[arg(long)]
        zone: String,
        /// Its peer address (host:port).
        #[arg(long)]
        addr: String,
        /// Its HTTP API address (host:port).
        #[arg(long, default_value = "")]
        http: String,
    },
    /// Remove a node from the group.
    Remove {
        #[arg(long)]
        id: u64,
    },
}

fn init_logging(format: LogFormat, quiet_clients: bool) {
    // A node logs the Pulsar client's reconnects; the one-shot commands only
    // its errors, so that their output stays the report.
    let default = if quiet_clients {
        "info,pulsar=error,openraft=warn,sled=warn"
    } else {
        "info,pulsar=warn,openraft=warn,sled=warn"
    };
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colours only for a terminal: a log file, journald or a container's
    // log should not carry escape codes.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let registry = tracing_subscriber::registry()
        .with(filter)
        .with(firstseen::telemetry::RecentEvents);
    match format {
        LogFormat::Text => registry.with(fmt).init(),
        LogFormat::Json => registry.with(fmt.json()).init(),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format, !matches!(cli.command, Command::Run { .. }));
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let code = runtime.block_on(async move {
        match cli.command {
            Command::Run { config } => run(config).await,
            Command::CheckConfig { file } => check_config(file),
            Command::Verify {
                config,
                pulsar_url,
                topic,
                expect,
                json,
                idle_secs,
            } => verify(config, pulsar_url, topic, expect, json, idle_secs).await,
            Command::Status {
                url,
                json,
                brief,
                ca_file,
            } => status(url, json, brief, ca_file).await,
            Command::Members {
                action,
                url,
                secret_file,
                ca_file,
            } => members(action, url, secret_file, ca_file).await,
        }
    });
    // Blocking work still running (a sync that a stopped stage left behind)
    // must not hold the exit up beyond the shutdown bound.
    runtime.shutdown_timeout(Duration::from_secs(1));
    code
}

async fn run(path: PathBuf) -> ExitCode {
    let config = match Config::load(&path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    let upstreams: Vec<String> = config.upstreams.iter().map(|u| u.name.clone()).collect();
    let metrics =
        firstseen::telemetry::install_metrics(config.node.id, &config.node.zone, &upstreams);
    let shutdown = CancellationToken::new();
    let node = firstseen::node::run(config, metrics, shutdown.clone());
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

fn check_config(path: PathBuf) -> ExitCode {
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

async fn verify(
    config: Option<PathBuf>,
    pulsar_url: Option<String>,
    mut topics: Vec<String>,
    expect: Option<u64>,
    json: bool,
    idle_secs: u64,
) -> ExitCode {
    let pulsar = match (config, pulsar_url) {
        (Some(path), None) => match Config::load(&path) {
            Ok(c) => {
                if topics.is_empty() {
                    topics = c.routes.iter().map(|r| r.pulsar_topic.clone()).collect();
                    topics.dedup();
                }
                c.pulsar
            }
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        },
        (None, Some(url)) => PulsarConfig {
            // A reader only: a long timeout for a busy broker, no batches.
            operation_timeout_ms: 30_000,
            publish_batch: 1,
            ..PulsarConfig::new(url)
        },
        _ => {
            eprintln!("error: give exactly one of --config or --pulsar-url");
            return ExitCode::from(2);
        }
    };
    if topics.is_empty() {
        eprintln!("error: no topic to verify (use --topic)");
        return ExitCode::from(2);
    }
    let mut clean = true;
    let mut reports = Vec::new();
    for topic in &topics {
        let report = firstseen::verify::read::verify_topic(
            &pulsar,
            topic,
            Duration::from_secs(idle_secs),
            |n| {
                eprintln!("verify: {topic}: {n} messages read");
            },
        )
        .await;
        let report = match report {
            Ok(r) => r,
            Err(e) => {
                eprintln!("error: {topic}: {e}");
                return ExitCode::from(2);
            }
        };
        clean &= report.is_clean();
        if let Some(n) = expect {
            // Firstseen's messages: a foreign writer's are reported apart.
            let ours = report.messages - report.foreign;
            if ours != n {
                eprintln!("verify: {topic}: expected {n} messages, found {ours}");
                clean = false;
            }
        }
        reports.push(report);
    }
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&reports).unwrap_or_default()
        );
    } else {
        for r in &reports {
            println!("{r}\n");
        }
    }
    if clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// An HTTP client for a node's API that also trusts `ca_file`.
fn api_client(ca_file: Option<&std::path::Path>) -> Result<reqwest::Client, String> {
    // No redirect is followed: an admin request carries a credential, and
    // only the 409 hop below, checked like the first request, may move it.
    let mut b = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none());
    if let Some(ca) = ca_file {
        let pem = std::fs::read(ca).map_err(|e| format!("cannot read {}: {e}", ca.display()))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| format!("{}: {e}", ca.display()))?;
        if certs.is_empty() {
            return Err(format!("{}: no PEM certificate in it", ca.display()));
        }
        for c in certs {
            b = b.add_root_certificate(c);
        }
    }
    b.build().map_err(|e| e.to_string())
}

/// Whether the CLI may send the admin credential to `base`: over https to
/// any host, over plain http only to this host (loopback). A secret sent in
/// the clear to another host is a secret given to the network.
fn credential_may_go_to(base: &str) -> Result<(), String> {
    let url = url::Url::parse(base).map_err(|e| format!("{base}: {e}"))?;
    match url.scheme() {
        "https" => Ok(()),
        "http" => {
            let local = match url.host() {
                Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
                Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
                Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
                None => false,
            };
            if local {
                Ok(())
            } else {
                Err(format!(
                    "refusing to send the admin credential over plain HTTP to {}: use https:// (node.http_tls) or run the command on that host",
                    url.host_str().unwrap_or("?")
                ))
            }
        }
        other => Err(format!("{base}: `{other}` is not http or https")),
    }
}

async fn members(
    action: MembersAction,
    url: String,
    secret_file: Option<PathBuf>,
    ca_file: Option<PathBuf>,
) -> ExitCode {
    let Some(secret_file) = secret_file else {
        eprintln!("error: --secret-file (or FIRSTSEEN_SECRET_FILE) is required for admin requests");
        return ExitCode::from(2);
    };
    let secret = match std::fs::read_to_string(&secret_file) {
        Ok(s) => s.trim_end_matches('\n').to_string(),
        Err(e) => {
            eprintln!("error: cannot read {}: {e}", secret_file.display());
            return ExitCode::from(2);
        }
    };
    if secret.is_empty() || !secret.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        eprintln!(
            "error: {}: the secret must be one line of printable ASCII without spaces to be sent as a bearer token",
            secret_file.display()
        );
        return ExitCode::from(2);
    }
    let client = match api_client(ca_file.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: --ca-file: {e}");
            return ExitCode::from(2);
        }
    };
    let mut base = url.trim_end_matches('/').to_string();
    // The leader is asked with the scheme the operator chose: a hop must
    // not fall back from https to plain HTTP with the secret.
    let scheme = if base.starts_with("https://") {
        "https"
    } else {
        "http"
    };
    // At most one hop: a follower answers 409 with the leader's address.
    for _ in 0..2 {
        let request = match &action {
            MembersAction::Add {
                id,
                zone,
                addr,
                http,
            } => client
                .post(format!("{base}/admin/members"))
                .json(&serde_json::json!({"id": id, "zone": zone, "addr": addr, "http": http})),
            MembersAction::Remove { id } => client.delete(format!("{base}/admin/members/{id}")),
        };
        if let Err(why) = credential_may_go_to(&base) {
            eprintln!("error: {why}");
            return ExitCode::from(2);
        }
        let response = match request.bearer_auth(&secret).send().await {
            Ok(r) => r,
            Err(e) => {
                eprintln!("error: cannot reach {base}: {e}");
                return ExitCode::from(2);
            }
        };
        let status = response.status();
        let body: serde_json::Value = response.json().await.unwrap_or_default();
        if status.is_success() {
            println!("{body}");
            return ExitCode::SUCCESS;
        }
        if status == reqwest::StatusCode::CONFLICT {
            if let Some(leader) = body["leader_http"].as_str().filter(|h| !h.is_empty()) {
                eprintln!("members: {base} is not the leader; asking {leader}");
                base = format!("{scheme}://{leader}");
                continue;
            }
        }
        eprintln!(
            "error: {status}: {}",
            body["error"].as_str().unwrap_or("request failed")
        );
        return ExitCode::from(2);
    }
    eprintln!("error: could not find the leader");
    ExitCode::from(2)
}

async fn status(url: String, json: bool, brief: bool, ca_file: Option<PathBuf>) -> ExitCode {
    let endpoint = format!("{}/status", url.trim_end_matches('/'));
    let client = match api_client(ca_file.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: --ca-file: {e}");
            return ExitCode::from(2);
        }
    };
    let body = match client.get(&endpoint).send().await {
        Ok(r) => match r.error_for_status() {
            Ok(r) => r.text().await,
            Err(e) => {
                eprintln!("error: {endpoint}: {e}");
                return ExitCode::from(2);
            }
        },
        Err(e) => {
            eprintln!("error: cannot reach {endpoint}: {e}");
            return ExitCode::from(2);
        }
    };
    let parsed = body
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_str::<Status>(&b).map_err(|e| e.to_string()));
    let s = match parsed {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {endpoint} did not return status JSON: {e}");
            return ExitCode::from(2);
        }
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&s).unwrap_or_default());
        return ExitCode::SUCCESS;
    }
    let t = &s.totals;
    if brief {
        let published: u64 = s.topics.iter().map(|tp| tp.published_seq).sum();
        println!(
            "received {:>7}  duplicates dropped {:>7}  first copies {:>6}  in Pulsar {:>6}  outbox {:>6}  leader {}",
            t.observed,
            t.duplicates,
            t.window_keys,
            published,
            t.outbox_messages,
            or_dash(s.leader)
        );
        return ExitCode::SUCCESS;
    }
    println!(
        "node {} (zone {})  leader {}  term {}  applied {}",
        s.node,
        s.zone,
        or_dash(s.leader),
        s.term,
        or_dash(s.last_applied)
    );
    println!(
        "observed {}  duplicates {}  window keys {}  outbox {} msgs / {} bytes",
        t.observed, t.duplicates, t.window_keys, t.outbox_messages, t.outbox_bytes
    );
    println!(
        "\n{:<24} {:>10} {:>10}  last error",
        "upstream", "connected", "received"
    );
    for u in &s.upstreams {
        println!(
            "{:<24} {:>10} {:>10}  {}",
            u.name,
            u.connected,
            u.received,
            or_dash(u.last_error.as_ref())
        );
    }
    println!(
        "\n{:<48} {:>10} {:>10} {:>8}",
        "pulsar topic", "last seq", "published", "backlog"
    );
    for tp in &s.topics {
        println!(
            "{:<48} {:>10} {:>10} {:>8}",
            tp.topic, tp.last_seq, tp.published_seq, tp.backlog
        );
    }
    println!(
        "\n{:<6} {:<14} {:>10} {:>10} {:>9} {:>9}",
        "node", "zone", "seen", "first", "seen %", "first %"
    );
    for c in &s.coverage {
        println!(
            "{:<6} {:<14} {:>10} {:>10} {:>8.1}% {:>8.1}%",
            c.node,
            c.zone,
            c.seen,
            c.first,
            c.seen_ratio * 100.0,
            c.first_ratio * 100.0
        );
    }
    ExitCode::SUCCESS
}

/// An optional value as table text: "-" when there is none.
fn or_dash<T: std::fmt::Display>(value: Option<T>) -> String {
    value.map_or_else(|| "-".to_string(), |v| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::credential_may_go_to;

    #[test]
    fn the_admin_credential_goes_in_the_clear_only_to_this_host() {
        for ok in [
            "https://node-2.example:8443",
            "http://127.0.0.1:8080",
            "http://127.3.4.5:8080",
            "http://localhost:8080",
            "http://[::1]:8080",
        ] {
            assert!(credential_may_go_to(ok).is_ok(), "{ok}");
        }
        for refused in [
            "http://10.0.0.2:8080",
            "http://node-2.example:8080",
            "http://[2001:db8::1]:8080",
            "ftp://127.0.0.1",
        ] {
            assert!(credential_may_go_to(refused).is_err(), "{refused}");
        }
    }
}
