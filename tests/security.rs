//! TLS and authentication on the links to Pulsar and on the HTTP API, on
//! real parts: an Apache Pulsar standalone that requires token
//! authentication and serves TLS (`PULSAR_SECURE=1 scripts/pulsar.sh`), a
//! local OAuth2 issuer whose tokens that broker trusts, and certificates
//! made by the test with openssl. Results are read back with the official
//! Python client over TLS, with a token.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::cluster::TestCluster;
use common::*;
use firstseen::config::{HttpTlsConfig, OAuth2Config};

/// A JWT for `role` signed with `key` (scripts/pulsar/jwt.py), expiring at
/// `exp` (Unix seconds) if given.
fn jwt(key: &Path, role: &str, exp: Option<u64>) -> String {
    let mut c = Command::new("python3");
    c.arg(repo().join("scripts/pulsar/jwt.py"))
        .arg("token")
        .arg(key)
        .arg(role);
    if let Some(exp) = exp {
        c.arg(exp.to_string());
    }
    let out = c.output().expect("run jwt.py");
    assert!(out.status.success(), "jwt.py failed");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Replaces `path` by renaming a new file over it, as a token rotation
/// (a secrets agent, say) does.
fn rotate(path: &Path, contents: &str) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, contents).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// The broker's TLS URL, CA, token-signing key and admin token.
struct Secure {
    own: OwnPulsar,
    tls: Pulsar,
    ca: String,
    key: PathBuf,
    admin_token: String,
}

impl Secure {
    fn start() -> Self {
        let own = OwnPulsar::start_secure();
        let tls = Pulsar {
            url: own.env("PULSAR_TLS_URL"),
            admin_url: own.pulsar.admin_url.clone(),
        };
        Self {
            ca: own.env("PULSAR_CA_FILE"),
            key: PathBuf::from(own.env("PULSAR_SECRET_KEY_FILE")),
            admin_token: own.env("PULSAR_ADMIN_TOKEN_FILE"),
            tls,
            own,
        }
    }

    /// The topic as the official client reads it, over TLS with a token.
    fn read_back(&self, topic: &str) -> ReadBack {
        read_back_with(
            &self.own.pulsar,
            topic,
            &[
                "--url",
                &self.tls.url,
                "--ca-file",
                &self.ca,
                "--token-file",
                &self.admin_token,
            ],
        )
    }
}

