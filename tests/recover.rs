//! A lone survivor brought back: two of three zones gone for good mid-load,
//! the third made a cluster of one with `firstseen recover
//! --force-new-cluster`, grown back with two empty nodes, on the real
//! brokers. Read back with the official Pulsar client and `firstseen verify`.

mod common;

use std::process::Command;
use std::time::Duration;

use common::cluster::TestCluster;
use common::*;

fn recover(node: &Node) -> std::process::Output {
    Command::new(bin())
        .args(["recover", "--force-new-cluster", "--config"])
        .arg(node.config_path())
        .output()
        .expect("firstseen recover runs")
}

fn add(c: &mut TestCluster, leader: u64, id: u64, addr: &str, http: &str) {
    let url = format!("http://127.0.0.1:{}", c.node(leader).http_port);
    let out = Command::new(bin())
        .args(["members", "add", "--id", &id.to_string(), "--zone"])
        .arg(format!("zone-{id}"))
        .args([
            "--addr",
            addr,
            "--http",
            http,
            "--url",
            &url,
            "--secret-file",
        ])
        .arg(c.secret_file())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "members add {id}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The recovery is refused while the old cluster still has a quorum; then
/// the two followers are killed for good in the middle of the capture, the
/// leader (which holds every committed entry) is stopped and recovered,
/// starts as a cluster of one with its window and outbox, publishes what
/// waited, and takes two new, empty members, which catch up. A replay of
/// the capture after that is all duplicates, and the new group survives
/// the loss of the recovered node: every acked message in Pulsar once.
#[test]
fn a_lone_survivor_recovers_as_a_cluster_of_one_and_grows_back() {
    let Some(pulsar) = shared_pulsar("a_lone_survivor_recovers_as_a_cluster_of_one_and_grows_back")
    else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("recover");
    let mut c = TestCluster::start(&mqtt, &pulsar, &topic, 3, |_| {});
    c.wait_ready();
    let survivor = c.wait_leader(None, Duration::from_secs(30));
    let lost: Vec<u64> = (1..=3).filter(|id| *id != survivor).collect();

    // With the other two running, the old cluster has its quorum: refused.
    c.node(lost[0])
        .terminate(Duration::from_secs(20))
        .expect("stops");
    let out = recover(c.node(lost[0]));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("still has a quorum"),
        "{out:?}"
    );
    c.node(lost[0]).restart();
    c.wait_ready();

    let mut load = replay_cmd(mqtt.port, &["--pace", "2000"]).spawn().unwrap();
    wait_until(
        Duration::from_secs(60),
        "half the capture published",
        || c.node(survivor).published() > 2_000,
    );
    for id in &lost {
        c.node(*id).kill9();
        c.node(*id).wipe();
    }
    assert!(load.wait().unwrap().success());
    // Alone it cannot commit; it stops within its bound.
    c.node(survivor)
        .terminate(Duration::from_secs(30))
        .expect("stops");
    let out = recover(c.node(survivor));
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    eprintln!("recover: {said}");
    assert!(said.contains("only member"), "{said}");
    c.node(survivor).restart();
    c.node(survivor)
        .wait_published(HFP_DISTINCT, Duration::from_secs(120));

    // Grown back with two empty nodes of new ids.
    for id in [4, 5] {
        let (addr, http) = c.start_joiner(id, |_| {});
        add(&mut c, survivor, id, &addr, &http);
    }
    for id in [4, 5] {
        wait_until(
            Duration::from_secs(60),
            "a new member holds the window",
            || {
                c.node(id)
                    .status()
                    .is_some_and(|s| s.totals.window_keys == HFP_DISTINCT)
            },
        );
    }
    replay(mqtt.port, &["--pace", "max"]);
    // The recovered node is lost in turn: the two new ones carry on.
    c.node(survivor).kill9();
    let leader = c.wait_leader_among(&[4, 5], Some(survivor), Duration::from_secs(30));
    let before = c.node(leader).status().unwrap().totals.observed;
    replay(mqtt.port, &["--pace", "max"]);
    // Both remaining zones deliver every line of the capture once more.
    wait_until(Duration::from_secs(60), "the new group settled", || {
        c.node(leader).status().is_some_and(|s| {
            s.totals.outbox_messages == 0 && s.totals.observed >= before + 2 * 5_000
        })
    });
    assert_exactly_once(&read_back(&pulsar, &topic), &hfp_pairs(None));
    let (code, report) = verify(&pulsar, &topic, Some(HFP_DISTINCT), &c.secret_file());
    assert_eq!(code, 0, "{report}");
}

