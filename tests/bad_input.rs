//! Bad input gets a clear error and loses nothing.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;

const BASE: &str = r##"
[node]
id = 1
zone = "a"
data_dir = "/tmp/firstseen-never-used"

[pulsar]
url = "pulsar://127.0.0.1:6650"

[[upstreams]]
name = "hsl"
url = "mqtt://127.0.0.1:1883"
[[upstreams.subscriptions]]
filter = "/hfp/#"

[[routes]]
filter = "/hfp/#"
pulsar_topic = "persistent://public/default/hfp"
"##;

fn check_config(text: &str) -> (i32, String) {
    let dir = tempfile::TempDir::new().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, text).unwrap();
    let out = Command::new(bin())
        .arg("check-config")
        .arg(&path)
        .output()
        .unwrap();
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn check_config_accepts_a_good_file_and_names_the_key_of_a_bad_one() {
    let (code, out) = check_config(BASE);
    assert_eq!(code, 0, "{out}");

    let (code, out) = check_config(&BASE.replace("zone = \"a\"", "zone = \"a\"\nwindow = 5"));
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("node.window") && out.contains("unknown field"),
        "{out}"
    );

    let (code, out) = check_config(&BASE.replace("id = 1", "id = \"one\""));
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("node.id") && out.contains("invalid type"),
        "{out}"
    );

    let no_routes = BASE.split("[[routes]]").next().unwrap();
    let (code, out) = check_config(no_routes);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("routes: at least one route is required"),
        "{out}"
    );

    let (code, out) = check_config(&BASE.replace("mqtt://127.0.0.1:1883", "ftp://x"));
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("upstreams[0].url"), "{out}");

    let (code, out) = check_config(&BASE.replace(
        "url = \"mqtt://127.0.0.1:1883\"",
        "url = \"mqtt://127.0.0.1:1883\"\nprotocol = \"4\"",
    ));
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("upstreams[0].protocol"), "{out}");

    let (code, out) = check_config(&BASE.replace(
        "pulsar_topic = \"persistent://public/default/hfp\"",
        "pulsar_topic = \"persistent://public/default/hfp\"\nkey = { json = [\"/VP/veh\", \"VP/tst\"] }",
    ));
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("routes[0].key") && out.contains("`VP/tst` is not a JSON pointer"),
        "{out}"
    );

    let (code, out) = check_config("[node\nid=1");
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("c.toml"),
        "a syntax error names the file: {out}"
    );
}

/// A node process, killed when the test ends, failed assertions included.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A node on its own whose upstream does not resolve and whose Pulsar is
/// not there: its HTTP API runs all the same. Returns it and its HTTP port.
/// `node_extra` is added to its `[node]` table.
fn lonely_node(dir: &tempfile::TempDir, node_extra: &str) -> (Reaped, u16) {
    let port = free_port();
    let text = BASE
        .replace("mqtt://127.0.0.1:1883", "mqtt://no-such-host.invalid:1883")
        .replace(
            "/tmp/firstseen-never-used",
            &dir.path().join("data").display().to_string(),
        )
        .replace(
            "zone = \"a\"",
            &format!("zone = \"a\"\nhttp_listen = \"127.0.0.1:{port}\"\n{node_extra}"),
        )
        .replace(
            "pulsar://127.0.0.1:6650",
            &format!("pulsar://127.0.0.1:{}", free_port()),
        );
    let path = dir.path().join("c.toml");
    std::fs::write(&path, text).unwrap();
    let child = Command::new(bin())
        .args(["run", "--config"])
        .arg(&path)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    (Reaped(child), port)
}

