//! `firstseen members add|remove` and `firstseen upgrade`: admin requests
//! through any node, which forwards the operator to the leader.

use std::path::PathBuf;
use std::process::ExitCode;

use super::api;

#[derive(Debug, clap::Subcommand)]
pub enum Action {
    /// Add a node: it joins as a learner, catches up (by snapshot if
    /// needed), then becomes a voter.
    Add {
        #[arg(long)]
        id: u64,
        #[arg(long)]
        zone: String,
        /// Its peer address (host:port).
        #[arg(long)]
        addr: String,
        /// Its HTTP API address (host:port).
        #[arg(long, default_value = "")]
        http: String,
    },
    /// Remove a node from the group.
    Remove {
        #[arg(long)]
        id: u64,
    },
}

/// An admin request: a membership change, or raising the cluster level.
pub enum Admin {
    Members(Action),
    /// Raise the cluster level to the highest every member runs
    /// (`POST /admin/upgrade`).
    Upgrade,
}

/// Sends `action` to the node at `url`, or to the leader it names.
pub async fn run(
    action: Action,
    url: String,
    secret_file: Option<PathBuf>,
    ca_file: Option<PathBuf>,
) -> ExitCode {
    send(Admin::Members(action), url, secret_file, ca_file).await
}

/// Sends `request` to the node at `url`, or to the leader it names.
pub async fn send(
    request: Admin,
    url: String,
    secret_file: Option<PathBuf>,
    ca_file: Option<PathBuf>,
) -> ExitCode {
    let Some(secret_file) = secret_file else {
        eprintln!("error: --secret-file (or FIRSTSEEN_SECRET_FILE) is required for admin requests");
        return ExitCode::from(2);
    };
    let secret = match std::fs::read_to_string(&secret_file) {
        Ok(s) => s.trim_end_matches('\n').to_string(),
        Err(e) => {
            eprintln!("error: cannot read {}: {e}", secret_file.display());
            return ExitCode::from(2);
        }
    };
    if secret.is_empty() || !secret.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        eprintln!(
            "error: {}: the secret must be one line of printable ASCII without spaces to be sent as a bearer token",
            secret_file.display()
        );
        return ExitCode::from(2);
    }
    let client = match api::client(ca_file.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: --ca-file: {e}");
            return ExitCode::from(2);
        }
    };
    let mut base = url.trim_end_matches('/').to_string();
    // The leader is asked with the scheme the operator chose: a hop must
    // not fall back from https to plain HTTP with the secret.
    let scheme = if base.starts_with("https://") {
        "https"
    } else {
        "http"
    };
    // At most one hop: a follower answers 409 with the leader's address.
    for _ in 0..2 {
        let request = match &request {
            Admin::Members(Action::Add {
                id,
                zone,
                addr,
                http,
            }) => client
                .post(format!("{base}/admin/members"))
                .json(&serde_json::json!({"id": id, "zone": zone, "addr": addr, "http": http})),
            Admin::Members(Action::Remove { id }) => {
                client.delete(format!("{base}/admin/members/{id}"))
            }
            Admin::Upgrade => client.post(format!("{base}/admin/upgrade")),
        };
        if let Err(why) = api::credential_may_go_to(&base) {
            eprintln!("error: {why}");
            return ExitCode::from(2);
        }
        let response = match request.bearer_auth(&secret).send().await {
            Ok(r) => r,
            Err(e) => {
                eprintln!("error: cannot reach {base}: {e}");
                return ExitCode::from(2);
            }
        };
        let status = response.status();
        let body: serde_json::Value = response.json().await.unwrap_or_default();
        if status.is_success() {
            println!("{body}");
            return ExitCode::SUCCESS;
        }
        if status == reqwest::StatusCode::CONFLICT {
            if let Some(leader) = body["leader_http"].as_str().filter(|h| !h.is_empty()) {
                eprintln!("{base} is not the leader; asking {leader}");
                base = format!("{scheme}://{leader}");
                continue;
            }
        }
        eprintln!(
            "error: {status}: {}",
            body["error"].as_str().unwrap_or("request failed")
        );
        return ExitCode::from(2);
    }
    eprintln!("error: could not find the leader");
    ExitCode::from(2)
}
