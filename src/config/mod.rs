//! Configuration: TOML, overridable from the environment, validated into
//! typed errors that name the key before anything starts.
//!
//! Environment overrides use the prefix `FIRSTSEEN__` and `__` between path
//! segments; a number selects an array element. For example
//! `FIRSTSEEN__PULSAR__URL=pulsar://10.0.0.5:6650` or
//! `FIRSTSEEN__UPSTREAMS__0__PASSWORD=secret`. The value is read as a TOML
//! scalar when it parses as one (`42`, `true`), otherwise as a string.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::publish::format::Formats;

mod env;
mod files;
mod node;

pub use crate::batch::config::BatchConfig;
pub use crate::cluster::config::{ClusterConfig, MemberConfig, TlsConfig};
pub use crate::ingest::config::{
    DeadLetterConfig, DedupConfig, OversizePolicy, Protocol, RouteConfig, SubscriptionConfig,
    UpstreamConfig,
};
pub use crate::problem::{Problem, Problems};
pub use crate::publish::config::{OAuth2Config, OutboxConfig, PulsarConfig};
pub use node::{HttpTlsConfig, NodeConfig};

/// The whole node configuration.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// This node: identity, storage and HTTP.
    pub node: NodeConfig,
    /// The Raft group. Optional for a group of one.
    #[serde(default)]
    pub cluster: ClusterConfig,
    /// Dedup window and input limits.
    #[serde(default)]
    pub dedup: DedupConfig,
    /// How observations are grouped into Raft entries.
    #[serde(default)]
    pub batch: BatchConfig,
    /// Outbox limits (G5 backpressure).
    #[serde(default)]
    pub outbox: OutboxConfig,
    /// Bounds of the dead-letter store (G5 holds for it too).
    #[serde(default)]
    pub dead_letter: DeadLetterConfig,
    /// Where the deduplicated stream goes.
    pub pulsar: PulsarConfig,
    /// Upstream MQTT brokers this node subscribes to.
    #[serde(default)]
    pub upstreams: Vec<UpstreamConfig>,
    /// MQTT topic filter → Pulsar topic, first match wins.
    #[serde(default)]
    pub routes: Vec<RouteConfig>,
}

/// Constructors with every optional key at its default, for a config
/// built in code (the tests' nodes) rather than read from a file. Each
/// default is the one a file that leaves the key out gets.
impl Config {
    /// A node that subscribes to nothing yet.
    pub fn new(node: NodeConfig, pulsar: PulsarConfig) -> Self {
        Self {
            node,
            cluster: ClusterConfig::default(),
            dedup: DedupConfig::default(),
            batch: BatchConfig::default(),
            outbox: OutboxConfig::default(),
            dead_letter: DeadLetterConfig::default(),
            pulsar,
            upstreams: Vec::new(),
            routes: Vec::new(),
        }
    }

    /// The config as TOML that [`Config::parse`] reads back as it is.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a config is always TOML")
    }
}

impl Config {
    /// Each Pulsar topic's format, as the routes set it.
    pub fn formats(&self) -> Formats {
        Formats::new(
            self.routes
                .iter()
                .map(|r| (r.pulsar_topic.clone(), r.format)),
        )
    }
}

/// Why a config could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {0}", path = .1.display())]
    Syntax(String, PathBuf),
    #[error("{path}: invalid configuration:\n{list}", path = .path.display(), list = list(.problems))]
    Invalid {
        path: PathBuf,
        problems: Vec<Problem>,
    },
}

fn list(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(|p| format!("  - {p}"))
        .collect::<Vec<_>>()
        .join("\n")
}