/// Three zones publish exactly once over `pulsar+ssl://` with a token read
/// from a file. The token expires mid-test and is rotated in the file: the
/// broker challenges every connection once its token expires and refuses an
/// expired token on reconnection, so the second half of the feed arrives
/// only with the new token. (This does not tell reading the file on every
/// authentication from reading it per client, which the publisher also
/// renews after errors; the unit test in `publish::auth` does.) `firstseen
/// verify` reads the topic with the nodes' own config (TLS and token).
#[test]
fn a_three_zone_cluster_is_exactly_once_over_tls_with_a_token_that_rotates() {
    if shared_pulsar("a_three_zone_cluster_is_exactly_once_over_tls_with_a_token_that_rotates")
        .is_none()
    {
        return;
    }
    let secure = Secure::start();
    let dir = tempfile::TempDir::new().unwrap();
    let token_file = dir.path().join("firstseen.token");
    let expires = unix_now() + 45;
    std::fs::write(&token_file, jwt(&secure.key, "firstseen", Some(expires))).unwrap();
    let mqtt = Mosquitto::start();
    let topic = unique_topic("secure");
    let mut c = TestCluster::start(&mqtt, &secure.tls, &topic, 3, |s| {
        s.config.pulsar.ca_file = Some(secure.ca.clone().into());
        s.config.pulsar.auth_token_file = Some(token_file.clone());
    });
    c.wait_ready();
    let leader = c.wait_leader(None, Duration::from_secs(30));
    replay(mqtt.port, &["--limit", "1000", "--pace", "max"]);
    let first = hfp_pairs(Some(1000)).len() as u64;
    c.node(leader)
        .wait_published(first, Duration::from_secs(90));
    assert!(
        unix_now() < expires,
        "the first half took longer than the token's life; the test proves nothing about rotation"
    );

    rotate(
        &token_file,
        &jwt(&secure.key, "firstseen", Some(unix_now() + 3_600)),
    );
    // Past the old token's expiry plus the broker's refresh check
    // (authenticationRefreshCheckSeconds = 5): every connection made with
    // the old token has been challenged by now.
    while unix_now() < expires + 8 {
        std::thread::sleep(Duration::from_millis(500));
    }
    replay(mqtt.port, &["--skip", "1000", "--pace", "max"]);
    let leader = c.wait_leader(None, Duration::from_secs(30));
    c.node(leader)
        .wait_published(HFP_DISTINCT, Duration::from_secs(120));
    assert_exactly_once(&secure.read_back(&topic), &hfp_pairs(None));

    let out = Command::new(bin())
        .args(["verify", "--expect", &HFP_DISTINCT.to_string(), "--config"])
        .arg(c.node(1).config_path())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "firstseen verify over TLS with the token: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// A running OAuth2 issuer (tests/tools/oauth2_issuer.py).
struct Issuer {
    child: Child,
    url: String,
}

impl Issuer {
    fn start(key: &Path, client_id: &str, secret_file: &Path) -> Self {
        use std::io::BufRead;
        let mut child = Command::new("python3")
            .arg(repo().join("tests/tools/oauth2_issuer.py"))
            .arg("--key")
            .arg(key)
            .args(["--client-id", client_id, "--client-secret-file"])
            .arg(secret_file)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the OAuth2 issuer");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("http://"), "issuer said {line:?}");
        Self {
            child,
            url: line.trim().to_string(),
        }
    }
}

impl Drop for Issuer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every wrong credential fails with an error that says what is wrong and
/// loses nothing: a token the broker did not sign, a CA that did not sign
/// the broker, an OAuth2 client secret the issuer refuses. Meanwhile the
/// messages wait in the outbox (replicated and fsynced), and past the
/// outbox quota the node stops acking, so the rest waits in the broker's
/// session. With OAuth2 client credentials (the issuer signs tokens with the
/// broker's key) every message arrives, once. The node logs at trace level
/// throughout (every crate that handles a credential), and no secret reaches
/// its log: not the client secrets, not a token from a file, not one from
/// the issuer.
#[test]
fn wrong_pulsar_credentials_lose_nothing_and_oauth2_delivers_exactly_once_and_no_secret_is_logged()
{
    if shared_pulsar("wrong_pulsar_credentials_lose_nothing_and_oauth2_delivers_exactly_once_and_no_secret_is_logged")
        .is_none()
    {
        return;
    }
    let secure = Secure::start();
    let dir = tempfile::TempDir::new().unwrap();
    let other_key = dir.path().join("other.key");
    assert!(Command::new("python3")
        .arg(repo().join("scripts/pulsar/jwt.py"))
        .arg("key")
        .arg(&other_key)
        .status()
        .unwrap()
        .success());
    let forged = dir.path().join("forged.token");
    std::fs::write(&forged, jwt(&other_key, "firstseen", None)).unwrap();
    let good = dir.path().join("good.token");
    std::fs::write(&good, jwt(&secure.key, "firstseen", None)).unwrap();
    let (_, _, other_ca) = make_certs(dir.path(), "other");

    let mqtt = Mosquitto::start();
    let topic = unique_topic("wrong-credentials");
    let mut spec = NodeSpec::new(&mqtt, &secure.tls, &topic);
    // A small outbox, so that a broker it cannot reach soon holds acks.
    spec.config.outbox.quota_bytes = 64 * 1024;
    // Every crate that sees a credential at trace level (firstseen, the
    // pulsar client, reqwest, hyper, rustls); the Raft log and the state
    // database, which never see one, at info to keep the log readable.
    spec.env
        .push(("RUST_LOG".into(), "trace,openraft=info,sled=info".into()));
    spec.config.node.shutdown_timeout_secs = 5;
    // The broker's CA and one way to authenticate: a token file, or OAuth2.
    let credentials =
        |s: &mut NodeSpec, ca: &Path, token: Option<&Path>, oauth2: Option<OAuth2Config>| {
            s.config.pulsar.ca_file = Some(ca.to_path_buf());
            s.config.pulsar.auth_token_file = token.map(Path::to_path_buf);
            s.config.pulsar.oauth2 = oauth2;
        };
    credentials(&mut spec, Path::new(&secure.ca), Some(&forged), None);
    let mut node = Node::start(spec);
    node.wait_ready();
    let sent = replay(mqtt.port, &["--limit", "1000", "--pace", "max"]).published;
    let want = hfp_pairs(Some(1000));

    let refused = |node: &Node, what: &str, needle: &[&str]| {
        let mut tail = String::new();
        wait_until(Duration::from_secs(60), what, || {
            tail = node.log_tail(400);
            needle.iter().any(|n| tail.contains(n))
        });
        let line = tail
            .lines()
            .rev()
            .find(|l| needle.iter().any(|n| l.contains(n)))
            .unwrap_or_default()
            .to_string();
        eprintln!("{what}: {line}");
    };
    refused(
        &node,
        "the broker refusing the forged token",
        &["uthentication"],
    );
    wait_until(
        Duration::from_secs(60),
        "acks held by the outbox quota",
        || {
            node.status().is_some_and(|s| s.totals.outbox_messages > 0)
                && node.metric("firstseen_acks_total") < sent as f64
        },
    );
    assert_eq!(secure.read_back(&topic).count, 0, "nothing reached Pulsar");
    node.terminate(Duration::from_secs(20)).expect("stops");

    // The right token, but a CA that did not sign the broker's certificate.
    credentials(&mut node.spec, &other_ca, Some(&good), None);
    node.restart();
    refused(
        &node,
        "the broker's certificate refused",
        &["certificate", "Tls", "TLS", "tls"],
    );
    assert_eq!(secure.read_back(&topic).count, 0, "nothing reached Pulsar");
    node.terminate(Duration::from_secs(20)).expect("stops");

    // OAuth2 with a client secret the issuer refuses.
    let secret = dir.path().join("client.secret");
    std::fs::write(&secret, "the-right-secret\n").unwrap();
    let issuer = Issuer::start(&secure.key, "firstseen-oauth", &secret);
    let wrong = dir.path().join("wrong.secret");
    std::fs::write(&wrong, "a-wrong-secret\n").unwrap();
    let oauth2 = |secret: &Path| {
        Some(OAuth2Config {
            issuer_url: issuer.url.clone(),
            client_id: "firstseen-oauth".into(),
            client_secret_file: secret.to_path_buf(),
            audience: Some("urn:pulsar:test".into()),
            scope: None,
        })
    };
    credentials(&mut node.spec, Path::new(&secure.ca), None, oauth2(&wrong));
    node.restart();
    refused(&node, "the issuer refusing the client", &["invalid_client"]);
    assert_eq!(secure.read_back(&topic).count, 0, "nothing reached Pulsar");
    node.terminate(Duration::from_secs(20)).expect("stops");

    // The right client secret: everything, held in the outbox or in the
    // broker's session, arrives once.
    credentials(&mut node.spec, Path::new(&secure.ca), None, oauth2(&secret));
    node.restart();
    node.wait_published(want.len() as u64, Duration::from_secs(120));
    assert_exactly_once(&secure.read_back(&topic), &want);
    drop(issuer);
    node.terminate(Duration::from_secs(20)).expect("stops");

    let log = std::fs::read_to_string(node.log_path()).unwrap();
    // Trace on, in the crates that see a credential: the producer's
    // frames (a CONNECT carries the token) and the HTTP and TLS clients.
    let traced = |target: &str| {
        log.lines()
            .any(|l| l.contains(" TRACE ") && l.contains(target))
    };
    assert!(
        log.contains("new OAuth2 access token")
            && traced("firstseen::publish::producer")
            && traced("rustls")
            && traced("hyper"),
        "the node did not log at trace level"
    );
    for (what, needle) in [
        ("the client secret", "the-right-secret"),
        ("the wrong client secret", "a-wrong-secret"),
        // Every JWT starts with the base64 of `{"`: the token files' and
        // the issuer's alike.
        ("a JWT", "eyJ"),
    ] {
        let at = log.lines().find(|l| l.contains(needle));
        assert!(at.is_none(), "{what} is in the node's log: {at:?}");
    }
}

/// The HTTP API over TLS: `firstseen status` and `firstseen members add`
/// work over https:// with the listener's CA, and a wrong secret is refused
/// and counted. Over plain HTTP, an admin request from another host is
/// refused before the secret is looked at, while one from loopback works.
#[test]
fn the_http_api_serves_tls_and_refuses_the_secret_over_plain_http_from_another_host() {
    let Some(pulsar) = shared_pulsar(
        "the_http_api_serves_tls_and_refuses_the_secret_over_plain_http_from_another_host",
    ) else {
        return;
    };
    let certs = tempfile::TempDir::new().unwrap();
    let (cert, key, ca) = make_certs(certs.path(), "http");
    let http_tls = HttpTlsConfig {
        cert_file: cert.clone(),
        key_file: key.clone(),
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("https");
    let mut c = TestCluster::start(&mqtt, &pulsar, &topic, 1, |s| {
        s.config.node.http_tls = Some(http_tls.clone());
    });
    let https = |port: u16| format!("https://127.0.0.1:{port}");
    let cli = |args: &[&str]| {
        Command::new(bin())
            .args(args)
            .arg("--ca-file")
            .arg(&ca)
            .output()
            .unwrap()
    };
    let node1 = https(c.node(1).http_port);
    wait_until(
        Duration::from_secs(30),
        "node 1 to lead, over https",
        || {
            let out = cli(&["status", "--json", "--url", &node1]);
            out.status.success()
                && serde_json::from_slice::<serde_json::Value>(&out.stdout)
                    .is_ok_and(|s| s["is_leader"] == true)
        },
    );
    // Without the CA the client refuses the listener's certificate.
    let out = Command::new(bin())
        .args(["status", "--url", &node1])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "an unknown CA must fail");
    // Plain HTTP to the TLS listener gets no answer.
    assert!(!c.node(1).answers(), "plain HTTP must not reach the API");

    let (addr, http) = c.start_joiner(2, |s| s.config.node.http_tls = Some(http_tls.clone()));
    let secret = c.secret_file();
    let add = |secret: &Path| {
        Command::new(bin())
            .args([
                "members",
                "add",
                "--id",
                "2",
                "--zone",
                "zone-b",
                "--addr",
                &addr,
                "--http",
                &http,
                "--url",
                &node1,
                "--ca-file",
            ])
            .arg(&ca)
            .arg("--secret-file")
            .arg(secret)
            .output()
            .unwrap()
    };
    let wrong = certs.path().join("wrong.secret");
    std::fs::write(&wrong, "not-the-secret\n").unwrap();
    let out = add(&wrong);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("401"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let refusals = |c: &mut TestCluster| {
        let out = cli(&["status", "--json", "--url", &node1]);
        assert!(out.status.success());
        let port = c.node(1).http_port;
        let metrics = Command::new("curl")
            .args(["-fsS", "--cacert"])
            .arg(&ca)
            .arg(format!("https://127.0.0.1:{port}/metrics"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&metrics.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("firstseen_admin_refused_total"))
            .and_then(|v| v.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    assert_eq!(refusals(&mut c), 1.0, "the wrong secret is counted");
    let out = add(&secret);
    assert!(
        out.status.success(),
        "members add over https: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let node2 = https(c.node(2).http_port);
    wait_until(Duration::from_secs(30), "node 2 to be a voter", || {
        let out = cli(&["status", "--json", "--url", &node2]);
        serde_json::from_slice::<serde_json::Value>(&out.stdout).is_ok_and(|s| {
            s["members"]
                .as_array()
                .is_some_and(|m| m.iter().any(|m| m["id"] == 2 && m["voter"] == true))
        })
    });
}

/// An address of this machine that is not loopback: the source of a
/// request "from another host" without leaving the machine.
fn outside_address() -> std::net::IpAddr {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    // No packet is sent: connecting a UDP socket only picks the route.
    s.connect("192.0.2.1:9").expect("a default route");
    let ip = s.local_addr().unwrap().ip();
    assert!(!ip.is_loopback(), "no non-loopback address on this machine");
    ip
}

/// Over plain HTTP on a non-loopback listener, an admin request from another
/// address is refused with 403 before the secret is checked, and counted;
/// the same request from loopback goes through.
#[test]
fn plain_http_admin_requests_are_accepted_only_from_loopback() {
    let Some(pulsar) = shared_pulsar("plain_http_admin_requests_are_accepted_only_from_loopback")
    else {
        return;
    };
    let ip = outside_address();
    let mqtt = Mosquitto::start();
    let topic = unique_topic("plain-admin");
    let mut c = TestCluster::start(&mqtt, &pulsar, &topic, 1, |s| {
        let port = s.http_port.unwrap();
        s.env.push((
            "FIRSTSEEN__NODE__HTTP_LISTEN".into(),
            format!("0.0.0.0:{port}"),
        ));
    });
    c.wait_ready();
    let port = c.node(1).http_port;
    let secret = std::fs::read_to_string(c.secret_file()).unwrap();
    let remove = |host: &str| {
        let out = Command::new("curl")
            .args([
                "-sS",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "-X",
                "DELETE",
            ])
            .arg("-H")
            .arg(format!("Authorization: Bearer {}", secret.trim()))
            .arg(format!("http://{host}:{port}/admin/members/42"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    assert_eq!(remove(&ip.to_string()), "403", "from {ip}");
    assert_eq!(c.node(1).metric("firstseen_admin_refused_total"), 1.0);
    wait_until(Duration::from_secs(10), "the refusal in the log", || {
        c.node(1).log_tail(200).contains("plain HTTP")
    });
    let from_loopback = remove("127.0.0.1");
    assert_ne!(from_loopback, "403", "loopback is allowed");
    assert_ne!(from_loopback, "401", "with the right secret");
    assert_eq!(c.node(1).metric("firstseen_admin_refused_total"), 1.0);
}

/// A sustained flood of connections that never authenticate, from nine
/// addresses (127.0.0.2 to .10) at every peer port of a three-node cluster,
/// each address holding its 8 handshake slots and replacing every one the
/// node closes at once: together they want more than the 64 slots there
/// are. Members connect from 127.0.0.1 (through the test's proxies), an
/// address the nodes know as a member's, whose handshakes take slots of
/// their own. A follower restarted during the flood must rejoin, and
/// messages are published once; every refusal is counted and the log says
/// so at a bounded rate. Without the members' reserve, the flood held every
/// slot and the restarted follower did not get back in (seen with the
/// reserve removed: the wait for it to be ready timed out).
#[test]
fn a_flood_of_silent_peer_connections_does_not_keep_members_apart() {
    let Some(pulsar) =
        shared_pulsar("a_flood_of_silent_peer_connections_does_not_keep_members_apart")
    else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("flood");
    let mut c = TestCluster::start(&mqtt, &pulsar, &topic, 3, |_| {});
    c.wait_ready();
    let targets: Vec<std::net::SocketAddr> = (1..=3)
        .map(|id| c.node(id).spec.peer_listen().parse().unwrap())
        .collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flooders: Vec<_> = (2..=10u8)
        .map(|last| {
            let (stop, targets) = (stop.clone(), targets.clone());
            std::thread::spawn(move || {
                flood_from(
                    std::net::Ipv4Addr::new(127, 0, 0, last).into(),
                    &targets,
                    &stop,
                )
            })
        })
        .collect();
    let flood_began = std::time::Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    // A follower restarts in the middle of the flood and must rejoin.
    let leader = c.wait_leader(None, Duration::from_secs(10));
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    c.node(follower)
        .terminate(Duration::from_secs(20))
        .expect("stops");
    c.node(follower).restart();
    c.node(follower).wait_ready();
    replay(mqtt.port, &["--limit", "200", "--pace", "max"]);
    for id in 1..=3 {
        c.node(id)
            .wait_published(hfp_pairs(Some(200)).len() as u64, Duration::from_secs(60));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let opened: u64 = flooders.into_iter().map(|f| f.join().unwrap()).sum();
    let flooded = flood_began.elapsed().as_secs();
    assert!(opened > 1000, "only {opened} connections opened");
    assert_exactly_once(&read_back(&pulsar, &topic), &hfp_pairs(Some(200)));
    for id in 1..=3 {
        let refused = c.node(id).metric("firstseen_peer_refused_total");
        assert!(refused > 100.0, "node {id} refused only {refused}");
        assert_eq!(c.node(id).get("/readyz").0, 200, "node {id} stays ready");
        let log = std::fs::read_to_string(c.node(id).log_path()).unwrap();
        let lines = log.matches("peer connection refused").count();
        // One line per kind of refusal every 10 s, for the few kinds a
        // flood makes (refused at accept per address and in all, timed
        // out, reset): flooded / 10 + 1 lines per kind in a process, and
        // one more per kind on the follower restarted above, whose log
        // holds both runs and whose new process logs each kind again at
        // once. With `+ 1` it failed once in three runs on a loaded
        // machine.
        let bound = 5 * (flooded / 10 + 2) as usize;
        assert!(
            lines <= bound,
            "node {id}: {lines} log lines for {refused} refusals in {flooded} s"
        );
        assert!(
            log.contains("too many connections from one address still authenticating"),
            "node {id}: {}",
            c.node(id).log_tail(20)
        );
    }
}

/// Keeps ten connections per target open from `source`, each silent, and
/// replaces any the target closes (or refuses) at once, until `stop`.
/// Returns how many it opened.
fn flood_from(
    source: std::net::IpAddr,
    targets: &[std::net::SocketAddr],
    stop: &std::sync::atomic::AtomicBool,
) -> u64 {
    use std::io::Read;
    let connect = |t: &std::net::SocketAddr| -> Option<std::net::TcpStream> {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).ok()?;
        s.bind(&std::net::SocketAddr::new(source, 0).into()).ok()?;
        s.connect_timeout(&(*t).into(), Duration::from_millis(500))
            .ok()?;
        let s: std::net::TcpStream = s.into();
        s.set_nonblocking(true).ok()?;
        Some(s)
    };
    let mut open: Vec<Vec<Option<std::net::TcpStream>>> = targets
        .iter()
        .map(|_| (0..10).map(|_| None).collect())
        .collect();
    let mut opened = 0u64;
    let mut buf = [0u8; 256];
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        for (t, conns) in targets.iter().zip(open.iter_mut()) {
            for slot in conns.iter_mut() {
                let alive = match slot {
                    // The server's hello is read and ignored; an end or an
                    // error means the node closed it.
                    Some(s) => loop {
                        match s.read(&mut buf) {
                            Ok(0) => break false,
                            Ok(_) => continue,
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break true,
                            Err(_) => break false,
                        }
                    },
                    None => false,
                };
                if !alive {
                    *slot = connect(t);
                    opened += slot.is_some() as u64;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    opened
}

/// A wrong address (a reused IP, a stale entry, a relay between zones)
/// puts a member where another is dialled. Here node 1's member list gives
/// node 3's address as node 1's own peer port: a relay that loops node 1's
/// link to "node 3" back to node 1. The other two are then cut off. Before
/// the dialler compared the node that answered with the member dialled,
/// node 1 took its own answers for node 3's: its Raft core received its own
/// appends and votes as another member's, panicked, and node 1 never became
/// ready (seen on this test with the check removed). Counted as two, one
/// node is a majority of three. Now the link to "node 3" fails ("answered as
/// node 1, not node 3"), node 1 works with node 2, and cut off from both
/// others it holds no confirmed leadership.
#[test]
fn a_member_answering_at_another_s_address_is_not_counted_for_it() {
    let Some(pulsar) =
        shared_pulsar("a_member_answering_at_another_s_address_is_not_counted_for_it")
    else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("relay");
    let c = TestCluster::start(&mqtt, &pulsar, &topic, 3, |spec| {
        if spec.id() == 1 {
            let members = &mut spec.config.cluster.members;
            let own = members.iter().find(|m| m.id == 1).unwrap().addr.clone();
            members.iter_mut().find(|m| m.id == 3).unwrap().addr = own;
        }
    });
    let mut c = c;
    // Node 3 may never hear from node 1 as leader (node 1 cannot reach
    // it): only the other two are waited for.
    c.node(1).wait_ready();
    c.node(2).wait_ready();
    c.isolate(2);
    c.isolate(3);
    // Whatever lease node 1 held before the cut runs out within a second.
    std::thread::sleep(Duration::from_secs(3));
    let until = std::time::Instant::now() + Duration::from_secs(8);
    while std::time::Instant::now() < until {
        let s = c.node(1).status();
        assert!(
            !s.as_ref().is_some_and(|s| s.is_leader),
            "node 1 leads alone, confirmed by itself as node 3: {:?}",
            s.map(|s| (s.role, s.term))
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(c.node(1).metric("firstseen_peer_wrong_node_total") > 0.0);
    assert!(
        c.node(1)
            .log_tail(400)
            .contains("answered as node 1, not node 3"),
        "{}",
        c.node(1).log_tail(40)
    );
    c.heal(2);
    c.heal(3);
}
