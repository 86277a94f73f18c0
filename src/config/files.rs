//! The checks that read the files a config names: secrets, tokens,
//! certificates and keys. Apart from each section's checks on the values,
//! because they touch the disk, and so that `check-config` names an
//! unreadable, empty or malformed file before a node ever uses it. The
//! stages read the same files again when they start (a rotated token or
//! certificate is picked up then).

use std::path::Path;

use super::{secret_strength, Config};
use crate::problem::Problems;

/// Adds a problem for every file of `config` that cannot serve.
pub fn check(config: &Config, p: &mut Problems) {
    let pulsar = &config.pulsar;
    if let Some(f) = &pulsar.auth_token_file {
        not_empty("pulsar.auth_token_file", f, p);
    }
    if let Some(o) = &pulsar.oauth2 {
        not_empty("pulsar.oauth2.client_secret_file", &o.client_secret_file, p);
    }
    if let Some(ca) = &pulsar.ca_file {
        // A ca_file on plain TCP is reported by the section's own check.
        if pulsar.url.starts_with("pulsar+ssl://") {
            if let Err(e) = crate::tls::certs(ca) {
                p.add("pulsar.ca_file", e.to_string());
            }
        }
    }
    if let Some(tls) = &config.node.http_tls {
        if let Err(e) = crate::tls::http::server_config(tls) {
            p.add(format!("node.http_tls.{}", e.key), e.problem.to_string());
        }
    }
    for (i, u) in config.upstreams.iter().enumerate() {
        let tls = crate::ingest::config::UpstreamAddr::parse(&u.url).is_ok_and(|a| a.tls);
        let paired = u.cert_file.is_some() == u.key_file.is_some();
        if u.tls_files() && tls && paired {
            if let Err(e) = crate::tls::upstream::client_config(u.tls_settings()) {
                p.add(format!("upstreams[{i}].{}", e.key), e.problem.to_string());
            }
        }
    }
    if let Some(tls) = &config.cluster.tls {
        for (key, path) in [
            ("cluster.tls.cert_file", &tls.cert_file),
            ("cluster.tls.key_file", &tls.key_file),
            ("cluster.tls.ca_file", &tls.ca_file),
        ] {
            if let Err(e) = std::fs::metadata(path) {
                p.add(key, format!("cannot read {}: {e}", path.display()));
            }
        }
    }
    if let Some(f) = &config.node.admin_token_file {
        strong_secret("node.admin_token_file", f, p);
    }
    if !config.cluster.members.is_empty() {
        if let Some(f) = &config.cluster.secret_file {
            strong_secret("cluster.secret_file", f, p);
        }
    }
}

fn not_empty(key: &str, path: &Path, p: &mut Problems) {
    match std::fs::read_to_string(path) {
        Ok(t) if t.trim().is_empty() => p.add(key, format!("{} is empty", path.display())),
        Ok(_) => {}
        Err(e) => p.add(key, format!("cannot read {}: {e}", path.display())),
    }
}

fn strong_secret(key: &str, path: &Path, p: &mut Problems) {
    match std::fs::read(path) {
        Ok(s) => {
            if let Err(why) = secret_strength(&s) {
                p.add(key, format!("{}: {why}", path.display()));
            }
        }
        Err(e) => p.add(key, format!("cannot read {}: {e}", path.display())),
    }
}
