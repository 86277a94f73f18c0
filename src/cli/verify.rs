//! `firstseen verify`: reads topics back and reports duplicate keys, gaps
//! or repeats of sequence numbers, and messages whose contents do not have
//! the key they carry (`crate::verify`). The cluster's messages are told
//! from anyone else's by the proof each carries, checked under the cluster
//! secret: `--config` reads it as the node does, `--secret-file` names it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::config::{Config, PulsarConfig};
use crate::ingest::route::Route;
use crate::key::KeySpec;
use crate::publish::proof::Retired;
use crate::publish::tail::Ours;
use crate::secret::ClusterKey;
use crate::verify::read::Tell;
use crate::verify::KeyRule;

/// A byte key rule, as `--key` spells it (a field key is set by a route).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ByteRule {
    #[value(name = "topic+payload")]
    TopicPayload,
    Payload,
}

impl From<ByteRule> for KeySpec {
    fn from(r: ByteRule) -> Self {
        match r {
            ByteRule::TopicPayload => KeySpec::TOPIC_PAYLOAD,
            ByteRule::Payload => KeySpec::PAYLOAD,
        }
    }
}

/// `firstseen verify`'s arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Take the Pulsar URL and topics (all routes) from this config, and
    /// check each message's key against its route's rule.
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// Pulsar service URL (instead of --config).
    #[arg(long)]
    pub pulsar_url: Option<String>,
    /// Topic to audit; repeat for several. Default: every route's topic.
    #[arg(long)]
    pub topic: Vec<String>,
    /// Also fail unless each topic holds exactly this many of the cluster's
    /// messages.
    #[arg(long)]
    pub expect: Option<u64>,
    /// With --pulsar-url: the cluster secret its messages are proven under;
    /// repeat for the secrets before a rotation (the current one first).
    #[arg(long)]
    pub secret_file: Vec<PathBuf>,
    /// With --pulsar-url: a node's record of the previous secrets'
    /// cut-offs (`retired-secrets.json` in its data directory; --config
    /// reads the node's own). Without one, a previous secret's proof holds
    /// at any sequence, and the report says so.
    #[arg(long)]
    pub retired_secrets: Option<PathBuf>,
    /// Tell the cluster's messages by producer name instead of by proof:
    /// for a topic written by a release from before proofs, or without the
    /// secret. Anyone can name a producer like the cluster's, so the
    /// verdict says the audit is not proven.
    #[arg(long)]
    pub trust_names: bool,
    /// With --pulsar-url: check each message's key against its contents
    /// under this rule (`topic+payload` or `payload`), raw or in the
    /// transitdata envelope.
    #[arg(long, value_enum)]
    pub key: Option<ByteRule>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Give up when no message arrives for this long before the end.
    #[arg(long, default_value_t = 30)]
    pub idle_secs: u64,
}

/// The cluster's secret keys as a node with config `c` has them: its secret
/// file's (or the one a group of one keeps in its data directory), then the
/// previous ones'. Empty when there is none to read.
fn config_keys(c: &Config) -> Result<Vec<ClusterKey>, crate::Error> {
    let current = match &c.cluster.secret_file {
        Some(_) => Some(crate::cluster::load_key(&c.cluster, &c.node.cx())?),
        None => crate::cluster::read_local_key(&c.node.data_dir)?,
    };
    Ok(match current {
        Some(k) => std::iter::once(k)
            .chain(crate::cluster::previous_keys(&c.cluster)?)
            .collect(),
        None => Vec::new(),
    })
}

/// Verifies the topics of `args` (every route's topic of the config when
/// none is given), read from the config's cluster or from the URL.
pub async fn run(args: Args) -> ExitCode {
    let Args {
        config,
        pulsar_url,
        topic: mut topics,
        expect,
        secret_file,
        retired_secrets,
        trust_names,
        key,
        json,
        idle_secs,
    } = args;
    let one_rule = key.map(|k| KeyRule::One(k.into()));
    let (pulsar, rule, keys, retired) = match (config, pulsar_url) {
        (Some(path), None) => match Config::load(&path) {
            Ok(c) => {
                if topics.is_empty() {
                    topics = c.routes.iter().map(|r| r.pulsar_topic.clone()).collect();
                }
                let rule = one_rule.unwrap_or_else(|| KeyRule::Routes(Route::all(&c.routes)));
                let keys = match config_keys(&c) {
                    Ok(k) => k,
                    Err(e) => {
                        eprintln!("error: {e}");
                        return ExitCode::from(2);
                    }
                };
                let retired = c.node.data_dir.join(crate::publish::proof::RETIRED_FILE);
                (c.pulsar, Some(rule), keys, Some(retired))
            }
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        },
        (None, Some(url)) => {
            let mut keys = Vec::new();
            for f in &secret_file {
                match std::fs::read(f) {
                    Ok(raw) => keys.push(ClusterKey::from_secret(&raw)),
                    Err(e) => {
                        eprintln!("error: --secret-file {}: {e}", f.display());
                        return ExitCode::from(2);
                    }
                }
            }
            (PulsarConfig::reader(url), one_rule, keys, retired_secrets)
        }
        _ => {
            eprintln!("error: give exactly one of --config or --pulsar-url");
            return ExitCode::from(2);
        }
    };
    let tell = match (keys.split_first(), trust_names) {
        (_, true) => Tell::Names,
        (Some((current, previous)), false) => {
            let record = match retired.as_deref().map(Retired::load).transpose() {
                Ok(r) => r.unwrap_or_default(),
                Err(e) => {
                    eprintln!("error: the previous secrets' cut-offs: {e}");
                    return ExitCode::from(2);
                }
            };
            let ours = Ours::new(current, previous, false).with_retired(record);
            for id in ours.proofs().unrecorded() {
                eprintln!("verify: warning: no cut-off recorded for the previous secret of cluster id {id}: its proofs count at any sequence, so a forgery made with it, if it leaked, counts as the cluster's (give --config, or --retired-secrets with a node's record)");
            }
            Tell::Proof(ours)
        }
        (None, false) => {
            eprintln!("error: verify tells the cluster's messages from anyone else's by the proof each carries, which needs the cluster secret: give --secret-file (or --config), or --trust-names to audit by producer name, unproven");
            return ExitCode::from(2);
        }
    };
    if topics.is_empty() {
        eprintln!("error: no topic to verify (use --topic)");
        return ExitCode::from(2);
    }
    // By the broker's name: `--topic fs` and the full spelling are one
    // topic, audited once and reported under one name.
    let mut named = std::collections::HashSet::new();
    let topics: Vec<String> = topics
        .iter()
        .map(|t| crate::publish::proof::canonical_topic(t).into_owned())
        .filter(|t| named.insert(t.clone()))
        .collect();
    let mut clean = true;
    let mut reports = Vec::new();
    for topic in &topics {
        let report = crate::verify::read::verify_topic(
            &pulsar,
            topic,
            Duration::from_secs(idle_secs),
            rule.as_ref(),
            &tell,
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
        // Nothing of the cluster's is a finding, unless nothing was expected.
        clean &= if expect == Some(0) {
            report.is_whole()
        } else {
            report.is_clean()
        };
        if let Some(n) = expect {
            // The cluster's messages: anyone else's are reported apart.
            let ours = report.audited();
            if ours != n {
                eprintln!("verify: {topic}: expected {n} of the cluster's messages, found {ours}");
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
