//! Test harness: real Mosquitto and firstseen processes on OS-chosen ports,
//! the shared Apache Pulsar started by `scripts/test.sh`, and readers that
//! check results the way a user would (the official Python Pulsar client and
//! `firstseen verify`).
#![allow(dead_code)]

use std::io::Write;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use firstseen::config::{
    Config, MemberConfig, NodeConfig, PulsarConfig, RouteConfig, SubscriptionConfig, UpstreamConfig,
};
pub use firstseen::http::Status;
use serde_json::Value;
use tempfile::TempDir;

pub mod cluster;
pub mod crashfs;
pub mod proxy;

pub const HFP: &str = "../shared/data/hfp-5000.txt";
/// Distinct topic+payload pairs in the HFP capture (see ../shared/data/README.md).
pub const HFP_DISTINCT: u64 = 4_956;

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn hfp_path() -> PathBuf {
    repo().join(HFP)
}

/// A port free on `ip` right now, taken at random below the kernel's
/// ephemeral range (32768+). Ports handed out for port-0 binds (the fault
/// proxies, every outgoing connection) come from that range, so they can
/// never take a port chosen here between the choice and the bind.
pub fn free_port_on(ip: std::net::IpAddr) -> u16 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        ^ ((std::process::id() as u64) << 32);
    let mut x = seed ^ COUNTER.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed);
    for _ in 0..1000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let port = 20_000 + (x % 12_000) as u16;
        if std::net::TcpListener::bind((ip, port)).is_ok() {
            return port;
        }
    }
    panic!("no free port on {ip}");
}

/// A free port on 127.0.0.1 (see [`free_port_on`]).
/// Held for the whole of a test whose assertions are time bounds (an
/// election within 5 s, coverage back within 60 s): such tests take turns
/// within their test binary rather than share 2 cores with each other's
/// three-node clusters, which stretched a 1.5 s election to 15 s in CI. The
/// other tests of the binary still run beside them.
pub fn timing_bound_test() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TURN.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn free_port() -> u16 {
    free_port_on(std::net::IpAddr::from([127, 0, 0, 1]))
}

/// Polls `f` every 100 ms until it returns true or `timeout` passes. Used to
/// wait for an observable condition, never as a fixed sleep.
pub fn wait_until(timeout: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("timed out after {timeout:?} waiting for {what}");
}

/// The Pulsar broker shared by the whole test run.
#[derive(Clone, Debug)]
pub struct Pulsar {
    pub url: String,
    pub admin_url: String,
}

/// The shared broker from `scripts/test.sh`. Without it the test is skipped
/// visibly, unless FIRSTSEEN_REQUIRE_BROKERS=1 (set by the test script and
/// CI), where a missing broker is a failure.
pub fn shared_pulsar(test: &str) -> Option<Pulsar> {
    match (
        std::env::var("FIRSTSEEN_TEST_PULSAR_URL"),
        std::env::var("FIRSTSEEN_TEST_PULSAR_ADMIN_URL"),
    ) {
        (Ok(url), Ok(admin_url)) => Some(Pulsar { url, admin_url }),
        _ => {
            if std::env::var("FIRSTSEEN_REQUIRE_BROKERS").as_deref() == Ok("1") {
                panic!("{test}: FIRSTSEEN_TEST_PULSAR_URL is not set; run the tests through scripts/test.sh");
            }
            eprintln!("SKIPPED {test}: no Pulsar broker (run scripts/test.sh, which starts one)");
            None
        }
    }
}

/// A unique topic per test, so tests can share one broker.
pub fn unique_topic(name: &str) -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("persistent://public/default/{name}-{n:x}")
}

/// A Mosquitto broker of our own, on a free port, with a persistent store.
pub struct Mosquitto {
    child: Option<Child>,
    pub port: u16,
    pub dir: TempDir,
}

impl Mosquitto {
    pub fn start() -> Self {
        Self::start_with(|_| String::new())
    }

