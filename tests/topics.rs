//! A term's topics on the real broker: a missing topic is created when the
//! broker creates none on its own, and a new leader takes its routes'
//! topics before their first message arrives.
//!
//! Auto-creation is switched off per namespace (the admin API's
//! `autoTopicCreation` policy, which the broker consults before its own
//! `allowAutoTopicCreation`), so these tests run on the shared broker:
//! the broker answers a lookup or a producer of a missing topic in such a
//! namespace with `TopicNotFound`, as a broker configured with
//! `allowAutoTopicCreation=false` does everywhere.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use firstseen::config::RouteConfig;
use serde_json::Value;

/// A namespace of its own on the shared broker in which the broker creates
/// no topic on its own: returns its `tenant/namespace`.
fn namespace_without_auto_creation(pulsar: &Pulsar, name: &str) -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let ns = format!("public/{name}-{n:x}");
    let admin =
        |method: &str, path: &str, body: Option<&str>| admin_call(pulsar, method, path, body);
    assert_eq!(
        admin("PUT", &format!("/admin/v2/namespaces/{ns}"), None),
        "204",
        "create {ns}"
    );
    assert_eq!(
        admin(
            "POST",
            &format!("/admin/v2/namespaces/{ns}/autoTopicCreation"),
            Some(r#"{"allowAutoTopicCreation":false}"#)
        ),
        "204",
        "switch auto-creation off in {ns}"
    );
    // The broker refuses the topic before the node starts: the test then
    // shows the node creating it, not the broker.
    assert_eq!(
        admin(
            "GET",
            &format!("/lookup/v2/topic/persistent/{ns}/probe"),
            None
        ),
        "404",
        "the broker still creates topics in {ns}"
    );
    ns
}

/// The topic's stats from the admin API (`None` while it has none, e.g. it
/// does not exist).
fn topic_stats(pulsar: &Pulsar, topic: &str) -> Option<Value> {
    let path = topic.strip_prefix("persistent://")?;
    let out = Command::new("curl")
        .args(["-sSf", "-m", "5"])
        .arg(format!(
            "{}/admin/v2/persistent/{path}/stats",
            pulsar.admin_url
        ))
        .output()
        .ok()?;
    serde_json::from_slice(&out.stdout).ok()
}

/// On a broker that creates no topics, a node with `pulsar.admin_url`
/// creates its fresh topic and publishes every message into it, exactly
/// once. Before the fix the producer was refused with `TopicNotFound`
/// again and again, and nothing was published.
#[test]
fn a_fresh_topic_is_created_when_the_broker_creates_none() {
    let Some(pulsar) = shared_pulsar("a_fresh_topic_is_created_when_the_broker_creates_none")
    else {
        return;
    };
    let ns = namespace_without_auto_creation(&pulsar, "no-auto");
    let topic = format!("persistent://{ns}/fresh");
    let mqtt = Mosquitto::start();
    let node = Node::start(NodeSpec::new(&mqtt, &pulsar, &topic));
    node.wait_ready();

    let r = replay(mqtt.port, &["--limit", "300", "--pace", "max"]);
    let expected = hfp_pairs(Some(300));
    assert_eq!(r.distinct, expected.len() as u64);
    node.wait_published(expected.len() as u64, Duration::from_secs(60));
    assert_exactly_once(&read_back(&pulsar, &topic), &expected);
    let log = std::fs::read_to_string(node.log_path()).unwrap_or_default();
    assert!(
        log.contains("created through the admin API"),
        "the node did not say it created the topic:\n{}",
        node.log_tail(40)
    );
}

