//! deploy/'s files held to what matters: every example config passes
//! `firstseen check-config`, manifests have the keys an operator relies on
//! and pass the Kubernetes API's schemas, and alerts and dashboard use only
//! documented metrics. The images and the compose file are run for real by
//! scripts/images.sh and scripts/compose.sh (opt-in: they take minutes).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn check_config(path: &Path, env: &[(&str, String)]) {
    let out = Command::new(env!("CARGO_BIN_EXE_firstseen"))
        .arg("check-config")
        .arg(path)
        .envs(env.iter().map(|(k, v)| (*k, v.clone())))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn yaml(path: &str) -> Vec<Value> {
    let out = Command::new("python3")
        .arg(repo().join("tests/tools/yaml2json.py"))
        .arg(repo().join(path))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{path} is not valid YAML: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn documented_metrics() -> BTreeSet<String> {
    firstseen::telemetry::METRICS
        .iter()
        .map(|(n, _, _)| n.to_string())
        .collect()
}

/// firstseen_* names used in a PromQL expression, with histogram suffixes removed.
fn metrics_in(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("firstseen_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        out.push(
            name.trim_end_matches("_bucket")
                .trim_end_matches("_count")
                .trim_end_matches("_sum")
                .to_string(),
        );
        rest = &tail[end..];
    }
    out
}

