//! Three zones, one copy: several nodes on the same upstream agree through
//! Raft on the first copy of each message. Results are read back from Pulsar
//! with the official Python client and with `firstseen verify`.

mod common;

use std::time::Duration;

use common::cluster::TestCluster;
use common::*;
use firstseen::config::TlsConfig;

/// Three nodes, each subscribed to the same Mosquitto with its own client id,
/// the capture plus injected duplicates: one copy per key, and every zone's
/// coverage near 100%.
#[test]
fn three_zones_keep_exactly_one_copy_per_key() {
    let Some(pulsar) = shared_pulsar("three_zones_keep_exactly_one_copy_per_key") else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("three-zones");
    let c = TestCluster::start(&mqtt, &pulsar, &topic, 3, |_| {});
    c.wait_ready();
    let leader = c.wait_leader(None, Duration::from_secs(30));

    let r = replay(mqtt.port, &["--dup-every", "5"]);
    assert!(r.published > 5_000);
    c.nodes[(leader - 1) as usize].wait_published(HFP_DISTINCT, Duration::from_secs(120));
    assert_exactly_once(&read_back(&pulsar, &topic), &hfp_pairs(None));
    let (code, report) = verify(&pulsar, &topic, Some(HFP_DISTINCT), &c.secret_file());
    assert_eq!(code, 0, "{report}");

    // A fresh cluster starts at the base level and raises it to pipelined
    // appends a few seconds in; the leader's streams to both followers run
    // pipelined from then on, with the same leader. (Whether a stream was
    // opened before the rise, which is what the eighth stop's switch is
    // for, depends on timing here; the network's unit test
    // `a_leader_s_stream_ends_once_the_pipelined_level_is_applied` pins it.)
    wait_until(
        Duration::from_secs(30),
        "the leader's streams pipelined",
        || c.nodes[(leader - 1) as usize].metric("firstseen_raft_append_streams_total") >= 2.0,
    );
    assert_eq!(c.wait_leader(None, Duration::from_secs(5)), leader);

    // Every zone got the whole feed: each saw (nearly) every key. Followers'
    // last batches (duplicates only) may still be committing once the leader
    // has published every first copy, so wait for all copies.
    wait_until(
        Duration::from_secs(30),
        "every zone's copies committed",
        || {
            c.nodes[0]
                .status()
                .is_some_and(|s| s.totals.observed == 3 * r.published)
        },
    );
    let s = c.nodes[0].status().unwrap();
    assert_eq!(s.coverage.len(), 3, "{s:?}");
    let mut firsts = 0;
    for cov in &s.coverage {
        assert!(
            cov.seen_ratio > 0.99,
            "zone {} saw only {:.1}% of the keys",
            cov.zone,
            cov.seen_ratio * 100.0
        );
        firsts += cov.first;
    }
    assert_eq!(firsts, HFP_DISTINCT, "each key has exactly one first node");
    assert_eq!(s.totals.observed, 3 * r.published);
}

fn others(all: u64, not: u64) -> Vec<u64> {
    (1..=all).filter(|i| *i != not).collect()
}

/// SIGKILL the leader mid-replay: a new leader takes over and publishing
/// resumes; nothing is lost or doubled; the killed node restarts and catches up.
#[test]
fn leader_kill_mid_replay_fails_over_without_loss_or_duplicates() {
    let Some(pulsar) =
        shared_pulsar("leader_kill_mid_replay_fails_over_without_loss_or_duplicates")
    else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("leader-kill");
    let mut c = TestCluster::start(&mqtt, &pulsar, &topic, 3, |_| {});
    c.wait_ready();
    let (replay, old, killed_at, new) =
        c.kill_leader_mid_replay(&["--pace", "1500", "--dup-every", "9"], 1_000);
    let before = c.node(new).published();
    wait_until(
        Duration::from_secs(60),
        "publishing to resume under the new leader",
        || c.node(new).published() > before,
    );
    eprintln!(
        "leader {old} killed; node {new} leads; publishing resumed {} ms after the kill",
        killed_at.elapsed().as_millis()
    );
    let out = replay.wait_with_output().unwrap();
    assert!(out.status.success());
    c.node(new)
        .wait_published(HFP_DISTINCT, Duration::from_secs(120));

    let restarted_at = std::time::Instant::now();
    c.node(old).restart();
    let target = c.node(new).status().unwrap().last_applied.unwrap();
    wait_until(
        Duration::from_secs(60),
        "the restarted node to catch up",
        || {
            c.node(old)
                .status()
                .and_then(|s| s.last_applied)
                .is_some_and(|a| a >= target)
        },
    );
    eprintln!(
        "restarted node {old} caught up to index {target} in {} ms",
        restarted_at.elapsed().as_millis()
    );
    let s = c.node(old).status().unwrap();
    assert_eq!(s.totals.window_keys, HFP_DISTINCT);
    assert_exactly_once(&read_back(&pulsar, &topic), &hfp_pairs(None));
    let (code, report) = verify(&pulsar, &topic, Some(HFP_DISTINCT), &c.secret_file());
    assert_eq!(code, 0, "{report}");
}

