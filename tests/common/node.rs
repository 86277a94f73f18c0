//! A firstseen node process, its config and its clock.

use super::*;

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
    /// The binary to run, when not this build's ([`bin`]): a previous
    /// release, for the upgrade test.
    pub binary: Option<PathBuf>,
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
            binary: None,
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

/// The firstseen binary the tests run: this build's, or the one
/// `FIRSTSEEN_TEST_BIN` names (to run a test against another release's
/// build, and see whether it fails there).
pub fn bin() -> PathBuf {
    std::env::var_os("FIRSTSEEN_TEST_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_firstseen")))
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
    /// The cluster secret this node proves its messages with: its
    /// `cluster.secret_file`, or the secret a group of one keeps in its
    /// data directory.
    pub fn secret_file(&self) -> PathBuf {
        self.spec
            .config
            .cluster
            .secret_file
            .clone()
            .unwrap_or_else(|| self.data_dir().join(firstseen::cluster::LOCAL_SECRET))
    }

    pub fn data_dir(&self) -> PathBuf {
        self.spec
            .data_dir
            .clone()
            .unwrap_or_else(|| self.dir.path().join("data"))
    }

    /// Writes the spec's config to the node's config file (as each start
    /// does), for a reload.
    pub fn write_config(&self) {
        let text = self.spec.toml(&self.data_dir(), self.http_port);
        std::fs::write(self.config_path(), text).unwrap();
    }

    fn spawn(&mut self) {
        self.write_config();
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap();
        self.starts += 1;
        writeln!(log, "===== start #{} =====", self.starts).unwrap();
        let child = Command::new(self.spec.binary.clone().unwrap_or_else(bin))
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

    /// The replicated set-aside store as this node lists it (`/set-aside`).
    pub fn set_aside(&self) -> Vec<Value> {
        let (code, body) = self.get("/set-aside");
        assert_eq!(code, 200, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        v["set_aside"].as_array().cloned().unwrap_or_default()
    }

    /// One set-aside message whole (`/admin/set-aside/{id}`), asked with
    /// the node's secret: its reason and payload.
    pub fn set_aside_message(&self, id: u64) -> (String, Vec<u8>) {
        let secret = std::fs::read_to_string(self.secret_file()).unwrap();
        let out = Command::new("curl")
            .args(["-sSf", "-H"])
            .arg(format!("Authorization: Bearer {}", secret.trim()))
            .arg(format!(
                "http://127.0.0.1:{}/admin/set-aside/{id}",
                self.http_port
            ))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        (
            v["reason"].as_str().unwrap_or_default().to_string(),
            hex::decode(v["payload_hex"].as_str().unwrap_or_default()).unwrap(),
        )
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
