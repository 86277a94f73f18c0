//! The brokers a test runs against: the shared Pulsar, a Pulsar of the
//! test's own, and Mosquitto on a free port.

use super::*;

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

    /// A broker whose bookie keeps its journal and ledgers in `bookie_dir`
    /// (`PULSAR_BOOKKEEPER_DIR`): on a [`super::crashfs::CrashFs`] mount, a
    /// freeze there stalls the bookie while the broker takes writes.
    pub fn start_with_bookie_dir(bookie_dir: &Path) -> Self {
        let dir = bookie_dir.to_str().expect("a UTF-8 path");
        Self::start_env(&[("PULSAR_BOOKKEEPER_DIR", dir)])
    }

    /// The managed ledger's writes taken and not yet persisted for `topic`
    /// (`pendingAddEntriesCount` in the topic's internal stats), or `None`
    /// while the admin API does not answer with it.
    pub fn pending_adds(&self, topic: &str) -> Option<u64> {
        let path = topic.strip_prefix("persistent://")?;
        let out = Command::new("curl")
            .args(["-sSf", "-m", "5"])
            .arg(format!(
                "{}/admin/v2/persistent/{path}/internalStats",
                self.pulsar.admin_url
            ))
            .output()
            .ok()?;
        let v: Value = serde_json::from_slice(&out.stdout).ok()?;
        v["pendingAddEntriesCount"].as_u64()
    }

    /// The names of the producers `topic` has now (its stats' `publishers`),
    /// or `None` while the admin API does not answer.
    pub fn producers(&self, topic: &str) -> Option<Vec<String>> {
        let path = topic.strip_prefix("persistent://")?;
        let out = Command::new("curl")
            .args(["-sSf", "-m", "5"])
            .arg(format!(
                "{}/admin/v2/persistent/{path}/stats",
                self.pulsar.admin_url
            ))
            .output()
            .ok()?;
        let v: Value = serde_json::from_slice(&out.stdout).ok()?;
        Some(
            v["publishers"]
                .as_array()?
                .iter()
                .filter_map(|p| p["producerName"].as_str().map(str::to_string))
                .collect(),
        )
    }

    /// The last `lines` lines of the broker's log, for a failure's report.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(self.dir.path().join("pulsar.log")).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
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
