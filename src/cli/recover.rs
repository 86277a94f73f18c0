//! `firstseen recover --force-new-cluster`: a lone survivor's data made a
//! cluster of one (`firstseen_raft::recover`), when the rest of its cluster
//! is gone for good. Refused while the old cluster still has a quorum.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use firstseen_raft::NodeId;

use crate::cluster::peers::{CallError, Peers};
use crate::cluster::wire::Request;
use crate::config::Config;

/// `firstseen recover`'s arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The stopped node's config.
    #[arg(long, short)]
    pub config: PathBuf,
    /// Make this node the only member of its cluster, keeping its window,
    /// outbox and sequences. Only when the other members are gone for good:
    /// refused while a majority of them answers.
    #[arg(long)]
    pub force_new_cluster: bool,
}

/// Whether a member answered the cluster's handshake: then it runs, and
/// counts towards the old cluster's quorum.
fn answered(r: &Result<crate::cluster::wire::Reply, CallError>) -> bool {
    match r {
        Ok(_) => true,
        // The handshake proved it; a release from before levels then
        // closes the connection on the question.
        Err(CallError::Lost { .. } | CallError::Protocol { .. }) => true,
        Err(_) => false,
    }
}

pub async fn run(args: Args) -> ExitCode {
    if !args.force_new_cluster {
        eprintln!("error: say --force-new-cluster: recover makes this node the only member of its cluster");
        return ExitCode::from(2);
    }
    let config = match Config::load(&args.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let me = config.node.id;
    let dir = config.node.data_dir.join("raft");
    let mut storage = match firstseen_raft::open(&dir).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!(
                "error: cannot open {}: {e} (is the node still running? stop it first)",
                dir.display()
            );
            return ExitCode::from(2);
        }
    };
    // Who the old cluster is, by its own log.
    let members: Vec<(NodeId, String)> = match members_of(&mut storage).await {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    // The old cluster still commits if a majority of it runs: this node
    // plus the others that answer.
    let key = match crate::cluster::load_key(&config.cluster, &config.node.cx()) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let tls = match config
        .cluster
        .tls
        .as_ref()
        .map(crate::tls::PeerTls::load)
        .transpose()
    {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let tasks = tokio_util::task::TaskTracker::new();
    let peers = Peers::new(
        me,
        key,
        None,
        tls,
        Arc::new(crate::cluster::liveness::Liveness::new()),
        tasks.clone(),
    );
    let others: Vec<&(NodeId, String)> = members.iter().filter(|(id, _)| *id != me).collect();
    let mut alive = BTreeSet::from([me]);
    for (id, addr) in &others {
        let r = peers
            .call(*id, addr, &Request::Levels, Duration::from_secs(3))
            .await;
        if answered(&r) {
            alive.insert(*id);
        } else {
            eprintln!(
                "recover: node {id} at {addr} does not answer: {}",
                r.err().map(|e| e.to_string()).unwrap_or_default()
            );
        }
    }
    peers.close();
    tasks.close();
    if alive.len() * 2 > members.len() {
        eprintln!(
            "error: the cluster still has a quorum: nodes {alive:?} of {:?} answer. Start this node normally; it rejoins. recover is for a survivor whose cluster has lost its majority for good",
            members.iter().map(|(id, _)| *id).collect::<Vec<_>>()
        );
        return ExitCode::from(1);
    }
    match firstseen_raft::recover::force_single(&dir, &mut storage, me).await {
        Ok(f) => {
            let totals = storage.state.totals().unwrap_or_default();
            println!(
                "node {me} is now the only member of its cluster (it had {:?}): term {}, log entry {}; the log up to {:?} is kept, and the state with it ({} keys in the window, {} messages in the outbox).",
                f.before, f.term, f.index, f.last_before.map(|l| l.index), totals.window_keys, totals.outbox_messages
            );
            println!("Start it with `firstseen run`, then add members with `firstseen members add` (new ids, empty data directories). Never start the lost members again on their old data: among themselves they are still a majority of the old cluster.");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// The members of the cluster the storage's log ends in, with their peer
/// addresses.
async fn members_of(
    storage: &mut firstseen_raft::Storage,
) -> Result<Vec<(NodeId, String)>, firstseen_raft::recover::RecoverError> {
    let m = firstseen_raft::recover::membership(storage)
        .await?
        .ok_or(firstseen_raft::recover::RecoverError::NoMembership)?;
    Ok(m.nodes().map(|(id, n)| (*id, n.addr.clone())).collect())
}
