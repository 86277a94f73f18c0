//! Results read back the way a user would: the official Python client
//! (envelopes decoded with Python's protobuf) and `firstseen verify`.

use super::*;

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

impl ReadBack {
    /// The sequences that came late: after a higher one, in the order read.
    pub fn late(&self) -> Vec<u64> {
        let mut highest = 0;
        self.seqs
            .iter()
            .flatten()
            .filter_map(|&s| {
                let came_late = s < highest;
                highest = highest.max(s);
                came_late.then_some(s)
            })
            .collect()
    }
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

/// Runs `firstseen verify --trust-names`: the audit of messages a test
/// wrote itself, without the cluster's proofs.
pub fn verify_by_name(pulsar: &Pulsar, topic: &str, expect: Option<u64>) -> (i32, String) {
    let mut c = Command::new(bin());
    c.args([
        "verify",
        "--pulsar-url",
        &pulsar.url,
        "--topic",
        topic,
        "--trust-names",
    ]);
    if let Some(n) = expect {
        c.args(["--expect", &n.to_string()]);
    }
    let out = c.output().expect("run firstseen verify");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// Runs `firstseen verify` with the cluster secret in `secret` (the
/// cluster's file, or the one a group of one keeps in its data directory:
/// [`Node::secret_file`]) and returns (exit code, stdout).
pub fn verify(pulsar: &Pulsar, topic: &str, expect: Option<u64>, secret: &Path) -> (i32, String) {
    let mut c = Command::new(bin());
    c.args(["verify", "--pulsar-url", &pulsar.url, "--topic", topic]);
    c.arg("--secret-file").arg(secret);
    if let Some(n) = expect {
        c.args(["--expect", &n.to_string()]);
    }
    let out = c.output().expect("run firstseen verify");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}