/// The leader cut off from its peers: the majority elects a new leader and
/// carries on; the cut-off node neither publishes nor acks upstream; after
/// the cut heals nothing is lost or doubled.
#[test]
fn an_isolated_leader_neither_publishes_nor_acks() {
    let _turn = timing_bound_test();
    let Some(pulsar) = shared_pulsar("an_isolated_leader_neither_publishes_nor_acks") else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("isolated");
    let mut c = TestCluster::start(&mqtt, &pulsar, &topic, 3, |_| {});
    c.wait_ready();
    let old = c.wait_leader(None, Duration::from_secs(30));
    replay(mqtt.port, &["--limit", "1500", "--pace", "max"]);
    let first = hfp_pairs(Some(1500)).len() as u64;
    c.node(old).wait_published(first, Duration::from_secs(60));
    // Let the last acks of that part leave before measuring.
    wait_until(
        Duration::from_secs(30),
        "every upstream copy of the first part acked",
        || {
            c.nodes
                .iter()
                .all(|n| n.metric("firstseen_acks_total") >= 1_500.0)
        },
    );

    c.isolate(old);
    let rest = others(3, old);
    let new = c.wait_leader_among(&rest, Some(old), Duration::from_secs(30));
    let acks_before = c.node(old).metric("firstseen_acks_total");
    let published_before = c.node(old).metric("firstseen_published_total");
    replay(mqtt.port, &["--skip", "1500", "--pace", "max"]);
    c.node(new)
        .wait_published(HFP_DISTINCT, Duration::from_secs(120));
    assert_eq!(
        c.node(old).metric("firstseen_acks_total"),
        acks_before,
        "the isolated node acked upstream while cut off"
    );
    assert_eq!(
        c.node(old).metric("firstseen_published_total"),
        published_before,
        "the isolated node published while cut off"
    );

    c.heal(old);
    wait_until(
        Duration::from_secs(60),
        "the old leader to follow the new one",
        || c.node(old).status().and_then(|s| s.leader) == Some(new),
    );
    // Its held copies commit (as duplicates) and are acked; its zone's
    // coverage returns to the whole feed.
    wait_until(
        Duration::from_secs(60),
        "the healed zone's coverage to recover",
        || {
            c.node(new).status().is_some_and(|s| {
                s.coverage
                    .iter()
                    .any(|cov| cov.node == old && cov.seen_ratio > 0.99)
            })
        },
    );
    assert_exactly_once(&read_back(&pulsar, &topic), &hfp_pairs(None));
}

/// One node's upstream connection drops for a while: the others cover, its
/// zone's coverage dips, and recovers when the session redelivers.
#[test]
fn a_zone_losing_its_upstream_is_covered_and_its_coverage_dips() {
    let _turn = timing_bound_test();
    let Some(pulsar) = shared_pulsar("a_zone_losing_its_upstream_is_covered_and_its_coverage_dips")
    else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("upstream-drop");
    let mut c = TestCluster::start(&mqtt, &pulsar, &topic, 3, |_| {});
    c.wait_ready();
    let leader = c.wait_leader(None, Duration::from_secs(30));
    let victim = if leader == 3 { 2 } else { 3 };

    c.cut_upstream(victim);
    wait_until(
        Duration::from_secs(30),
        "the victim's upstream to be down",
        || c.node(victim).get("/readyz").0 == 503,
    );
    replay(mqtt.port, &["--pace", "max"]);
    c.node(leader)
        .wait_published(HFP_DISTINCT, Duration::from_secs(120));
    let coverage_of = |c: &mut TestCluster, node: u64| -> f64 {
        let s = c.node(leader).status().unwrap();
        s.coverage
            .iter()
            .find(|cov| cov.node == node)
            .map_or(0.0, |cov| cov.seen_ratio)
    };
    let dipped = coverage_of(&mut c, victim);
    assert!(
        dipped < 0.5,
        "the cut zone's coverage should dip, is {dipped}"
    );
    // The healthy zones' own copies may still be committing after the
    // leader published everything; they must reach the whole feed.
    for n in others(3, victim) {
        wait_until(
            Duration::from_secs(30),
            "a healthy zone to cover the feed",
            || coverage_of(&mut c, n) > 0.99,
        );
    }

    c.heal_upstream(victim);
    wait_until(
        Duration::from_secs(90),
        "the zone's coverage to recover",
        || coverage_of(&mut c, victim) > 0.99,
    );
    eprintln!(
        "coverage of node {victim}: {:.1}% while cut, recovered above 99%",
        dipped * 100.0
    );
    assert_exactly_once(&read_back(&pulsar, &topic), &hfp_pairs(None));
}

