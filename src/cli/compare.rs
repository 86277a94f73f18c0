//! `firstseen compare`: the shadow run's report (`crate::verify::compare`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::config::{Config, PulsarConfig};
use crate::verify::compare::{Comparison, Window};

use super::verify::ByteRule;

/// `firstseen compare`'s arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The first topic, usually the old pipeline's deduplicated one.
    #[arg(long)]
    pub a: String,
    /// The second topic, usually firstseen's.
    #[arg(long)]
    pub b: String,
    /// What to call the first topic in the report.
    #[arg(long, default_value = "a")]
    pub a_name: String,
    /// What to call the second topic in the report.
    #[arg(long, default_value = "b")]
    pub b_name: String,
    /// Take the Pulsar URL and credentials from this config.
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// Pulsar service URL (instead of --config).
    #[arg(long)]
    pub pulsar_url: Option<String>,
    /// Start of the range: RFC 3339 (`2026-12-04T10:00:00Z`) or ms since
    /// the epoch. Default: the later of the two topics' first messages,
    /// plus the margin.
    #[arg(long)]
    pub from: Option<String>,
    /// End of the range, as --from. Default: the earlier of the two topics'
    /// last messages, less the margin.
    #[arg(long)]
    pub to: Option<String>,
    /// Read this much beyond each end of the range, so that a message one
    /// pipeline stamped just outside it does not count as missing.
    #[arg(long, default_value_t = 60)]
    pub margin_secs: u64,
    /// When two copies are one message: `topic+payload` (what the transitdata
    /// deduplicator compares, and firstseen's default) or `payload`.
    #[arg(long, value_enum, default_value = "topic+payload")]
    pub key: ByteRule,
    /// How many lacked keys to list per side.
    #[arg(long, default_value_t = 10)]
    pub list: usize,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Give up when no message arrives for this long before a topic's end.
    #[arg(long, default_value_t = 30)]
    pub idle_secs: u64,
}

/// Why a time argument was refused.
#[derive(Debug, thiserror::Error)]
#[error("`{0}` is neither RFC 3339 (2026-12-04T10:00:00Z) nor milliseconds since the epoch")]
struct BadTime(String);

fn parse_time(s: &str) -> Result<i64, BadTime> {
    if let Ok(ms) = s.parse::<i64>() {
        return Ok(ms);
    }
    chrono::DateTime::parse_from_rfc3339(s)
        .map(|t| t.timestamp_millis())
        .map_err(|_| BadTime(s.to_string()))
}

/// Compares the two topics of `args`. Exit 0 when they hold the same keys
/// once each, 1 when they differ, 2 when the comparison could not run.
pub async fn run(args: Args) -> ExitCode {
    let times = (
        args.from.as_deref().map(parse_time).transpose(),
        args.to.as_deref().map(parse_time).transpose(),
    );
    let (from, to) = match times {
        (Ok(f), Ok(t)) => (f, t),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let pulsar = match (&args.config, &args.pulsar_url) {
        (Some(path), None) => match Config::load(path) {
            Ok(c) => c.pulsar,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        },
        (None, Some(url)) => PulsarConfig::reader(url.clone()),
        _ => {
            eprintln!("error: give exactly one of --config or --pulsar-url");
            return ExitCode::from(2);
        }
    };
    let client = match crate::publish::connect(&pulsar).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let margin = i64::try_from(args.margin_secs.saturating_mul(1000)).unwrap_or(i64::MAX);
    let range = (
        from.map_or(i64::MIN, |f| f.saturating_sub(margin)),
        to.map_or(i64::MAX, |t| t.saturating_add(margin)),
    );
    // By the broker's name, so a short spelling reads and reports as the
    // full one (and a proof is checked against the name it was made for).
    let a = crate::publish::proof::canonical_topic(&args.a).into_owned();
    let b = crate::publish::proof::canonical_topic(&args.b).into_owned();
    let mut comparison = Comparison::new(args.key.into(), (&args.a_name, &a), (&args.b_name, &b));
    for (side, topic) in [&a, &b].into_iter().enumerate() {
        let read = crate::verify::read::compare_topic(
            &client,
            topic,
            Duration::from_secs(args.idle_secs),
            range,
            &mut comparison,
            side,
            |n| eprintln!("compare: {topic}: {n} messages read"),
        )
        .await;
        if let Err(e) = read {
            eprintln!("error: {topic}: {e}");
            return ExitCode::from(2);
        }
    }
    let window = match (from, to) {
        (Some(f), Some(t)) => Some(Window {
            from_ms: f,
            to_ms: t,
        }),
        _ => comparison.overlap(margin).map(|w| Window {
            from_ms: from.unwrap_or(w.from_ms),
            to_ms: to.unwrap_or(w.to_ms),
        }),
    };
    let Some(window) = window else {
        eprintln!(
            "error: the topics do not overlap by more than twice the margin ({} s); give --from and --to",
            args.margin_secs
        );
        return ExitCode::from(2);
    };
    let report = comparison.finish(window, args.list);
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    } else {
        println!("{report}");
    }
    if report.identical() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc_3339_or_milliseconds() {
        assert_eq!(parse_time("1796380000000").unwrap(), 1_796_380_000_000);
        assert_eq!(
            parse_time("2026-12-04T10:00:00Z").unwrap(),
            parse_time("2026-12-04T12:00:00+02:00").unwrap()
        );
        assert!(parse_time("yesterday").is_err());
    }
}