/// Past 32 open connections from one address the next is closed at once;
/// another address is still served; a connection that sends nothing is
/// closed after 30 s, and its address is served again. Without the bounds
/// one client could hold connections until the node ran out of file
/// descriptors, the readiness probe's included.
#[test]
fn one_client_cannot_hold_the_http_api() {
    use std::io::Read;
    let dir = tempfile::TempDir::new().unwrap();
    let (_node, port) = lonely_node(&dir, "");
    let addr = format!("127.0.0.1:{port}");
    let healthz = |from: &str| -> String {
        let out = Command::new("curl")
            .args([
                "-s",
                "-m",
                "5",
                "--interface",
                from,
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
            ])
            .arg(format!("http://{addr}/healthz"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // Asked from another address: a connection of the hogs' own address
    // that the node has not yet seen closed still holds one of its 32
    // slots when the hogs arrive, so one hog is refused and every later
    // request takes the slot it left (failed so in a CI run: the 33rd was
    // answered for 10 s).
    wait_until(Duration::from_secs(30), "the HTTP API", || {
        healthz("127.0.0.2") == "200"
    });
    let mut hogs: Vec<std::net::TcpStream> = (0..32)
        .map(|_| std::net::TcpStream::connect(&addr).unwrap())
        .collect();
    // Once the node has taken the 32, a 33rd is closed without an answer.
    // (Waited for: on a loaded machine, in a run of two tests at once, one
    // such request was still answered 300 ms after the 32 connected.)
    wait_until(Duration::from_secs(10), "a 33rd connection refused", || {
        healthz("127.0.0.1") == "000"
    });
    assert_eq!(healthz("127.0.0.2"), "200", "another address was refused");
    // The hogs never send a byte: closed by the node within the idle timeout.
    let started = std::time::Instant::now();
    for hog in &mut hogs {
        hog.set_read_timeout(Some(Duration::from_secs(45))).unwrap();
        let mut buf = Vec::new();
        let closed = hog.read_to_end(&mut buf).is_ok();
        assert!(closed, "an idle connection was still open after 45 s");
    }
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(25),
        "closed after {waited:?}, before the idle timeout"
    );
    assert_eq!(healthz("127.0.0.1"), "200");
}

/// An upstream whose host does not resolve: the node runs, says why it is
/// not ready, and keeps retrying.
#[test]
fn an_unresolvable_upstream_is_reported_by_name() {
    let dir = tempfile::TempDir::new().unwrap();
    let (_node, port) = lonely_node(&dir, "");
    let status = || -> Option<Status> {
        let out = Command::new(bin())
            .args([
                "status",
                "--json",
                "--url",
                &format!("http://127.0.0.1:{port}"),
            ])
            .output()
            .ok()?;
        serde_json::from_slice(&out.stdout).ok()
    };
    let mut last = None;
    wait_until(
        Duration::from_secs(30),
        "the upstream error in /status",
        || {
            last = status();
            last.as_ref()
                .and_then(|s| s.upstreams.first()?.last_error.as_deref())
                .is_some_and(|e| e.contains("cannot resolve"))
        },
    );
    let err = last
        .and_then(|s| s.upstreams.into_iter().next()?.last_error)
        .unwrap_or_default();
    assert!(
        err.contains("no-such-host.invalid"),
        "the error names the host: {err}"
    );
    let out = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &format!("http://127.0.0.1:{port}/readyz"),
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "503");
}

/// An empty payload is a message like any other; an oversized one goes to
/// the dead-letter store by the documented policy, is counted, and is never
/// published; neither disturbs the messages around it.
#[test]
fn empty_and_oversized_payloads_follow_the_policy() {
    let Some(pulsar) = shared_pulsar("empty_and_oversized_payloads_follow_the_policy") else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("payloads");
    let mut spec = NodeSpec::new(&mqtt, &pulsar, &topic);
    spec.config.dedup.max_payload_bytes = 1024;
    let node = Node::start(spec);
    node.wait_ready();

    publish(mqtt.port, "/hfp/a", b"before");
    publish(mqtt.port, "/hfp/empty", b"");
    publish(mqtt.port, "/hfp/big", &vec![b'x'; 4096]);
    publish(mqtt.port, "/hfp/b", b"after");
    node.wait_published(3, Duration::from_secs(60));

    let read = read_back(&pulsar, &topic);
    let got: Vec<(String, String)> = read.pairs.clone();
    assert_eq!(
        got,
        vec![
            ("/hfp/a".to_string(), "before".to_string()),
            ("/hfp/empty".to_string(), String::new()),
            ("/hfp/b".to_string(), "after".to_string()),
        ]
    );
    let dead: Vec<_> = std::fs::read_dir(node.dir.path().join("data/dead-letter"))
        .expect("dead-letter directory exists")
        .flatten()
        .collect();
    assert_eq!(dead.len(), 1);
    let content = std::fs::read(dead[0].path()).unwrap();
    let header =
        String::from_utf8_lossy(&content[..content.iter().position(|b| *b == b'\n').unwrap()])
            .into_owned();
    assert!(
        header.contains("\"reason\":\"oversize\"") && header.contains("/hfp/big"),
        "{header}"
    );
    assert!(
        content.ends_with(&vec![b'x'; 4096]),
        "the payload is kept whole"
    );
    assert_eq!(
        node.metric("firstseen_oversize_total"),
        1.0,
        "the oversized payload is counted"
    );
}

/// `verify` is the audit behind the product's claim, so it must be able to fail.
#[test]
fn verify_reports_duplicates_and_gaps() {
    let Some(pulsar) = shared_pulsar("verify_reports_duplicates_and_gaps") else {
        return;
    };
    let topic = unique_topic("verify-negative");
    let status = Command::new("python3")
        .arg(repo().join("tests/tools/pulsar_write.py"))
        .args([
            "--url",
            &pulsar.url,
            "--topic",
            &topic,
            // Written as firstseen would have: verify audits only those.
            "--producer-name",
            "firstseen-test-verify",
            "a:1",
            "b:2",
            "a:3",
            "c:5",
        ])
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    // Written without proofs: audited by name.
    let (code, report) = verify_by_name(&pulsar, &topic, None);
    assert_eq!(code, 1, "{report}");
    assert!(
        report.contains("duplicates      1 messages over 1 keys"),
        "{report}"
    );
    assert!(report.contains("gap 4..=4"), "{report}");
}

/// The CLI never sends the admin credential over plain HTTP to another
/// host: it refuses before connecting, and says how to do it instead.
#[test]
fn the_cli_keeps_the_admin_credential_off_plain_http_to_other_hosts() {
    let dir = tempfile::TempDir::new().unwrap();
    let secret = dir.path().join("cluster.secret");
    std::fs::write(&secret, "cli-test-secret-0123456789abcdef0123456789\n").unwrap();
    let out = Command::new(bin())
        .args([
            "members",
            "remove",
            "--id",
            "42",
            "--url",
            "http://192.0.2.1:8080",
        ])
        .arg("--secret-file")
        .arg(&secret)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("refusing to send the admin credential over plain HTTP to 192.0.2.1"),
        "{err}"
    );
}