impl Config {
    /// Reads, overrides from the environment, parses and validates `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path, std::env::vars())
    }

    /// Parses config text with the given environment. Split out so tests can
    /// pass an environment of their own.
    pub fn parse(
        text: &str,
        path: &Path,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let mut value: toml::Value = toml::from_str(text)
            .map_err(|e| ConfigError::Syntax(e.to_string(), path.to_path_buf()))?;
        env::apply_overrides(&mut value, vars).map_err(|problem| ConfigError::Invalid {
            path: path.to_path_buf(),
            problems: vec![problem],
        })?;
        let config: Config = serde_path_to_error::deserialize(value).map_err(|e| {
            let key = e.path().to_string();
            ConfigError::Invalid {
                path: path.to_path_buf(),
                problems: vec![Problem {
                    key: if key == "." {
                        "(top level)".into()
                    } else {
                        key
                    },
                    message: e.into_inner().to_string(),
                }],
            }
        })?;
        let problems = config.problems();
        if problems.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError::Invalid {
                path: path.to_path_buf(),
                problems,
            })
        }
    }

    /// Every problem, not just the first, so one run of `check-config`
    /// shows all there is to fix: each section's own checks (in its
    /// stage's `config.rs`, on the values alone), the checks across
    /// sections, and the files the config names.
    pub fn problems(&self) -> Vec<Problem> {
        let mut p = Problems::default();
        self.node.check(&mut p);
        self.dedup.check(&mut p);
        self.batch.check(&mut p);
        self.outbox.check(&mut p);
        self.dead_letter.check(self.dedup.max_message_bytes, &mut p);
        self.pulsar.check(&mut p);
        crate::ingest::config::check_upstreams(&self.upstreams, &mut p);
        crate::ingest::config::check_routes(&self.routes, &mut p);
        self.cluster.check(&mut p);
        self.check_message_bound(&mut p);
        files::check(self, &mut p);
        p.into_vec()
    }

    /// The largest message ingest lets through, with firstseen's own
    /// properties and the widest route format, must be one the broker takes.
    fn check_message_bound(&self, p: &mut Problems) {
        let envelope = self
            .routes
            .iter()
            .map(|r| r.format.extra_bytes(self.dedup.max_topic_bytes))
            .max()
            .unwrap_or(0);
        let largest = self
            .dedup
            .max_message_bytes
            .saturating_add(crate::publish::props::OWN_BYTES)
            .saturating_add(envelope);
        if largest > self.pulsar.max_message_bytes {
            p.add(
                "dedup.max_message_bytes",
                format!(
                    "{} plus firstseen's own properties (up to {} bytes){} exceeds pulsar.max_message_bytes ({}): \
                     the broker would refuse such a message for ever; lower it or raise pulsar.max_message_bytes to the broker's maxMessageSize",
                    self.dedup.max_message_bytes,
                    crate::publish::props::OWN_BYTES,
                    if envelope > 0 {
                        format!(" and the transitdata envelope (up to {envelope} bytes)")
                    } else {
                        String::new()
                    },
                    self.pulsar.max_message_bytes
                ),
            );
        }
    }

    /// The client id an upstream connection uses.
    pub fn client_id(&self, upstream: &UpstreamConfig) -> String {
        upstream.client_id_on(self.node.id)
    }
}

/// Shortest cluster secret accepted: 32 bytes, what `head -c 32
/// /dev/urandom | base64` makes with room to spare.
pub const MIN_SECRET_BYTES: usize = 32;

/// Every placeholder secret this repository has shipped in a deploy file.
/// A cluster running on one is open to anyone who has read the repository.
const SHIPPED_PLACEHOLDERS: &[&str] = &[
    "replace-me-with-32-random-bytes-base64",
    "replace-with-32-random-bytes-base64",
    "example secret: replace with 32+ random bytes, e.g. head -c 32 /dev/urandom | base64",
];

/// Why a secret is not fit to guard a cluster.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WeakSecret {
    #[error("is empty")]
    Empty,
    #[error("holds a placeholder from the repository's examples; make a secret of your own: head -c 32 /dev/urandom | base64")]
    Placeholder,
    #[error("is {len} bytes, shorter than {MIN_SECRET_BYTES}; make one with: head -c 32 /dev/urandom | base64")]
    Short { len: usize },
}

/// Whether a cluster secret, as read from its file, is fit to guard a
/// cluster: not empty, not shorter than [`MIN_SECRET_BYTES`], not a
/// placeholder from the repository.
pub fn secret_strength(raw: &[u8]) -> Result<(), WeakSecret> {
    let text = String::from_utf8_lossy(raw);
    let secret = text.trim();
    if secret.is_empty() {
        return Err(WeakSecret::Empty);
    }
    if SHIPPED_PLACEHOLDERS.contains(&secret) || secret.starts_with("replace-") {
        return Err(WeakSecret::Placeholder);
    }
    if secret.len() < MIN_SECRET_BYTES {
        return Err(WeakSecret::Short { len: secret.len() });
    }
    Ok(())
}

#[cfg(test)]
mod secret_tests {
    use super::*;