/// A fourth node, added after the log was purged, catches up by snapshot.
#[test]
fn a_new_node_catches_up_by_snapshot() {
    let Some(pulsar) = shared_pulsar("a_new_node_catches_up_by_snapshot") else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("snapshot");
    // Small batches and a snapshot every 10 entries: the leader merges the
    // batches that wait for the log, so a replay is only some dozens of
    // entries, and the log must still be purged well past its start.
    let small_log = |s: &mut NodeSpec| {
        s.config.cluster.snapshot_logs = 10;
        s.config.batch.max_messages = 50;
    };
    let mut c = TestCluster::start(&mqtt, &pulsar, &topic, 3, small_log);
    c.wait_ready();
    let leader = c.wait_leader(None, Duration::from_secs(30));
    // A paced replay makes many entries, so the log is purged well past its
    // start and a newcomer cannot be served from the log.
    replay(mqtt.port, &["--pace", "2000"]);
    c.node(leader)
        .wait_published(HFP_DISTINCT, Duration::from_secs(120));

    let (addr, http) = c.start_joiner(4, small_log);
    let url = format!("http://127.0.0.1:{}", c.node(1).http_port);
    let started = std::time::Instant::now();
    let out = std::process::Command::new(bin())
        .args([
            "members", "add", "--id", "4", "--zone", "zone-d", "--addr", &addr, "--http", &http,
        ])
        .args(["--url", &url, "--secret-file"])
        .arg(c.secret_file())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "members add: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_until(
        Duration::from_secs(60),
        "node 4 to hold the whole window",
        || {
            c.node(4)
                .status()
                .is_some_and(|s| s.totals.window_keys == HFP_DISTINCT)
        },
    );
    eprintln!("node 4 caught up in {} ms", started.elapsed().as_millis());
    // The imported window is visible to the status page before the install
    // finishes (the received file is still hashed, synced and promoted, and
    // only then logged), so the log line may follow the full window by a few
    // milliseconds. A node that caught up from the log never writes it.
    wait_until(
        Duration::from_secs(10),
        "node 4 to log that it installed a snapshot",
        || {
            c.node(4)
                .log_tail(usize::MAX)
                .contains("snapshot installed")
        },
    );
    let s = c.node(leader).status().unwrap();
    let m4 = s
        .members
        .iter()
        .find(|m| m.id == 4)
        .unwrap_or_else(|| panic!("node 4 is not a member: {s:?}"));
    assert!(m4.voter, "{s:?}");
    assert_eq!(m4.zone, "zone-d");

    // And out again, through a follower (the CLI finds the leader).
    let follower = if leader == 1 { 2 } else { 1 };
    let out = std::process::Command::new(bin())
        .args(["members", "remove", "--id", "4"])
        .args([
            "--url",
            &format!("http://127.0.0.1:{}", c.node(follower).http_port),
            "--secret-file",
        ])
        .arg(c.secret_file())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "members remove: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_until(
        Duration::from_secs(30),
        "node 4 to leave the membership",
        || {
            c.node(leader)
                .status()
                .is_some_and(|s| s.members.len() == 3 && s.members.iter().all(|m| m.id != 4))
        },
    );
    // Without the secret the admin API refuses.
    let wrong = c.node(4).dir.path().join("wrong.secret");
    std::fs::write(&wrong, "not-the-cluster-secret\n").unwrap();
    let out = std::process::Command::new(bin())
        .args([
            "members",
            "remove",
            "--id",
            "3",
            "--url",
            &url,
            "--secret-file",
        ])
        .arg(&wrong)
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "a wrong secret must not change membership"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("401"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Peers without the cluster secret, garbled frames, frames that fail their
/// integrity check and oversized frames are refused with a logged reason,
/// and the cluster carries on.
#[test]
fn unauthenticated_and_garbled_peers_are_refused() {
    use firstseen::cluster::wire::{self, ClusterKey};
    use std::io::{Read, Write};
    use std::net::TcpStream;

    let Some(pulsar) = shared_pulsar("unauthenticated_and_garbled_peers_are_refused") else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("peer-auth");
    let mut c = TestCluster::start(&mqtt, &pulsar, &topic, 3, |_| {});
    c.wait_ready();
    let leader = c.wait_leader(None, Duration::from_secs(30));
    let target = c.node(1).spec.peer_listen();

    // Reads until the server closes the connection; true if it did.
    let closed = |s: &mut TcpStream| {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = [0u8; 256];
        loop {
            match s.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) => return e.kind() == std::io::ErrorKind::ConnectionReset,
            }
        }
    };
    let challenge = |s: &mut TcpStream| {
        let mut hello = [0u8; 40];
        s.read_exact(&mut hello).unwrap();
        assert_eq!(&hello[..8], wire::MAGIC);
        <[u8; 32]>::try_from(&hello[8..]).unwrap()
    };

    // 1. Plain garbage instead of a handshake.
    let mut s = TcpStream::connect(&target).unwrap();
    challenge(&mut s);
    s.write_all(&[0x42; 72]).unwrap();
    assert!(closed(&mut s), "garbage handshake must be refused");

    // 2. A peer with the wrong secret.
    let wrong = ClusterKey::from_secret(b"not the secret");
    let mut s = TcpStream::connect(&target).unwrap();
    let n = challenge(&mut s);
    let mut hello = 9u64.to_be_bytes().to_vec();
    hello.extend_from_slice(&[7; 32]);
    hello.extend_from_slice(&wrong.client_proof(&n, 9));
    s.write_all(&hello).unwrap();
    assert!(closed(&mut s), "a wrong secret must be refused");

    // 3. The right secret, then: a garbled frame with its right MAC; a
    // well-formed frame whose MAC is not the session's (changed on the way,
    // or injected by a host on the path); an oversized one.
    let key = ClusterKey::from_secret(&std::fs::read(c.secret_file()).unwrap());
    let garbled = vec![0, 0, 0, 3, 0xde, 0xad, 0xbe];
    for (frame, sealed) in [
        (garbled.clone(), true),
        (garbled, false),
        (vec![0xff, 0xff, 0xff, 0xff], false),
    ] {
        let mut s = TcpStream::connect(&target).unwrap();
        let n = challenge(&mut s);
        let mut hello = 9u64.to_be_bytes().to_vec();
        hello.extend_from_slice(&[7; 32]);
        hello.extend_from_slice(&key.client_proof(&n, 9));
        s.write_all(&hello).unwrap();
        let mut answer = [0u8; 40];
        s.read_exact(&mut answer).unwrap();
        let mut frame = frame;
        if sealed {
            let (mut seal, _) = wire::handshake::seals(&key, &n, &[7; 32], false);
            seal.seal(&mut frame);
        } else if frame.len() > 4 {
            frame.extend_from_slice(&[0x55; wire::FRAME_MAC]);
        }
        s.write_all(&frame).unwrap();
        assert!(closed(&mut s), "a bad frame must close the connection");
    }

    // The node logs each refusal just after closing the connection.
    for reason in [
        "does not know the cluster secret",
        "garbled frame",
        "failed its integrity check",
        "exceeds",
    ] {
        wait_until(
            Duration::from_secs(10),
            &format!("a logged refusal: {reason}"),
            || c.node(1).log_tail(300).contains(reason),
        );
    }

    // Nothing else was affected.
    replay(mqtt.port, &["--limit", "500", "--pace", "max"]);
    c.node(leader)
        .wait_published(hfp_pairs(Some(500)).len() as u64, Duration::from_secs(60));
    assert_eq!(c.leader(), Some(leader), "leadership did not move");
}

