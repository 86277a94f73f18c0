//! Routes and subscriptions changed without a restart: SIGHUP, or
//! `POST /admin/reload`, reads the config file again.
//!
//! What can change live: `routes` (filters, Pulsar topics, keys, formats)
//! and each upstream's `subscriptions`. Everything else needs a restart, and
//! a file that changes any of it is refused whole, naming every key that
//! differs: nothing is applied, and the node runs on as it was. A file that
//! does not load (a syntax error, an invalid value) is refused the same way.
//!
//! Each message is routed by the routes of the moment it arrives; a topic's
//! format applies from the next time the publisher takes its producer (a
//! new term, or the topic's first message). A route's key kind changes the
//! window's identity of its messages from then on (cluster level 2): copies
//! of one message received on either side of the change can both be first.
//! Change the routes of every node: each node routes what it receives.
//! A topic's spelling (`fs` or `persistent://public/default/fs`) may change
//! only from cluster level 3, where the state names every topic by its full
//! name; below it the change is refused ([`ReloadError::Spelling`]).
//!
//! [`live_changes`] is the pure rule; [`Reloader`] reads and applies.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde::Serialize;

use crate::config::Config;
use crate::ingest::route::{LiveRoutes, Route};
use crate::publish::format::Formats;

/// Why a reload was refused.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("the config file does not load: {0}")]
    Load(String),
    #[error("these settings cannot change without a restart, and the file changes them: {}; nothing was applied", .0.join(", "))]
    NotLive(Vec<String>),
    #[error("the node was started without a config file to read again")]
    NoFile,
    /// A route names a topic in another spelling than the cluster's state
    /// or the running routes do, while the cluster is below level 3
    /// (`firstseen_store::level::NAMES`): the state would hold the topic
    /// twice, with two sequences and two publishers.
    #[error("routes[{route}].pulsar_topic `{new}` is the topic the {held_by} names `{old}`, spelled another way; the cluster runs at level {level}, below {names}, where a topic's spelling names its outbox, sequence and publisher, so the change would make one Pulsar topic two (messages skipped or sent twice): keep the spelling `{old}` until the cluster reaches level {names} (`firstseen status` shows it; every member must run a release that has it); nothing was applied", names = firstseen_store::level::NAMES)]
    Spelling {
        route: usize,
        new: String,
        old: String,
        held_by: &'static str,
        level: u32,
    },
}

/// What a reload changed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Applied {
    /// Whether the routes changed.
    pub routes: bool,
    /// The upstreams whose subscriptions changed.
    pub subscriptions: Vec<String>,
}

/// The keys that differ between `running` and `new` outside what a reload
/// can change, by their path in the file (`pulsar.url`,
/// `upstreams[0].url`): empty when the file may be applied live.
pub fn live_changes(running: &Config, new: &Config) -> Vec<String> {
    let (Ok(a), Ok(b)) = (toml::Value::try_from(running), toml::Value::try_from(new)) else {
        return vec!["(the config does not serialise)".into()];
    };
    let mut out = Vec::new();
    diff(&a, &b, "", &mut out);
    out
}

/// Whether the value at `path` may change live.
fn live(path: &str) -> bool {
    path == "routes"
        || path.starts_with("routes[")
        || (path.starts_with("upstreams[") && path.ends_with("].subscriptions"))
}

fn diff(a: &toml::Value, b: &toml::Value, path: &str, out: &mut Vec<String>) {
    if live(path) {
        return;
    }
    match (a, b) {
        (toml::Value::Table(x), toml::Value::Table(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match (x.get(k), y.get(k)) {
                    (Some(v), Some(w)) => diff(v, w, &p, out),
                    _ if live(&p) => {}
                    _ => out.push(p),
                }
            }
        }
        (toml::Value::Array(x), toml::Value::Array(y)) if x.len() == y.len() => {
            for (i, (v, w)) in x.iter().zip(y).enumerate() {
                diff(v, w, &format!("{path}[{i}]"), out);
            }
        }
        _ if a == b => {}
        _ => out.push(path.to_string()),
    }
}

/// Reads the config file again and applies what may change live.
pub struct Reloader {
    path: Option<PathBuf>,
    running: Mutex<Config>,
    routes: Arc<LiveRoutes>,
    formats: Formats,
    /// Per upstream, in the config's order.
    subscriptions: Vec<crate::ingest::LiveSubscriptions>,
    /// The cluster's state, for its level and the topics it holds: below
    /// level 3 a topic's spelling may not change.
    state: Option<firstseen_store::StateStore>,
}

/// The first route of `new` that names a topic in another spelling than
/// `held` does (the running routes' topics, or the state's, as `held_by`
/// says), below cluster level 3. At level 3 the state names every topic by
/// its canonical name, and a spelling changes nothing.
pub fn spelling_change<'a>(
    level: u32,
    held: impl IntoIterator<Item = &'a str> + Clone,
    held_by: &'static str,
    new: &Config,
) -> Result<(), ReloadError> {
    if level >= firstseen_store::level::NAMES {
        return Ok(());
    }
    for (route, r) in new.routes.iter().enumerate() {
        let other = held
            .clone()
            .into_iter()
            .find(|t| *t != r.pulsar_topic && firstseen_store::topic::same(t, &r.pulsar_topic));
        if let Some(old) = other {
            return Err(ReloadError::Spelling {
                route,
                new: r.pulsar_topic.clone(),
                old: old.to_string(),
                held_by,
                level,
            });
        }
    }
    Ok(())
}