    #[test]
    fn short_and_placeholder_secrets_are_refused() {
        assert_eq!(secret_strength(b"\n"), Err(WeakSecret::Empty));
        assert_eq!(
            secret_strength(b"short\n"),
            Err(WeakSecret::Short { len: 5 })
        );
        for p in SHIPPED_PLACEHOLDERS {
            let err = secret_strength(format!("{p}\n").as_bytes());
            assert_eq!(err, Err(WeakSecret::Placeholder), "{p}");
        }
        assert!(secret_strength(b"q9Jx2vYbT0mC7rWn5uLk8dHs3eAf1gZpQiOyXwVb4Nc=\n").is_ok());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::KeySpec;

    const GOOD: &str = r##"
[node]
id = 1
zone = "a"
data_dir = "/tmp/x"

[pulsar]
url = "pulsar://127.0.0.1:6650"

[[upstreams]]
name = "hsl"
url = "mqtt://127.0.0.1:1883"
[[upstreams.subscriptions]]
filter = "/hfp/v1/#"

[[routes]]
filter = "#"
pulsar_topic = "persistent://public/default/hfp"
"##;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("test.toml"), Vec::new())
    }

    fn problems(text: &str) -> Vec<Problem> {
        match parse(text) {
            Err(ConfigError::Invalid { problems, .. }) => problems,
            other => panic!("expected invalid config, got {other:?}"),
        }
    }

    /// Pulsar and HTTP security settings that cannot work are named before
    /// a node dials anything with them.
    #[test]
    fn bad_pulsar_and_http_tls_settings_are_named() {
        let dir = tempfile::TempDir::new().unwrap();
        let empty = dir.path().join("empty.token");
        std::fs::write(&empty, "\n").unwrap();
        let not_pem = dir.path().join("ca.pem");
        std::fs::write(&not_pem, "not a certificate\n").unwrap();
        let with = |pulsar: &str, node: &str| {
            GOOD.replace(
                "[pulsar]\nurl = \"pulsar://127.0.0.1:6650\"",
                &format!("[pulsar]\n{pulsar}"),
            )
            .replace(
                "data_dir = \"/tmp/x\"",
                &format!("data_dir = \"/tmp/x\"\n{node}"),
            )
        };
        let keys =
            |text: &str| -> Vec<String> { problems(text).into_iter().map(|p| p.key).collect() };
        let k = keys(&with(
            &format!(
                "url = \"pulsar://h:6650\"\nca_file = \"{}\"\nauth_token = \"t\"\nauth_token_file = \"{}\"",
                not_pem.display(),
                empty.display()
            ),
            "",
        ));
        assert!(k.contains(&"pulsar.ca_file".to_string()), "{k:?}");
        assert!(k.contains(&"pulsar.auth_token_file".to_string()), "{k:?}");
        let p = problems(&with(
            &format!(
                "url = \"pulsar+ssl://h:6651\"\nca_file = \"{}\"\n[pulsar.oauth2]\nissuer_url = \"not a url\"\nclient_id = \"\"\nclient_secret_file = \"/nonexistent/secret\"",
                not_pem.display()
            ),
            "",
        ));
        let k: Vec<String> = p.iter().map(|p| p.key.clone()).collect();
        for want in [
            "pulsar.ca_file",
            "pulsar.oauth2.issuer_url",
            "pulsar.oauth2.client_id",
            "pulsar.oauth2.client_secret_file",
        ] {
            assert!(k.contains(&want.to_string()), "{want} missing from {k:?}");
        }
        assert!(
            p.iter().any(|p| p.message.contains("no PEM certificate")),
            "{p:?}"
        );
        let k = keys(&with(
            "url = \"pulsar://127.0.0.1:6650\"",
            &format!(
                "http_tls = {{ cert_file = \"{}\", key_file = \"{}\" }}",
                not_pem.display(),
                not_pem.display()
            ),
        ));
        assert_eq!(k, vec!["node.http_tls.cert_file".to_string()]);
    }

    #[test]
    fn a_minimal_config_parses_with_defaults() {
        let c = parse(GOOD).unwrap();
        assert_eq!(c.dedup.window_secs, 3_600);
        assert_eq!(c.upstreams[0].subscriptions[0].qos, 1);
        assert_eq!(c.routes[0].key, KeySpec::TOPIC_PAYLOAD);
        assert_eq!(c.client_id(&c.upstreams[0]), "firstseen-1-hsl");
    }

    #[test]
    fn an_unknown_key_is_named() {
        let p = problems(&GOOD.replace("zone = \"a\"", "zone = \"a\"\nzoen = \"b\""));
        assert_eq!(p[0].key, "node.zoen");
        assert!(
            p[0].message.contains("unknown field `zoen`"),
            "{}",
            p[0].message
        );
    }

    #[test]
    fn a_wrong_type_is_named_with_its_path() {
        let p = problems(&GOOD.replace(
            "filter = \"/hfp/v1/#\"",
            "filter = \"/hfp/v1/#\"\nqos = \"one\"",
        ));
        assert_eq!(p[0].key, "upstreams[0].subscriptions[0].qos");
        assert!(p[0].message.contains("invalid type"), "{}", p[0].message);
    }