/// The stale-producer hazard: pause the leader with SIGSTOP mid-replay, let a
/// new leader publish, then SIGCONT the old one. Pulsar must show no
/// duplicate and no reordering.
#[test]
fn a_paused_leader_waking_up_publishes_nothing_stale() {
    let _turn = timing_bound_test();
    let Some(pulsar) = shared_pulsar("a_paused_leader_waking_up_publishes_nothing_stale") else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("sigstop");
    let mut c = TestCluster::start(&mqtt, &pulsar, &topic, 3, |_| {});
    c.wait_ready();
    let old = c.wait_leader(None, Duration::from_secs(30));

    let replay = replay_cmd(mqtt.port, &["--pace", "1500"]).spawn().unwrap();
    wait_until(
        Duration::from_secs(30),
        "part of the feed published",
        || c.node(old).published() > 1_000,
    );
    c.node(old).signal("-STOP");
    let stopped_at = std::time::Instant::now();
    let rest = others(3, old);
    let new = c.wait_leader_among(&rest, Some(old), Duration::from_secs(30));
    let elected_after = stopped_at.elapsed();
    // The paused leader still holds its exclusive producer: the broker lets
    // go of it when the paused process stops answering its keepalive pings
    // (docs/exactly-once.md, "A paused leader").
    let before = c.node(new).published();
    wait_until(
        Duration::from_secs(90),
        "the new leader to publish while the old one is paused",
        || c.node(new).published() > before,
    );
    eprintln!(
        "leader {old} paused: node {new} elected after {} ms, publishing after {} ms",
        elected_after.as_millis(),
        stopped_at.elapsed().as_millis()
    );
    let out = replay.wait_with_output().unwrap();
    assert!(out.status.success());
    c.node(new)
        .wait_published(HFP_DISTINCT, Duration::from_secs(120));

    c.node(old).signal("-CONT");
    wait_until(
        Duration::from_secs(60),
        "the woken leader to follow the new one",
        || c.node(old).status().and_then(|s| s.leader) == Some(new),
    );
    wait_until(
        Duration::from_secs(30),
        "the woken node to drop its publisher",
        || {
            c.node(old)
                .log_tail(400)
                .contains("publisher stopped: leadership lease not confirmed")
        },
    );
    // Its held upstream copies are redelivered and commit as duplicates.
    wait_until(
        Duration::from_secs(60),
        "the woken zone's coverage to recover",
        || {
            c.node(new).status().is_some_and(|s| {
                s.coverage
                    .iter()
                    .any(|cov| cov.node == old && cov.seen_ratio > 0.99)
            })
        },
    );
    assert_exactly_once(&read_back(&pulsar, &topic), &hfp_pairs(None));
    let (code, report) = verify(&pulsar, &topic, Some(HFP_DISTINCT), &c.secret_file());
    assert_eq!(code, 0, "{report}");
}