impl Reloader {
    pub fn new(
        path: Option<PathBuf>,
        running: Config,
        routes: Arc<LiveRoutes>,
        formats: Formats,
        subscriptions: Vec<crate::ingest::LiveSubscriptions>,
    ) -> Self {
        Self {
            path,
            running: Mutex::new(running),
            routes,
            formats,
            subscriptions,
            state: None,
        }
    }

    /// Checks each reload against the cluster's level and topics in `state`.
    pub fn with_state(mut self, state: firstseen_store::StateStore) -> Self {
        self.state = Some(state);
        self
    }

    /// Reads the file, and applies it if only live settings changed.
    pub fn reload(&self) -> Result<Applied, ReloadError> {
        let path = self.path.as_ref().ok_or(ReloadError::NoFile)?;
        let new = Config::load(path).map_err(|e| ReloadError::Load(e.to_string()))?;
        let mut running = firstseen_store::lock::lock(&self.running);
        let refused = live_changes(&running, &new);
        if !refused.is_empty() {
            return Err(ReloadError::NotLive(refused));
        }
        if let Some(state) = &self.state {
            let level = state.level();
            let running_topics: Vec<&str> = running
                .routes
                .iter()
                .map(|r| r.pulsar_topic.as_str())
                .collect();
            spelling_change(
                level,
                running_topics.iter().copied(),
                "running routes",
                &new,
            )?;
            // A topic no route names any more is still in the state, with
            // its sequence and its unpublished messages.
            let held: Vec<String> = state
                .topics()
                .map_err(|e| ReloadError::Load(format!("the state's topics: {e}")))?
                .into_iter()
                .map(|(t, _)| t)
                .collect();
            spelling_change(
                level,
                held.iter().map(String::as_str),
                "cluster's state",
                &new,
            )?;
        }
        let mut applied = Applied::default();
        if !routes_equal(&running, &new) {
            self.routes.replace(Route::all(&new.routes));
            self.formats.replace(&new.formats());
            applied.routes = true;
        }
        for (i, u) in new.upstreams.iter().enumerate() {
            let subs = crate::ingest::subscriptions(u);
            if running.upstreams.get(i).map(crate::ingest::subscriptions) != Some(subs.clone()) {
                if let Some(tx) = self.subscriptions.get(i) {
                    tx.send_replace(subs);
                }
                applied.subscriptions.push(u.name.clone());
            }
        }
        *running = new;
        Ok(applied)
    }
}

fn routes_equal(a: &Config, b: &Config) -> bool {
    toml::Value::try_from(&a.routes).ok() == toml::Value::try_from(&b.routes).ok()
}

/// The HTTP API's reload (`POST /admin/reload`) is this one.
impl crate::http::Reload for Reloader {
    fn reload(&self) -> Result<crate::http::Reloaded, Box<dyn std::error::Error + Send + Sync>> {
        let a = Reloader::reload(self)?;
        Ok(crate::http::Reloaded {
            routes: a.routes,
            subscriptions: a.subscriptions,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{RouteConfig, SubscriptionConfig};

    fn config() -> Config {
        Config::parse(
            r#"
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
filter = "/hfp/#"
qos = 1
[[routes]]
filter = "/hfp/#"
pulsar_topic = "persistent://public/default/t"
"#,
            std::path::Path::new("t.toml"),
            Vec::new(),
        )
        .unwrap()
    }

    /// Below level 3 a topic keeps its spelling: a reload that would name
    /// it otherwise is refused, naming both spellings. From level 3 the
    /// spelling changes nothing, and is applied.
    #[test]
    fn a_topic_keeps_its_spelling_below_level_three() {
        let mut b = config();
        b.routes[0].pulsar_topic = "t".into();
        let running = ["persistent://public/default/t"];
        for level in [1, 2] {
            let e = spelling_change(level, running, "running routes", &b).unwrap_err();
            let text = e.to_string();
            assert!(
                text.contains("`t`") && text.contains("`persistent://public/default/t`"),
                "{text}"
            );
            assert!(text.contains("nothing was applied"), "{text}");
        }
        assert!(spelling_change(3, running, "running routes", &b).is_ok());
        // Another topic, or the same spelling, is no change.
        assert!(spelling_change(2, ["u", "t"], "cluster's state", &b).is_ok());
        assert!(spelling_change(2, ["public/default/t"], "cluster's state", &b).is_err());
    }

    #[test]
    fn routes_and_subscriptions_change_live_and_nothing_else_does() {
        let a = config();
        let mut b = config();
        b.routes.push(RouteConfig::new(
            "/other/#",
            "persistent://public/default/u",
        ));
        b.upstreams[0]
            .subscriptions
            .push(SubscriptionConfig::new("/other/#", 0));
        assert!(
            live_changes(&a, &b).is_empty(),
            "{:?}",
            live_changes(&a, &b)
        );
        b.pulsar.operation_timeout_ms += 1;
        b.upstreams[0].url = "mqtt://elsewhere:1883".into();
        b.dedup.window_secs += 1;
        assert_eq!(
            live_changes(&a, &b),
            vec![
                "dedup.window_secs".to_string(),
                "pulsar.operation_timeout_ms".to_string(),
                "upstreams[0].url".to_string()
            ]
        );
    }
}