/// With `node.admin_token_file` the admin API takes that token and nothing
/// else; a wrong or missing one is refused with 401 and counted.
#[test]
fn the_admin_token_opens_the_admin_api_and_nothing_else_does() {
    let dir = tempfile::TempDir::new().unwrap();
    let token = dir.path().join("admin.token");
    std::fs::write(&token, "admin-token-0123456789abcdef0123456789abcdef\n").unwrap();
    let (_node, port) = lonely_node(&dir, &format!("admin_token_file = \"{}\"", token.display()));
    let delete = |bearer: Option<&str>| -> String {
        let mut c = Command::new("curl");
        c.args([
            "-s",
            "-m",
            "10",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-X",
            "DELETE",
        ]);
        if let Some(b) = bearer {
            c.arg("-H").arg(format!("Authorization: Bearer {b}"));
        }
        let out = c
            .arg(format!("http://127.0.0.1:{port}/admin/members/42"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    wait_until(Duration::from_secs(30), "the HTTP API", || {
        delete(None) == "401"
    });
    assert_eq!(delete(Some("not-the-token")), "401");
    let with_token = delete(Some("admin-token-0123456789abcdef0123456789abcdef"));
    assert!(
        with_token != "401" && with_token != "000",
        "the admin token was refused: {with_token}"
    );
}