/// Without `pulsar.admin_url` nothing can create the topic: one ERROR names
/// the topic and the setting, however often the publisher tries again, and
/// it tries again with backoff (a handful of attempts in seconds, not a
/// busy loop).
#[test]
fn a_missing_topic_without_the_admin_api_is_one_clear_error() {
    let Some(pulsar) = shared_pulsar("a_missing_topic_without_the_admin_api_is_one_clear_error")
    else {
        return;
    };
    let ns = namespace_without_auto_creation(&pulsar, "no-auto-no-admin");
    let topic = format!("persistent://{ns}/fresh");
    let mqtt = Mosquitto::start();
    let mut spec = NodeSpec::new(&mqtt, &pulsar, &topic);
    spec.config.pulsar.admin_url = None;
    let node = Node::start(spec);
    node.wait_ready();
    replay(mqtt.port, &["--limit", "20", "--pace", "max"]);
    let attempts = |log: &str| {
        log.lines()
            .filter(|l| l.contains("publisher dropped its producer") && l.contains(&topic))
            .count()
    };
    wait_until(
        Duration::from_secs(30),
        "the publisher to have tried a few times",
        || attempts(&std::fs::read_to_string(node.log_path()).unwrap_or_default()) >= 4,
    );
    let log = std::fs::read_to_string(node.log_path()).unwrap_or_default();
    let errors: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("ERROR") && l.contains("allowAutoTopicCreation"))
        .collect();
    assert_eq!(errors.len(), 1, "one ERROR, got:\n{}", errors.join("\n"));
    assert!(
        errors[0].contains(&topic) && errors[0].contains("pulsar.admin_url"),
        "the ERROR names the topic and the setting: {}",
        errors[0]
    );
    assert!(
        topic_stats(&pulsar, &topic).is_none(),
        "the topic was created without the admin API"
    );
    assert_eq!(node.published(), 0);
}

/// Sends `method` to the admin API's `path`; returns the HTTP status.
fn admin_call(pulsar: &Pulsar, method: &str, path: &str, body: Option<&str>) -> String {
    let mut c = Command::new("curl");
    c.args(["-sS", "-m", "10", "-o", "/dev/null", "-w", "%{http_code}"])
        .args(["-X", method])
        .arg(format!("{}{path}", pulsar.admin_url));
    if let Some(body) = body {
        c.args(["-H", "Content-Type: application/json", "-d", body]);
    }
    let out = c.output().expect("curl");
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// A route to a partitioned topic gets one clear ERROR and publishes
/// nothing, and loses nothing: once an operator replaces the topic with a
/// non-partitioned one, every message goes in exactly once. Before the
/// fix, with auto-creation on (the broker's default), the producer took a
/// non-partitioned topic the broker made beside the partitions while the
/// tail read followed the partitions, and no ERROR was logged: the test
/// fails at the ERROR's wait.
#[test]
fn a_partitioned_topic_is_one_clear_error_and_loses_nothing() {
    let Some(pulsar) = shared_pulsar("a_partitioned_topic_is_one_clear_error_and_loses_nothing")
    else {
        return;
    };
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    // A namespace of its own, auto-creation as the broker has it (on).
    let ns = format!("public/partitioned-{n:x}");
    assert_eq!(
        admin_call(&pulsar, "PUT", &format!("/admin/v2/namespaces/{ns}"), None),
        "204"
    );
    let path = format!("/admin/v2/persistent/{ns}/part");
    assert_eq!(
        admin_call(&pulsar, "PUT", &format!("{path}/partitions"), Some("2")),
        "204",
        "create the partitioned topic"
    );
    let topic = format!("persistent://{ns}/part");
    let mqtt = Mosquitto::start();
    let node = Node::start(NodeSpec::new(&mqtt, &pulsar, &topic));
    node.wait_ready();
    let r = replay(mqtt.port, &["--limit", "50", "--pace", "max"]);
    let expected = hfp_pairs(Some(50));
    assert_eq!(r.distinct, expected.len() as u64);

    let log = || std::fs::read_to_string(node.log_path()).unwrap_or_default();
    let attempts = |log: &str| {
        log.lines()
            .filter(|l| l.contains("publisher dropped its producer") && l.contains(&topic))
            .count()
    };
    wait_until(
        Duration::from_secs(30),
        "the publisher to have tried a few times",
        || attempts(&log()) >= 3,
    );
    let text = log();
    let errors: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("ERROR") && l.contains("partitioned"))
        .collect();
    assert_eq!(errors.len(), 1, "one ERROR, got:\n{}", node.log_tail(30));
    assert!(
        errors[0].contains(&topic),
        "the ERROR names the topic: {}",
        errors[0]
    );
    assert_eq!(node.published(), 0);
    assert!(
        topic_stats(&pulsar, &topic).is_none(),
        "a non-partitioned topic was made beside the partitions"
    );

    // The operator replaces it; the next attempt publishes everything.
    assert_eq!(
        admin_call(
            &pulsar,
            "DELETE",
            &format!("{path}/partitions?force=true"),
            None
        ),
        "204",
        "delete the partitioned topic"
    );
    node.wait_published(expected.len() as u64, Duration::from_secs(60));
    assert_exactly_once(&read_back(&pulsar, &topic), &expected);
}