/// Peers over mutual TLS: the cluster works, and a peer that does not speak
/// TLS, or presents a certificate from another CA, is refused.
#[test]
fn peers_can_require_mutual_tls() {
    use std::io::{Read, Write};
    let Some(pulsar) = shared_pulsar("peers_can_require_mutual_tls") else {
        return;
    };
    let certs = tempfile::TempDir::new().unwrap();
    let tls = make_certs(certs.path(), "cluster");
    let mqtt = Mosquitto::start();
    let topic = unique_topic("tls");
    let mut c = TestCluster::start(&mqtt, &pulsar, &topic, 3, |s| {
        s.config.cluster.tls = Some(TlsConfig::new(&tls.0, &tls.1, &tls.2));
    });
    c.wait_ready();
    let leader = c.wait_leader(None, Duration::from_secs(30));
    replay(mqtt.port, &["--limit", "1000", "--pace", "max"]);
    c.node(leader)
        .wait_published(hfp_pairs(Some(1000)).len() as u64, Duration::from_secs(60));
    assert_exactly_once(&read_back(&pulsar, &topic), &hfp_pairs(Some(1000)));

    // A plain-TCP peer gets no firstseen greeting, only a failed TLS handshake.
    let target = c.node(1).spec.peer_listen();
    let mut s = std::net::TcpStream::connect(&target).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&[0u8; 72]).unwrap();
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).unwrap_or(0);
    assert!(
        !buf[..n].starts_with(firstseen::cluster::wire::MAGIC),
        "a plain peer must not reach the handshake"
    );
    wait_until(Duration::from_secs(10), "the refusal in the log", || {
        c.node(1).log_tail(300).contains("TLS handshake failed")
    });

    // A node with a certificate from another CA cannot join.
    let rogue = make_certs(certs.path(), "rogue");
    let (addr, http) = c.start_joiner(4, |s| {
        s.config.cluster.tls = Some(TlsConfig::new(&rogue.0, &rogue.1, &tls.2));
    });
    // `members add` waits for the learner to catch up, which it never will.
    let mut adding = std::process::Command::new(bin())
        .args([
            "members", "add", "--id", "4", "--zone", "zone-d", "--addr", &addr, "--http", &http,
        ])
        .args([
            "--url",
            &format!("http://127.0.0.1:{}", c.node(leader).http_port),
            "--secret-file",
        ])
        .arg(c.secret_file())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_until(
        Duration::from_secs(20),
        "the leader to refuse the rogue node's certificate",
        || c.node(4).log_tail(300).contains("TLS handshake failed"),
    );
    let _ = adding.kill();
    let _ = adding.wait();
    assert_ne!(
        c.node(4).status().map(|s| s.totals.window_keys),
        Some(hfp_pairs(Some(1000)).len() as u64),
        "the rogue node must not receive the state"
    );
}