/// Issue 49 item 2: the survivor lagged. A follower is paused (SIGSTOP)
/// while the other two commit and publish a part of the capture it never
/// receives; those two are lost for good; the survivor is recovered while
/// the rest of the capture queues upstream for it (its MQTT session is
/// persistent, so the part it missed is queued too), then started. It
/// reads what the lost members published above its watermark, takes their
/// keys into its window and numbers its own messages after them: every
/// key in Pulsar once, the sequence 1..=n in order. Before the rebase the
/// survivor took the lost members' messages for its own tail (or called
/// them forged), resumed below them, and published what they had again.
#[test]
fn a_lagging_survivor_continues_after_what_the_lost_members_published() {
    let Some(pulsar) =
        shared_pulsar("a_lagging_survivor_continues_after_what_the_lost_members_published")
    else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("lagging");
    let mut c = TestCluster::start(&mqtt, &pulsar, &topic, 3, |_| {});
    c.wait_ready();
    let leader = c.wait_leader(None, Duration::from_secs(30));
    let survivor = (1..=3).find(|id| *id != leader).unwrap();
    let lost: Vec<u64> = (1..=3).filter(|id| *id != survivor).collect();

    // The survivor lags: paused in the middle of the feed (so its outbox
    // may hold messages the others publish), while the others commit and
    // publish more.
    let mut load = replay_cmd(mqtt.port, &["--pace", "2000", "--limit", "3000"])
        .spawn()
        .unwrap();
    wait_until(
        Duration::from_secs(30),
        "the survivor applied a part",
        || c.node(survivor).published() > 800,
    );
    c.node(survivor).signal("-STOP");
    let before = c.node(leader).published();
    assert!(load.wait().unwrap().success());
    wait_until(Duration::from_secs(60), "the others published it", || {
        c.node(leader).status().is_some_and(|s| {
            s.topics
                .iter()
                .any(|t| t.published_seq > before + 1_000 && t.backlog == 0)
        })
    });
    let published_by_lost = c.node(leader).published();
    for id in &lost {
        c.node(*id).kill9();
        c.node(*id).wipe();
    }
    // SIGKILL ends a stopped process too.
    c.node(survivor).kill9();
    let out = recover(c.node(survivor));
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    eprintln!("recover: {said}");
    assert!(said.contains("generation 1"), "{said}");
    // The rest of the capture queues upstream for the stopped survivor.
    replay(mqtt.port, &["--pace", "max", "--skip", "3000"]);
    c.node(survivor).restart();
    c.node(survivor)
        .wait_published(HFP_DISTINCT, Duration::from_secs(60));
    eprintln!("the lost members published up to {published_by_lost}");
    let back = read_back(&pulsar, &topic);
    assert!(
        back.late().is_empty(),
        "sequences went backwards: {:?}",
        &back.late()[..back.late().len().min(10)]
    );
    assert_exactly_once(&back, &hfp_pairs(None));
    let (code, report) = verify(&pulsar, &topic, Some(HFP_DISTINCT), &c.secret_file());
    assert_eq!(code, 0, "{report}");
    let log = c.node(survivor).log_tail(400);
    let rebased: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("numbered after them"))
        .collect();
    assert!(!rebased.is_empty(), "no rebase logged:\n{log}");
    eprintln!("{}", rebased.join("\n"));
}

/// Issue 49 item 3: the old cluster was not gone. Its two other members
/// were stopped, not lost, when the operator recovered the third; the
/// recovered node (generation 1) published part of the feed alone; then it
/// stopped and the old pair came back with the rest of the feed queued for
/// them. The old leader takes the topic, finds generation 1 proven at its
/// end, and stops publishing there for good: it says why, counts it, and
/// reports not ready. Before generations it took the recovered cluster's
/// messages for its own tail and published what came after them beside a
/// cluster that could start again at any moment.
#[test]
fn an_old_cluster_that_finds_a_newer_generation_stops_publishing() {
    let Some(pulsar) =
        shared_pulsar("an_old_cluster_that_finds_a_newer_generation_stops_publishing")
    else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("generation");
    let mut c = TestCluster::start(&mqtt, &pulsar, &topic, 3, |_| {});
    c.wait_ready();
    let leader = c.wait_leader(None, Duration::from_secs(30));
    let recovered = (1..=3).find(|id| *id != leader).unwrap();
    let old: Vec<u64> = (1..=3).filter(|id| *id != recovered).collect();
    replay(mqtt.port, &["--pace", "max", "--limit", "1000"]);
    let applied = c.node(leader).applied();
    wait_until(Duration::from_secs(30), "the first part published", || {
        c.node(leader).status().is_some_and(|s| {
            s.topics
                .iter()
                .any(|t| t.published_seq > 0 && t.backlog == 0)
        }) && c.node(recovered).applied() >= applied
    });
    for id in &old {
        c.node(*id)
            .terminate(Duration::from_secs(20))
            .expect("stops");
    }
    c.node(recovered)
        .terminate(Duration::from_secs(30))
        .expect("stops");
    // No one answers: recovered, although the others are only stopped.
    let out = recover(c.node(recovered));
    assert!(out.status.success(), "{out:?}");
    c.node(recovered).restart();
    replay(
        mqtt.port,
        &["--pace", "max", "--limit", "2000", "--skip", "1000"],
    );
    let distinct = hfp_pairs(Some(2000)).len() as u64;
    c.node(recovered)
        .wait_published(distinct, Duration::from_secs(60));
    c.node(recovered)
        .terminate(Duration::from_secs(30))
        .expect("stops");

    // The old pair comes back, with the rest of the feed.
    for id in &old {
        c.node(*id).restart();
    }
    replay(mqtt.port, &["--pace", "max", "--skip", "2000"]);
    let old_leader = c.wait_leader_among(&old, None, Duration::from_secs(30));
    wait_until(
        Duration::from_secs(60),
        "the old leader gives the topic up, or publishes the rest",
        || {
            c.node(old_leader)
                .metric("firstseen_publish_superseded_total")
                >= 1.0
                || c.node(old_leader).published() >= HFP_DISTINCT
        },
    );
    let (code, why) = c.node(old_leader).get("/readyz");
    assert_eq!(code, 503, "{why}");
    assert!(why.contains("generation 1"), "{why}");
    assert!(c
        .node(old_leader)
        .log_tail(400)
        .contains("this cluster stops publishing this topic"));
    // What is in the topic: the first part by the old cluster, the second
    // by the recovered one, each key once; nothing of the old cluster's
    // after the recovered one's.
    assert_exactly_once(&read_back(&pulsar, &topic), &hfp_pairs(Some(2000)));
}