/// The names of the producers the topic has now.
fn publishers(pulsar: &Pulsar, topic: &str) -> Vec<String> {
    topic_stats(pulsar, topic)
        .and_then(|v| {
            v["publishers"].as_array().map(|a| {
                a.iter()
                    .filter_map(|p| p["producerName"].as_str().map(str::to_string))
                    .collect()
            })
        })
        .unwrap_or_default()
}

/// A leader takes the topics its routes name when its term starts, before
/// any message for them arrives: the routed topic has the node's exclusive
/// producer while nothing has been published upstream, and one route's
/// topic that never gets a message holds one too, harmlessly. The messages
/// sent after go in exactly once (the take before them was a whole one:
/// the fence, the barrier and the tail read). Before the change a topic was
/// taken on its first message only.
#[test]
fn a_term_takes_its_routes_topics_before_their_first_message() {
    let Some(pulsar) = shared_pulsar("a_term_takes_its_routes_topics_before_their_first_message")
    else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("early-take");
    let quiet = unique_topic("early-take-quiet");
    let mut spec = NodeSpec::new(&mqtt, &pulsar, &topic);
    // A second route, first in line, whose topic no message of the test
    // goes to.
    spec.config
        .routes
        .insert(0, RouteConfig::new("/quiet/#", quiet.clone()));
    let node = Node::start(spec);
    node.wait_ready();
    for t in [&topic, &quiet] {
        wait_until(
            Duration::from_secs(30),
            "the routed topic to have the leader's producer",
            || !publishers(&pulsar, t).is_empty(),
        );
    }
    assert_eq!(node.published(), 0, "nothing was sent yet");
    assert_eq!(
        node.status().map(|s| s.totals.observed),
        Some(0),
        "no message arrived before the topics were taken"
    );
    // Held, not yet taken: a quiet topic's tail is read on its first
    // message, so that a slow read (a flood of foreign messages) holds up
    // nobody at the term's start. "exclusive producer acquired" is logged
    // once the tail is read.
    let taken = |t: &str| {
        std::fs::read_to_string(node.log_path())
            .unwrap_or_default()
            .lines()
            .any(|l| l.contains("exclusive producer acquired") && l.contains(t))
    };
    assert!(
        !taken(&topic) && !taken(&quiet),
        "a tail was read before any message"
    );

    let r = replay(mqtt.port, &["--limit", "200", "--pace", "max"]);
    let expected = hfp_pairs(Some(200));
    assert_eq!(r.distinct, expected.len() as u64);
    node.wait_published(expected.len() as u64, Duration::from_secs(60));
    assert_exactly_once(&read_back(&pulsar, &topic), &expected);
    assert_eq!(read_back(&pulsar, &quiet).count, 0);
    assert_eq!(publishers(&pulsar, &quiet).len(), 1);
    assert!(
        taken(&topic),
        "the busy topic was taken on its first message"
    );
    assert!(
        !taken(&quiet),
        "the quiet topic's tail was read with nothing to send"
    );
}