    /// [`Mosquitto::start`] with more configuration after the plain
    /// listener (another listener, say), made from the broker's directory.
    pub fn start_with(extra: impl FnOnce(&Path) -> String) -> Self {
        let dir = TempDir::new().unwrap();
        let more = extra(dir.path());
        let port = free_port();
        let conf = dir.path().join("mosquitto.conf");
        // Queue limits are raised so that a test's restart loses nothing
        // inside the broker (the default keeps 1,000 per offline session).
        let text = format!(
            "listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location {}/\n\
             max_queued_messages 1000000\nmax_inflight_messages 1000\nlog_dest file {}/mosquitto.log\n{}{more}",
            dir.path().display(),
            dir.path().display(),
            if is_root() { "user root\n" } else { "" }
        );
        std::fs::write(&conf, text).unwrap();
        let mut m = Self {
            child: None,
            port,
            dir,
        };
        m.spawn();
        m
    }

    fn spawn(&mut self) {
        let child = Command::new("mosquitto")
            .arg("-c")
            .arg(self.dir.path().join("mosquitto.conf"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("mosquitto is installed (scripts/test.sh installs it)");
        self.child = Some(child);
        let port = self.port;
        wait_until(Duration::from_secs(10), "mosquitto to listen", || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
    }

    /// Stops the broker with SIGTERM (it saves its sessions and queued
    /// messages) and starts it again on the same port and store.
    pub fn restart(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let _ = c.wait();
        }
        self.spawn();
    }

    pub fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout == b"0\n")
        .unwrap_or(false)
}

/// What a test node is configured with: its config, typed, and what the
/// harness does around the process.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    /// The node's config. `node.data_dir` and `node.http_listen` are set at
    /// each start, from `data_dir` (or the node's own temporary directory)
    /// and its HTTP port.
    pub config: Config,
    /// Where the node keeps its data, when not in its own temporary
    /// directory (a crash-consistency filesystem, say).
    pub data_dir: Option<PathBuf>,
    /// Extra environment for the process (libfaketime, say).
    pub env: Vec<(String, String)>,
    /// Fixed HTTP port (the cluster harness needs it before start).
    pub http_port: Option<u16>,
}

impl NodeSpec {
    /// Node 1 in zone-a, a group of one: one upstream (`hsl`, QoS 1,
    /// `/hfp/#`) and one route of it to `topic`.
    pub fn new(mqtt: &Mosquitto, pulsar: &Pulsar, topic: &str) -> Self {
        Self::on(&mqtt.url(), pulsar, topic)
    }

    /// [`NodeSpec::new`] with the upstream at `mqtt_url` (a fault proxy).
    pub fn on(mqtt_url: &str, pulsar: &Pulsar, topic: &str) -> Self {
        let mut config = Config::new(
            NodeConfig::new(1, "zone-a", "set-at-start"),
            PulsarConfig::new(pulsar.url.clone()),
        );
        config.pulsar.admin_url = Some(pulsar.admin_url.clone());
        config.pulsar.operation_timeout_ms = 3_000;
        let mut upstream =
            UpstreamConfig::new("hsl", mqtt_url, vec![SubscriptionConfig::new("/hfp/#", 1)]);
        // Short, so that a cut connection is noticed within a test.
        upstream.keepalive_secs = 5;
        config.upstreams.push(upstream);
        config.routes.push(RouteConfig::new("/hfp/#", topic));
        Self {
            config,
            data_dir: None,
            env: Vec::new(),
            http_port: None,
        }
    }

    pub fn id(&self) -> u64 {
        self.config.node.id
    }

    /// The one upstream.
    pub fn upstream(&mut self) -> &mut UpstreamConfig {
        &mut self.config.upstreams[0]
    }

    /// Subscribes to `filter` and routes it to the test's topic, instead of
    /// `/hfp/#`.
    pub fn set_filter(&mut self, filter: &str) {
        self.upstream().subscriptions[0].filter = filter.into();
        self.test_route().filter = filter.into();
    }

    /// The QoS of the subscription.
    pub fn set_qos(&mut self, qos: u8) {
        self.upstream().subscriptions[0].qos = qos;
    }

