//! `firstseen verify`: reads topics back and reports duplicate keys and
//! gaps or repeats of sequence numbers (`crate::verify`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::config::{Config, PulsarConfig};

/// Verifies `topics` (every route's topic of `config` when none is given),
/// read from the cluster of `config` or from `pulsar_url`.
pub async fn run(
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
        let report = crate::verify::read::verify_topic(
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
