//! A node's data directory on `firstseen-crashfs`, the project's FUSE
//! filesystem that loses every write not yet fsynced when told the power
//! went out (crashfs/src/lib.rs).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use tempfile::TempDir;

/// The crashfs binary, built beside firstseen by `cargo build --workspace`.
pub fn bin() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_BIN_EXE_firstseen")).with_file_name("firstseen-crashfs");
    assert!(
        p.exists(),
        "{} is missing: build the workspace (scripts/test.sh runs `cargo build --workspace --all-targets`)",
        p.display()
    );
    p
}

/// One mounted crashfs.
pub struct CrashFs {
    child: Option<Child>,
    /// Its standard input: when this process dies, the pipe closes and
    /// crashfs unmounts itself (`--exit-on-stdin-eof`).
    _lifeline: Option<ChildStdin>,
    /// Where the filesystem is mounted: put a node's data_dir under it.
    pub mount: PathBuf,
    control: PathBuf,
    _dir: TempDir,
}

impl CrashFs {
    /// Mounts a new, empty crashfs and waits until it answers.
    #[allow(dead_code)] // the simulation mounts in memory
    pub fn start() -> Self {
        Self::start_in(&std::env::temp_dir())
    }

    /// The same, with its backing directory, mount point and socket in a
    /// new directory under `parent`.
    pub fn start_in(parent: &Path) -> Self {
        let dir = TempDir::new_in(parent).unwrap();
        let mount = dir.path().join("mnt");
        let control = dir.path().join("control.sock");
        let mut child = Command::new(bin())
            .arg("--backing")
            .arg(dir.path().join("backing"))
            .arg("--mount")
            .arg(&mount)
            .arg("--control")
            .arg(&control)
            .arg("--exit-on-stdin-eof")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn firstseen-crashfs");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(
            line.trim(),
            "ready",
            "firstseen-crashfs did not mount (needs /dev/fuse)"
        );
        Self {
            _lifeline: child.stdin.take(),
            child: Some(child),
            mount,
            control,
            _dir: dir,
        }
    }

    /// Sends one command; returns the reply line.
    pub fn command(&self, cmd: &str) -> String {
        let mut s = UnixStream::connect(&self.control).expect("crashfs control socket");
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        writeln!(s, "{cmd}").unwrap();
        let mut reply = String::new();
        BufReader::new(s).read_line(&mut reply).unwrap();
        let reply = reply.trim().to_string();
        assert!(reply.starts_with("ok"), "crashfs `{cmd}`: {reply}");
        reply
    }

    /// The power goes out: every write not yet fsynced is undone, and each
    /// file's last lost write survives in part (seeded). Kill every process
    /// using the filesystem first.
    pub fn lose_power(&self, seed: u64) -> String {
        self.command(&format!("lose-power-torn {seed}"))
    }

    /// The power goes off while the process may still run: its later
    /// writes and fsyncs are dropped, until [`CrashFs::lose_power`].
    pub fn power_off(&self) {
        self.command("power-off");
    }

    /// Limits file data to `bytes`, or lifts the limit.
    pub fn quota(&self, bytes: Option<u64>) {
        match bytes {
            Some(b) => self.command(&format!("quota {b}")),
            None => self.command("quota off"),
        };
    }

    /// The storage stalls: every write and sync from now on blocks its
    /// caller, unanswered, until [`CrashFs::thaw`]. Nothing is lost.
    pub fn freeze(&self) {
        self.command("freeze");
    }

    /// Carries out the writes and syncs the freeze held, in the order they
    /// came, and lets later ones through; returns how many were held.
    pub fn thaw(&self) -> u64 {
        let reply = self.command("thaw");
        reply
            .split_whitespace()
            .find_map(|w| w.strip_prefix("held="))
            .and_then(|v| v.parse().ok())
            .expect("crashfs thaw has held=")
    }

    /// Writes and syncs held by a freeze right now.
    pub fn held(&self) -> u64 {
        let reply = self.command("status");
        reply
            .split_whitespace()
            .find_map(|w| w.strip_prefix("held="))
            .and_then(|v| v.parse().ok())
            .expect("crashfs status has held=")
    }

    /// Bytes of file data held now.
    pub fn used(&self) -> u64 {
        let reply = self.command("status");
        reply
            .split_whitespace()
            .find_map(|w| w.strip_prefix("used="))
            .and_then(|v| v.parse().ok())
            .expect("crashfs status has used=")
    }
}

impl Drop for CrashFs {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Ok(mut s) = UnixStream::connect(&self.control) {
                let _ = writeln!(s, "unmount");
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                let mut reply = String::new();
                let _ = BufReader::new(s).read_line(&mut reply);
            }
            for _ in 0..50 {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
            let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
        }
    }
}