/// What deploy/make-secrets.sh makes at install, made for a test.
fn made_secrets() -> tempfile::TempDir {
    let dir = tempfile::TempDir::new().unwrap();
    let out = std::process::Command::new(repo().join("deploy/make-secrets.sh"))
        .arg(dir.path())
        .arg("3")
        .output()
        .expect("deploy/make-secrets.sh runs");
    assert!(
        out.status.success(),
        "make-secrets: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

/// The overrides that point a shipped config at `made`'s files for node
/// `id`, as an install puts them where the config names them.
fn installed(made: &Path, id: u64) -> Vec<(&'static str, String)> {
    let at = |f: &str| made.join(f).display().to_string();
    vec![
        ("FIRSTSEEN__CLUSTER__SECRET_FILE", at("cluster.secret")),
        ("FIRSTSEEN__CLUSTER__TLS__CA_FILE", at("ca.crt")),
        (
            "FIRSTSEEN__CLUSTER__TLS__CERT_FILE",
            at(&format!("node-{id}.crt")),
        ),
        (
            "FIRSTSEEN__CLUSTER__TLS__KEY_FILE",
            at(&format!("node-{id}.key")),
        ),
    ]
}

/// Every file the project ships for a cluster runs its peers on mutual TLS.
#[test]
fn no_shipped_cluster_config_speaks_in_the_clear() {
    let mut files = vec![
        "deploy/k8s/configmap.yaml".to_string(),
        "deploy/reference.toml".to_string(),
    ];
    for dir in ["deploy/config", "deploy/compose"] {
        for e in std::fs::read_dir(repo().join(dir)).unwrap().flatten() {
            if e.path().extension().is_some_and(|x| x == "toml") {
                files.push(format!("{dir}/{}", e.file_name().to_string_lossy()));
            }
        }
    }
    for f in files {
        let text = std::fs::read_to_string(repo().join(&f)).unwrap();
        let code: String = text
            .lines()
            .map(|l| l.split('#').next().unwrap_or_default().trim())
            .collect::<Vec<_>>()
            .join("\n");
        assert!(
            !code.contains("allow_plaintext = true"),
            "{f} lets peers talk in the clear"
        );
        if code.contains("[[cluster.members]]") {
            assert!(code.contains("[cluster.tls]"), "{f}: a cluster without TLS");
        }
    }
}

#[test]
fn example_configs_are_valid() {
    let mut checked = 0;
    for entry in std::fs::read_dir(repo().join("deploy/config"))
        .unwrap()
        .flatten()
    {
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) == Some("toml") {
            // check-config reads the token file a config names; the example's
            // /etc path stands for the operator's, so a readable one is
            // swapped in.
            let text = std::fs::read_to_string(&path).unwrap();
            let token = tempfile::NamedTempFile::new().unwrap();
            std::fs::write(token.path(), "a-token\n").unwrap();
            let made = made_secrets();
            let mut env: Vec<(&str, String)> = Vec::new();
            if text.contains("auth_token_file") {
                env.push((
                    "FIRSTSEEN__PULSAR__AUTH_TOKEN_FILE",
                    token.path().display().to_string(),
                ));
            }
            // The examples name the operator's secret and certificates,
            // which the repository does not ship: made as at install.
            if text.contains("[cluster.tls]") {
                env.extend(installed(made.path(), 1));
            } else if text.contains("secret_file") {
                env.push((
                    "FIRSTSEEN__CLUSTER__SECRET_FILE",
                    made.path().join("cluster.secret").display().to_string(),
                ));
            }
            check_config(&path, &env);
            checked += 1;
        }
    }
    assert!(checked >= 4);
}

#[test]
fn compose_runs_three_zones_with_mosquitto_and_pulsar() {
    let doc = &yaml("deploy/compose/docker-compose.yml")[0];
    let services = doc["services"].as_object().unwrap();
    for s in [
        "mosquitto",
        "pulsar",
        "firstseen-1",
        "firstseen-2",
        "firstseen-3",
    ] {
        assert!(services.contains_key(s), "compose lacks service {s}");
    }
    let pulsar_env = &services["pulsar"]["environment"];
    assert_eq!(
        pulsar_env["PULSAR_PREFIX_brokerDeduplicationEnabled"],
        "true"
    );
    for i in 1..=3 {
        let svc = &services[&format!("firstseen-{i}")];
        assert!(
            svc["healthcheck"]["test"].to_string().contains("/healthz"),
            "firstseen-{i} healthcheck"
        );
        assert!(
            svc["volumes"]
                .to_string()
                .contains(&format!("node-{i}.toml")),
            "firstseen-{i} config"
        );
        assert!(
            svc["volumes"].to_string().contains("/var/lib/firstseen"),
            "firstseen-{i} keeps state on a volume"
        );
        // The node configs are valid once the secret and certificates are
        // where Compose mounts them (scripts/compose.sh makes them with
        // deploy/make-secrets.sh; the repository ships none).
        let made = made_secrets();
        check_config(
            &repo().join(format!("deploy/compose/node-{i}.toml")),
            &installed(made.path(), i),
        );
        assert!(
            svc["secrets"].to_string().contains(&format!("node{i}_key")),
            "firstseen-{i} gets its own key"
        );
    }
}

/// The manifests against the API server's own OpenAPI schemas, strictly (an
/// unknown or misplaced field fails), for the oldest Kubernetes release still
/// in wide use and the newest the validator knows.
#[test]
fn kubernetes_manifests_pass_the_api_schemas() {
    let files: Vec<PathBuf> = std::fs::read_dir(repo().join("deploy/k8s"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    // StatefulSet, Services, PodDisruptionBudget, ConfigMap (the Secret is
    // made at install).
    assert!(files.len() >= 4);
    for version in ["1.30.0", "1.37.0"] {
        let out = Command::new("kubernetes-validate")
            .args(["--strict", "--quiet", "-k", version])
            .args(&files)
            .output()
            .expect("kubernetes-validate (pip, scripts/setup.sh)");
        assert!(
            out.status.success(),
            "Kubernetes {version}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn kubernetes_manifests_have_what_a_raft_statefulset_needs() {
    let sts = &yaml("deploy/k8s/statefulset.yaml")[0];
    assert_eq!(sts["kind"], "StatefulSet");
    assert_eq!(sts["spec"]["replicas"], 3);
    assert_eq!(sts["spec"]["serviceName"], "firstseen-peers");
    assert!(
        sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"]
            .is_string()
    );
    let c = &sts["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(
        sts["spec"]["template"]["spec"]["topologySpreadConstraints"][0]["topologyKey"],
        "topology.kubernetes.io/zone"
    );

    let services = yaml("deploy/k8s/services.yaml");
    let headless = services
        .iter()
        .find(|s| s["metadata"]["name"] == "firstseen-peers")
        .unwrap();
    assert_eq!(headless["spec"]["clusterIP"], "None");
    assert_eq!(headless["spec"]["publishNotReadyAddresses"], true);

    let pdb = &yaml("deploy/k8s/pdb.yaml")[0];
    assert_eq!(pdb["kind"], "PodDisruptionBudget");
    assert_eq!(
        pdb["spec"]["maxUnavailable"], 1,
        "at most one of three voters down"
    );

    assert!(
        !repo().join("deploy/k8s/secret.yaml").exists(),
        "the secret is made at install, not shipped"
    );

    // The ConfigMap's config is valid for pod 0 with its overrides.
    let cm = &yaml("deploy/k8s/configmap.yaml")[0];
    let dir = tempfile::TempDir::new().unwrap();
    let path = dir.path().join("firstseen.toml");
    std::fs::write(&path, cm["data"]["firstseen.toml"].as_str().unwrap()).unwrap();
    std::fs::write(dir.path().join("pulsar.jwt"), "a-token\n").unwrap();
    let made = made_secrets();
    let mut env = installed(made.path(), 1);
    env.extend([
        ("FIRSTSEEN__NODE__ID", "1".into()),
        ("FIRSTSEEN__NODE__ZONE", "eu-north-1a".into()),
        (
            "FIRSTSEEN__PULSAR__AUTH_TOKEN_FILE",
            dir.path().join("pulsar.jwt").display().to_string(),
        ),
    ]);
    check_config(&path, &env);
}

#[test]
fn alerts_and_dashboard_use_only_documented_metrics() {
    let known = documented_metrics();
    let rules = &yaml("deploy/prometheus/alerts.yaml")[0];
    let mut alerts = BTreeSet::new();
    for rule in rules["groups"][0]["rules"].as_array().unwrap() {
        alerts.insert(rule["alert"].as_str().unwrap().to_string());
        for m in metrics_in(rule["expr"].as_str().unwrap()) {
            assert!(
                known.contains(&m),
                "alert {} uses undocumented {m}",
                rule["alert"]
            );
        }
    }
    for a in [
        "FirstseenNoLeader",
        "FirstseenOutboxGrowing",
        "FirstseenZoneCoverageDropping",
        "FirstseenUpstreamDown",
    ] {
        assert!(alerts.contains(a), "missing alert {a}");
    }
    let dash: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("deploy/grafana/firstseen-dashboard.json")).unwrap(),
    )
    .unwrap();
    let mut used = 0;
    for panel in dash["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().unwrap() {
            for m in metrics_in(t["expr"].as_str().unwrap()) {
                assert!(
                    known.contains(&m),
                    "panel {} uses undocumented {m}",
                    panel["title"]
                );
                used += 1;
            }
        }
    }
    assert!(used >= 15);
}

#[test]
fn the_systemd_unit_runs_the_node_hardened() {
    let unit = std::fs::read_to_string(repo().join("deploy/systemd/firstseen.service")).unwrap();
    for line in [
        "ExecStart=/usr/local/bin/firstseen run --config /etc/firstseen/firstseen.toml",
        "ExecStartPre=/usr/local/bin/firstseen check-config /etc/firstseen/firstseen.toml",
        "KillSignal=SIGTERM",
        "StateDirectory=firstseen",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "PrivateTmp=yes",
        "CapabilityBoundingSet=",
        "Restart=on-failure",
    ] {
        assert!(unit.lines().any(|l| l == line), "unit lacks `{line}`");
    }
}
