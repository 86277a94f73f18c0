//! Traffic into Mosquitto: the HFP capture replayed, single messages.

use super::*;

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