    /// The route to the test's topic: the last one.
    pub fn test_route(&mut self) -> &mut RouteConfig {
        self.config.routes.last_mut().expect("the test's route")
    }

    /// The test's Pulsar topic.
    pub fn topic(&self) -> &str {
        &self
            .config
            .routes
            .last()
            .expect("the test's route")
            .pulsar_topic
    }

    /// The address the node's peer port listens on.
    pub fn peer_listen(&self) -> String {
        self.config
            .cluster
            .listen
            .expect("a cluster member")
            .to_string()
    }

    /// The config file the node starts with.
    pub fn toml(&self, data_dir: &Path, http_port: u16) -> String {
        let mut config = self.config.clone();
        config.node.data_dir = data_dir.to_path_buf();
        config.node.http_listen = std::net::SocketAddr::from(([127, 0, 0, 1], http_port));
        config.to_toml()
    }
}

/// A firstseen node process. Its data directory outlives restarts.
pub struct Node {
    child: Option<Child>,
    pub spec: NodeSpec,
    pub http_port: u16,
    pub dir: TempDir,
    starts: u32,
}

pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_firstseen"))
}

impl Node {
    pub fn start(spec: NodeSpec) -> Self {
        let dir = TempDir::new().unwrap();
        let http_port = spec.http_port.unwrap_or_else(free_port);
        let mut n = Self {
            child: None,
            spec,
            http_port,
            dir,
            starts: 0,
        };
        n.launch();
        n
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("node.toml")
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("node.log")
    }

    /// Where the node's data lives.
    pub fn data_dir(&self) -> PathBuf {
        self.spec
            .data_dir
            .clone()
            .unwrap_or_else(|| self.dir.path().join("data"))
    }

