//! Routes and subscriptions changed without a restart, on the real brokers:
//! SIGHUP applies a new route, a changed route and a new subscription; the
//! admin API refuses a file that also changes a setting that needs a
//! restart, naming it, and applies nothing of it. Read back with the
//! official Pulsar client.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use firstseen::config::{RouteConfig, SubscriptionConfig};

fn published(node: &Node, topic: &str) -> u64 {
    node.status()
        .and_then(|s| s.topics.into_iter().find(|t| t.topic == topic))
        .map_or(0, |t| t.published_seq)
}

#[test]
fn routes_and_subscriptions_change_on_sighup_and_other_settings_are_refused() {
    let Some(pulsar) =
        shared_pulsar("routes_and_subscriptions_change_on_sighup_and_other_settings_are_refused")
    else {
        return;
    };
    let mqtt = Mosquitto::start();
    let first = unique_topic("reload-first");
    let moved = unique_topic("reload-moved");
    let other = unique_topic("reload-other");
    let mut node = Node::start(NodeSpec::new(&mqtt, &pulsar, &first));
    node.wait_ready();
    publish(mqtt.port, "/hfp/a", b"1");
    // Not subscribed yet: it stays with the broker's other clients.
    publish(mqtt.port, "/other/a", b"2");
    wait_until(Duration::from_secs(30), "the first message", || {
        published(&node, &first) == 1
    });

    // The running route moves to another topic, and a new subscription
    // with a route of its own comes in: applied on SIGHUP.
    node.spec.config.routes[0].pulsar_topic = moved.clone();
    node.spec
        .config
        .routes
        .push(RouteConfig::new("/other/#", other.clone()));
    node.spec
        .upstream()
        .subscriptions
        .push(SubscriptionConfig::new("/other/#", 1));
    node.write_config();
    node.signal("-HUP");
    wait_until(Duration::from_secs(10), "the reload", || {
        node.log_tail(50).contains("config reloaded (SIGHUP)")
    });
    // The broker has the new subscription before these are published.
    wait_until(Duration::from_secs(10), "the broker's SUBACK", || {
        std::fs::read_to_string(node.log_path())
            .unwrap()
            .matches("the broker acknowledged a subscribe")
            .count()
            >= 2
    });
    publish(mqtt.port, "/hfp/b", b"3");
    publish(mqtt.port, "/other/b", b"4");
    wait_until(Duration::from_secs(30), "both routes published", || {
        published(&node, &moved) == 1 && published(&node, &other) == 1
    });

    // A file that also changes a setting that needs a restart: refused by
    // name, nothing of it applied.
    node.spec.config.routes[0].pulsar_topic = first.clone();
    node.spec.config.pulsar.operation_timeout_ms += 1;
    node.write_config();
    let secret = std::fs::read_to_string(node.secret_file()).unwrap();
    let out = Command::new("curl")
        .args(["-sS", "-w", "\n%{http_code}", "-X", "POST", "-H"])
        .arg(format!("Authorization: Bearer {}", secret.trim()))
        .arg(format!("http://127.0.0.1:{}/admin/reload", node.http_port))
        .output()
        .unwrap();
    let answer = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(answer.ends_with("409"), "{answer}");
    assert!(answer.contains("pulsar.operation_timeout_ms"), "{answer}");
    publish(mqtt.port, "/hfp/c", b"5");
    wait_until(Duration::from_secs(30), "the route still moved", || {
        published(&node, &moved) == 2
    });
    assert_eq!(published(&node, &first), 1);

    let pairs = |t: &str| read_back(&pulsar, t).pairs;
    assert_eq!(pairs(&first), vec![("/hfp/a".into(), "1".into())]);
    assert_eq!(
        pairs(&moved),
        vec![("/hfp/b".into(), "3".into()), ("/hfp/c".into(), "5".into())]
    );
    assert_eq!(pairs(&other), vec![("/other/b".into(), "4".into())]);
}
