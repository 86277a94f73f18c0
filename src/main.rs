//! The `firstseen` command: parses arguments, sets up logging, and hands over
//! to the library's commands (`firstseen::cli`). Exit codes: 0 success, 1 a
//! check found problems (invalid config, verify found duplicates or gaps), 2
//! the command could not run.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use firstseen::cli;

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
    /// Read Pulsar topics back and report duplicate keys, gaps or repeats
    /// in firstseen-seq, and (with --config or --key) messages whose contents
    /// do not have the key they carry. Exit 1 if any are found.
    Verify(cli::verify::Args),
    /// Compare two topics fed by the same upstream over a time range (a
    /// shadow run: the old pipeline's topic beside firstseen's): per side,
    /// messages, distinct keys, keys the other has and it lacks, extra
    /// copies, coverage. Raw and transitdata messages alike. Exit 1 if they
    /// differ.
    Compare(cli::compare::Args),
    /// Add or remove cluster members through any node's admin API (the
    /// request is sent on to the leader). Exit 2 if the change failed.
    Members {
        #[command(subcommand)]
        action: cli::members::Action,
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
    /// Raise the cluster level to the highest every member's release runs
    /// (needed with cluster.upgrade = "manual"; see docs/operations.md,
    /// "Upgrading"). Refused, with the reason, while a member runs an older
    /// release. Exit 2 if it was not raised.
    Upgrade {
        /// Base URL of any node's HTTP API.
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        url: String,
        /// The admin token file (or the cluster secret), as for `members`.
        #[arg(long, env = "FIRSTSEEN_SECRET_FILE", alias = "token-file")]
        secret_file: Option<PathBuf>,
        /// CA (PEM) to trust for an https:// URL, besides the system's roots.
        #[arg(long, env = "FIRSTSEEN_CA_FILE")]
        ca_file: Option<PathBuf>,
    },
    /// Make a stopped node whose cluster lost its majority for good the
    /// only member of a new one, keeping its window, outbox and sequences
    /// (then `members add` grows it back). Refused while the old cluster
    /// still has a quorum. Exit 1 when refused, 2 when it could not run.
    Recover(cli::recover::Args),
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

fn init_logging(format: LogFormat, quiet_clients: bool) {
    // A node logs the Pulsar client's reconnects; the one-shot commands only
    // its errors, so that their output stays the report.
    //
    // openraft is off: it logs every failed heartbeat, replication retry
    // and leadership check at WARN or ERROR, hundreds of lines a minute
    // while one zone is down, none of which asks anything of a person.
    // firstseen says the same once (`cluster::peers`: one line when a peer
    // goes, a reminder a minute, one when it is back; the counts in
    // /metrics), and a storage error openraft meets comes back to firstseen
    // as an error it logs. `RUST_LOG=info,openraft=warn` brings them back,
    // with one "heartbeat error" line for each empty append the leader
    // sends without waiting for its reply (`cluster::network`), which is
    // the normal course under load, not a fault.
    let default = if quiet_clients {
        "info,pulsar=error,openraft=off,sled=warn"
    } else {
        "info,pulsar=warn,openraft=off,sled=warn"
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
            Command::Run { config } => cli::node::run(config).await,
            Command::CheckConfig { file } => cli::node::check_config(file),
            Command::Verify(args) => cli::verify::run(args).await,
            Command::Recover(args) => cli::recover::run(args).await,
            Command::Compare(args) => cli::compare::run(args).await,
            Command::Status {
                url,
                json,
                brief,
                ca_file,
            } => cli::status::run(url, json, brief, ca_file).await,
            Command::Members {
                action,
                url,
                secret_file,
                ca_file,
            } => cli::members::run(action, url, secret_file, ca_file).await,
            Command::Upgrade {
                url,
                secret_file,
                ca_file,
            } => cli::members::send(cli::members::Admin::Upgrade, url, secret_file, ca_file).await,
        }
    });
    // Blocking work still running (a sync that a stopped layer left behind)
    // must not hold the exit up beyond the shutdown bound.
    runtime.shutdown_timeout(Duration::from_secs(1));
    code
}