    #[test]
    fn a_missing_route_table_is_an_error() {
        let text = GOOD.split("[[routes]]").next().unwrap().to_string();
        let p = problems(&text);
        assert!(p.iter().any(|p| p.key == "routes"), "{p:?}");
    }

    #[test]
    fn a_message_bound_the_broker_would_refuse_is_named() {
        // A broker configured for 1 MiB messages, firstseen left at 4 MiB:
        // a 2 MiB message would be refused at every reconnect.
        let text = GOOD.replace("[pulsar]", "[pulsar]\nmax_message_bytes = 1048576");
        let p = problems(&text);
        assert!(
            p.iter().any(|p| p.key == "dedup.max_message_bytes"
                && p.message.contains("pulsar.max_message_bytes (1048576)")),
            "{p:?}"
        );
        // Brought under it, with room for firstseen's own properties.
        let text = text.replace(
            "[pulsar]",
            "[dedup]\nmax_payload_bytes = 65536\nmax_message_bytes = 1047552\n\n[pulsar]",
        );
        let c = parse(&text).expect("fits now");
        assert_eq!(c.dedup.max_message_bytes, 1_047_552);
    }

    #[test]
    fn semantic_problems_are_all_listed() {
        let text = GOOD
            .replace("url = \"mqtt://127.0.0.1:1883\"", "url = \"http://x\"")
            .replace("filter = \"#\"", "filter = \"a/#/b\"");
        let keys: Vec<String> = problems(&text).into_iter().map(|p| p.key).collect();
        assert!(keys.contains(&"upstreams[0].url".to_string()), "{keys:?}");
        assert!(keys.contains(&"routes[0].filter".to_string()), "{keys:?}");
    }

    #[test]
    fn environment_overrides_apply_by_path() {
        let vars = vec![
            (
                "FIRSTSEEN__PULSAR__URL".to_string(),
                "pulsar://10.1.1.1:6650".to_string(),
            ),
            (
                "FIRSTSEEN__UPSTREAMS__0__KEEPALIVE_SECS".to_string(),
                "60".to_string(),
            ),
            ("UNRELATED".to_string(), "x".to_string()),
        ];
        let c = Config::parse(GOOD, Path::new("t"), vars).unwrap();
        assert_eq!(c.pulsar.url, "pulsar://10.1.1.1:6650");
        assert_eq!(c.upstreams[0].keepalive_secs, 60);
    }

    #[test]
    fn an_override_of_an_unknown_key_is_still_refused() {
        let vars = vec![("FIRSTSEEN__PULSAR__URLL".to_string(), "x".to_string())];
        match Config::parse(GOOD, Path::new("t"), vars) {
            Err(ConfigError::Invalid { problems, .. }) => {
                assert!(
                    problems[0].message.contains("unknown field `urll`"),
                    "{problems:?}"
                )
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_config_built_in_code_is_the_file_that_leaves_the_rest_out() {
        let from_file = parse(GOOD).unwrap();
        let mut built = Config::new(
            NodeConfig::new(1, "a", "/tmp/x"),
            PulsarConfig::new("pulsar://127.0.0.1:6650"),
        );
        built.upstreams.push(UpstreamConfig::new(
            "hsl",
            "mqtt://127.0.0.1:1883",
            vec![SubscriptionConfig::new("/hfp/v1/#", 1)],
        ));
        built
            .routes
            .push(RouteConfig::new("#", "persistent://public/default/hfp"));
        assert_eq!(built.to_toml(), from_file.to_toml());
    }

    #[test]
    fn a_config_written_as_toml_reads_back_the_same() {
        let mut c = parse(GOOD).unwrap();
        c.cluster.members.push(MemberConfig {
            id: 2,
            zone: "b".into(),
            addr: "127.0.0.1:7000".into(),
            http: String::new(),
        });
        c.cluster.listen = Some("127.0.0.1:7001".parse().unwrap());
        c.cluster.secret_file = Some("/tmp/secret".into());
        c.cluster.tls = Some(TlsConfig::new("/c", "/k", "/ca"));
        c.routes[0].key = KeySpec::Fields(crate::key::FieldKey {
            json: vec!["/VP/veh".into()],
            topic: true,
            missing: crate::key::Missing::DeadLetter,
        });
        c.upstreams[0].protocol = Protocol::V5;
        let text = c.to_toml();
        // Read as `parse` reads it, without the checks of files on disk.
        let back: Config = toml::from_str(&text).unwrap();
        assert_eq!(back.to_toml(), text);
        assert_eq!(back.routes[0].key, c.routes[0].key);
    }
}