    fn spawn(&mut self) {
        let text = self.spec.toml(&self.data_dir(), self.http_port);
        std::fs::write(self.config_path(), text).unwrap();
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap();
        self.starts += 1;
        writeln!(log, "===== start #{} =====", self.starts).unwrap();
        let child = Command::new(bin())
            .args(["run", "--config"])
            .arg(self.config_path())
            .env("RUST_LOG", "info,pulsar=warn,openraft=warn")
            .envs(self.spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn firstseen");
        self.child = Some(child);
    }

    fn launch(&mut self) {
        self.spawn();
        let port = self.http_port;
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                panic!(
                    "node {} exited at start-up ({status}):\n{}",
                    self.spec.id(),
                    self.log_tail(30)
                );
            }
            assert!(
                Instant::now() < deadline,
                "node HTTP API did not come up within 20 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Starts the node again: `Ok` once its API is up, or `Err` with its
    /// exit status and the log of this start if it exits first.
    pub fn try_restart(
        &mut self,
        timeout: Duration,
    ) -> Result<(), (std::process::ExitStatus, String)> {
        assert!(self.child.is_none(), "stop the node first");
        let from = std::fs::metadata(self.log_path())
            .map(|m| m.len())
            .unwrap_or(0);
        self.spawn();
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                let log = std::fs::read(self.log_path()).unwrap_or_default();
                let log = String::from_utf8_lossy(&log[from as usize..]).into_owned();
                return Err((status, log));
            }
            // The HTTP port is bound before storage opens, so only an answer
            // means the node came up.
            if self.answers() {
                return Ok(());
            }
            assert!(Instant::now() < deadline, "node neither came up nor exited");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Starts the node again and expects it to refuse: returns its exit
    /// status and the log of this start, or panics if it comes up.
    pub fn restart_expecting_refusal(
        &mut self,
        timeout: Duration,
    ) -> (std::process::ExitStatus, String) {
        match self.try_restart(timeout) {
            Err(refused) => refused,
            Ok(()) => panic!(
                "node {} came up on damaged data:\n{}",
                self.spec.id(),
                self.log_tail(30)
            ),
        }
    }

    /// SIGTERM, then waits for the process: its exit status and how long it
    /// took, or `None` if it was still running after `limit` (it is then
    /// killed).
    pub fn terminate(&mut self, limit: Duration) -> Option<(std::process::ExitStatus, Duration)> {
        let mut child = self.child.take().expect("node runs");
        let started = Instant::now();
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        while started.elapsed() < limit {
            if let Ok(Some(status)) = child.try_wait() {
                return Some((status, started.elapsed()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    /// Waits for the process to exit by itself, up to `limit`: its exit
    /// status and how long that took, or `None` (the process is then killed).
    pub fn wait_exit(&mut self, limit: Duration) -> Option<(std::process::ExitStatus, Duration)> {
        let mut child = self.child.take().expect("node runs");
        let started = Instant::now();
        while started.elapsed() < limit {
            if let Ok(Some(status)) = child.try_wait() {
                return Some((status, started.elapsed()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// SIGKILL: no shutdown code runs.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Whether the process is running (not killed by the test).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// SIGSTOP or SIGCONT.
    pub fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("node runs").id();
        let ok = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} {pid}");
    }

    /// Erases the node's data directory (it must be stopped).
    pub fn wipe(&mut self) {
        assert!(self.child.is_none(), "stop the node first");
        let _ = std::fs::remove_dir_all(self.data_dir());
    }

    /// A counter or gauge from /metrics, summed over its label sets.
    pub fn metric(&self, name: &str) -> f64 {
        let (_, text) = self.get("/metrics");
        text.lines()
            .filter(|l| {
                l.starts_with(name)
                    && (l[name.len()..].starts_with(' ') || l[name.len()..].starts_with('{'))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Starts the same node again on the same data and ports.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "stop the node first");
        self.launch();
    }

    /// The node's /status, via `firstseen status --json`, read into the
    /// type the node writes it from.
    pub fn status(&self) -> Option<Status> {
        serde_json::from_value(self.status_json()?).ok()
    }

    /// The test topic's published watermark, as this node sees it (0
    /// while it does not answer).
    pub fn published(&self) -> u64 {
        self.status()
            .and_then(|s| s.topics.into_iter().find(|t| t.topic == self.spec.topic()))
            .map_or(0, |t| t.published_seq)
    }

    /// The last error of the node's first upstream, if it answers and
    /// there is one.
    pub fn upstream_error(&self) -> Option<String> {
        self.status()?.upstreams.into_iter().next()?.last_error
    }

    /// The last log index this node applied (0 while it does not answer).
    pub fn applied(&self) -> u64 {
        self.status().and_then(|s| s.last_applied).unwrap_or(0)
    }

    /// The same, as plain JSON: for checking what a client sees that the
    /// type does not name.
    pub fn status_json(&self) -> Option<Value> {
        let out = Command::new(bin())
            .args(["status", "--json", "--url"])
            .arg(format!("http://127.0.0.1:{}", self.http_port))
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// Whether the node's HTTP API answers `/healthz` now.
    pub fn answers(&self) -> bool {
        use std::io::Read;
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.http_port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        if write!(s, "GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n").is_err() {
            return false;
        }
        let mut buf = String::new();
        let _ = s.read_to_string(&mut buf);
        buf.starts_with("HTTP/1.") && buf.contains(" 200 ")
    }

    /// Raw GET of an HTTP path: (status code, body).
    pub fn get(&self, path: &str) -> (u16, String) {
        use std::io::Read;
        let mut s = TcpStream::connect(("127.0.0.1", self.http_port)).expect("connect http");
        write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
        let mut buf = String::new();
        s.read_to_string(&mut buf).unwrap();
        let code = buf
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = buf.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
        (code, body)
    }

    /// Waits until /readyz says the node has a leader and its upstream is connected.
    pub fn wait_ready(&self) {
        wait_until(Duration::from_secs(30), "the node to be ready", || {
            self.get("/readyz").0 == 200
        });
    }

    /// Waits until the outbox of the test topic is empty with `n` messages published.
    pub fn wait_published(&self, n: u64, timeout: Duration) {
        let topic = self.spec.topic().to_string();
        let mut last = None;
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(s) = self.status() {
                let done = s
                    .topics
                    .iter()
                    .any(|t| t.topic == topic && t.published_seq == n && t.backlog == 0);
                if done {
                    return;
                }
                last = Some(s);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!(
            "node did not publish {n} messages within {timeout:?}; last status: {last:?}\n--- node log ---\n{}",
            self.log_tail(60)
        );
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            eprintln!("--- node {} log ---\n{}", self.spec.id(), self.log_tail(80));
        }
    }
}

/// libfaketime, from Debian's `faketime` package (scripts/setup.sh).
pub const FAKETIME_LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// Environment that puts a node's wall clock under libfaketime, offset by
/// what `file` says (`+3600`, `-600`); the file is read again every second,
/// so writing it moves the clock of the running node. Monotonic time is left
/// alone: a wall clock that is wrong is the fault, not timers that run wild.
pub fn faketime_env(file: &Path) -> Vec<(String, String)> {
    assert!(
        Path::new(FAKETIME_LIB).exists(),
        "{FAKETIME_LIB} is missing: scripts/setup.sh installs Debian's faketime"
    );
    std::fs::write(file, "+0\n").unwrap();
    vec![
        ("LD_PRELOAD".into(), FAKETIME_LIB.into()),
        ("FAKETIME_TIMESTAMP_FILE".into(), file.display().to_string()),
        ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
        ("FAKETIME_CACHE_DURATION".into(), "1".into()),
    ]
}

/// What replay.py reported.
#[derive(Debug)]
pub struct Replay {
    pub published: u64,
    pub distinct: u64,
    pub rate: f64,
}

/// Builds the replay command (paho-mqtt publishing the HFP capture).
pub fn replay_cmd(port: u16, args: &[&str]) -> Command {
    let mut c = Command::new("python3");
    c.arg(repo().join("tests/tools/replay.py"))
        .arg("--file")
        .arg(hfp_path())
        .args(["--port", &port.to_string()])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    c
}

pub fn parse_replay(stdout: &[u8]) -> Replay {
    let v: Value = serde_json::from_slice(stdout).unwrap_or_else(|e| {
        panic!(
            "replay output is not JSON ({e}): {}",
            String::from_utf8_lossy(stdout)
        )
    });
    Replay {
        published: v["published"].as_u64().unwrap(),
        distinct: v["distinct"].as_u64().unwrap(),
        rate: v["rate"].as_f64().unwrap_or(0.0),
    }
}

/// Replays the capture and waits for every publish to be confirmed by Mosquitto.
pub fn replay(port: u16, args: &[&str]) -> Replay {
    let out = replay_cmd(port, args).output().expect("run replay.py");
    assert!(out.status.success(), "replay.py failed");
    parse_replay(&out.stdout)
}

/// A topic as the official Python client reads it.
#[derive(Debug)]
pub struct ReadBack {
    pub count: u64,
    pub distinct_keys: u64,
    pub keys_with_copies: u64,
    pub seqs: Vec<Option<u64>>,
    /// (MQTT topic, payload): the envelope's, for a transitdata message.
    pub pairs: Vec<(String, String)>,
    /// Messages that were transitdata envelopes.
    pub envelopes: u64,
    /// With `--envelope`: every way one differs from the transitdata contract.
    pub envelope_problems: Vec<String>,
}

pub fn read_back(pulsar: &Pulsar, topic: &str) -> ReadBack {
    read_back_with(pulsar, topic, &[])
}

/// [`read_back`] with more arguments for the reader (`--ca-file`,
/// `--token-file`, a `pulsar+ssl://` `--url` after the first).
pub fn read_back_with(pulsar: &Pulsar, topic: &str, extra: &[&str]) -> ReadBack {
    let out = Command::new("python3")
        .arg(repo().join("tests/tools/pulsar_read.py"))
        .args(["--url", &pulsar.url, "--topic", topic, "--with-payloads"])
        .args(extra)
        .stderr(Stdio::null())
        .output()
        .expect("run pulsar_read.py");
    assert!(out.status.success(), "pulsar_read.py failed");
    let v: Value = serde_json::from_slice(&out.stdout).expect("pulsar_read.py JSON");
    ReadBack {
        count: v["count"].as_u64().unwrap(),
        distinct_keys: v["distinct_keys"].as_u64().unwrap(),
        keys_with_copies: v["keys_with_copies"].as_u64().unwrap(),
        seqs: v["seqs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_u64())
            .collect(),
        pairs: v["pairs"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|p| {
                        (
                            p[0].as_str().unwrap_or("").to_string(),
                            p[1].as_str().unwrap_or("").to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default(),
        envelopes: v["envelopes"].as_u64().unwrap_or(0),
        envelope_problems: v["envelope_problems"]
            .as_array()
            .map(|a| a.iter().map(|p| p.to_string()).collect())
            .unwrap_or_default(),
    }
}

/// The distinct (topic, payload) pairs of the first `limit` lines of the capture.
pub fn hfp_pairs(limit: Option<usize>) -> std::collections::BTreeSet<(String, String)> {
    let text = std::fs::read_to_string(hfp_path()).unwrap();
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .take(limit.unwrap_or(usize::MAX))
        .map(|l| {
            let rest = l.split_once(' ').unwrap().1;
            let cut = rest.find(" {").unwrap();
            (rest[..cut].to_string(), rest[cut + 1..].to_string())
        })
        .collect()
}

/// Asserts exactly one copy of each expected pair, numbered 1..=n without gaps.
pub fn assert_exactly_once(
    read: &ReadBack,
    expected: &std::collections::BTreeSet<(String, String)>,
) {
    assert_exactly_once_with_late(read, expected, &[]);
}

/// [`assert_exactly_once`], where the sequences in `late` came after higher
/// ones (the broker refused them while those were on their way, and the
/// publisher sent them again after): every other sequence is in order, and
/// all of them together are 1..=n.
pub fn assert_exactly_once_with_late(
    read: &ReadBack,
    expected: &std::collections::BTreeSet<(String, String)>,
    late: &[u64],
) {
    let n = expected.len() as u64;
    // Whether a copy was the same sequence sent twice (a publisher resumed
    // too early) or the key numbered twice (the window forgot it) points at
    // different stages; say which.
    let mut seen = std::collections::BTreeSet::new();
    let resent: Vec<u64> = read
        .seqs
        .iter()
        .flatten()
        .filter(|s| !seen.insert(**s))
        .copied()
        .collect();
    assert_eq!(
        read.keys_with_copies,
        0,
        "some keys appear more than once in Pulsar ({} messages, {} sequences sent more than once, the first {:?})",
        read.count,
        resent.len(),
        &resent[..resent.len().min(10)]
    );
    assert_eq!(
        read.count, n,
        "Pulsar holds {} messages, expected {n}",
        read.count
    );
    assert_eq!(read.distinct_keys, n);
    let in_place: Vec<Option<u64>> = read
        .seqs
        .iter()
        .filter(|s| !s.is_some_and(|s| late.contains(&s)))
        .copied()
        .collect();
    let want: Vec<Option<u64>> = (1..=n).filter(|s| !late.contains(s)).map(Some).collect();
    assert!(
        in_place == want,
        "firstseen-seq is not 1..={n} in order (late: {late:?})"
    );
    let mut all = read.seqs.clone();
    all.sort();
    assert_eq!(all, (1..=n).map(Some).collect::<Vec<_>>());
    let got: std::collections::BTreeSet<(String, String)> = read.pairs.iter().cloned().collect();
    let missing: Vec<_> = expected.difference(&got).take(3).collect();
    let extra: Vec<_> = got.difference(expected).take(3).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "content differs: missing {missing:?}, unexpected {extra:?}"
    );
}

/// Publishes one message with paho-mqtt at QoS 1 and waits for the broker's PUBACK.
pub fn publish(port: u16, topic: &str, payload: &[u8]) {
    let status = Command::new("python3")
        .arg(repo().join("tests/tools/publish.py"))
        .args(["--port", &port.to_string(), "--topic", topic])
        .stdin(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            c.stdin.take().unwrap().write_all(payload)?;
            c.wait()
        })
        .expect("run publish.py");
    assert!(status.success(), "publish.py failed");
}

/// A throwaway CA and a certificate it signs for the peer name
/// `firstseen-peer`, made with the openssl CLI. Returns (cert, key, ca).
pub fn make_certs(dir: &Path, tag: &str) -> (PathBuf, PathBuf, PathBuf) {
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let ca_key = format!("{tag}-ca.key");
    let ca = format!("{tag}-ca.crt");
    let key = format!("{tag}-node.key");
    let csr = format!("{tag}-node.csr");
    let cert = format!("{tag}-node.crt");
    let ext = format!("{tag}-ext.cnf");
    std::fs::write(
        dir.join(&ext),
        "subjectAltName=DNS:firstseen-peer,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    run(&[
        &["req", "-x509"][..],
        &ec,
        &[
            "-keyout",
            &ca_key,
            "-out",
            &ca,
            "-days",
            "2",
            "-subj",
            "/CN=firstseen test CA",
        ],
    ]
    .concat());
    run(&[
        &["req"][..],
        &ec,
        &["-keyout", &key, "-out", &csr, "-subj", "/CN=firstseen-peer"],
    ]
    .concat());
    run(&[
        "x509",
        "-req",
        "-in",
        &csr,
        "-CA",
        &ca,
        "-CAkey",
        &ca_key,
        "-CAcreateserial",
        "-out",
        &cert,
        "-days",
        "2",
        "-extfile",
        &ext,
    ]);
    (dir.join(cert), dir.join(key), dir.join(ca))
}

/// Runs `firstseen verify` and returns (exit code, stdout).
pub fn verify(pulsar: &Pulsar, topic: &str, expect: Option<u64>) -> (i32, String) {
    let mut c = Command::new(bin());
    c.args(["verify", "--pulsar-url", &pulsar.url, "--topic", topic]);
    if let Some(n) = expect {
        c.args(["--expect", &n.to_string()]);
    }
    let out = c.output().expect("run firstseen verify");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// A Pulsar standalone of the test's own, for tests that stop the broker
/// or need a secure one.
pub struct OwnPulsar {
    pub dir: TempDir,
    pub pulsar: Pulsar,
}

impl OwnPulsar {
    pub fn start() -> Self {
        Self::start_env(&[])
    }

    /// A broker that requires token authentication on every port and also
    /// listens with TLS (`PULSAR_SECURE=1 scripts/pulsar.sh start`); see
    /// [`OwnPulsar::env`] for its TLS URL, CA, tokens and key.
    pub fn start_secure() -> Self {
        Self::start_env(&[("PULSAR_SECURE", "1")])
    }

    fn start_env(env: &[(&str, &str)]) -> Self {
        let dir = TempDir::new().unwrap();
        Self::run_script("start", dir.path(), env);
        let mut own = Self {
            pulsar: Pulsar {
                url: String::new(),
                admin_url: String::new(),
            },
            dir,
        };
        own.pulsar = Pulsar {
            url: own.env("PULSAR_URL"),
            admin_url: own.env("PULSAR_ADMIN_URL"),
        };
        own
    }

    /// A variable from the broker's `env` file (`PULSAR_TLS_URL`, say).
    pub fn env(&self, key: &str) -> String {
        let env = std::fs::read_to_string(self.dir.path().join("env")).unwrap();
        env.lines()
            .find_map(|l| l.strip_prefix(&format!("export {key}=")))
            .unwrap_or_else(|| panic!("{key} is not in the broker's env file"))
            .to_string()
    }

    fn run_script(action: &str, dir: &Path, env: &[(&str, &str)]) {
        let status = Command::new("bash")
            .arg(repo().join("scripts/pulsar.sh"))
            .arg(action)
            .arg(dir)
            .envs(env.iter().copied())
            .status()
            .expect("run scripts/pulsar.sh");
        assert!(status.success(), "scripts/pulsar.sh {action} failed");
    }

    pub fn stop(&self) {
        Self::run_script("stop", self.dir.path(), &[]);
    }

    pub fn restart(&self) {
        Self::run_script("start", self.dir.path(), &[]);
    }
}

impl Drop for OwnPulsar {
    fn drop(&mut self) {
        self.stop();
    }
}
