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
    let old = match old_cluster(&mut storage).await {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let members = &old.members;
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
    // Only voters make a quorum: a learner answering says nothing of
    // whether the old cluster can still commit, so learners are not asked.
    let others: Vec<&(NodeId, String)> = members
        .iter()
        .filter(|(id, _)| *id != me && old.voters().contains(id))
        .collect();
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
    if still_has_quorum(&old.configs, &alive) {
        eprintln!(
            "error: the cluster still has a quorum: nodes {:?} of its voters {:?} answer. Start this node normally; it rejoins. recover is for a survivor whose cluster has lost its majority for good",
            alive.intersection(&old.voters()).collect::<Vec<_>>(),
            old.voters()
        );
        return ExitCode::from(1);
    }
    match firstseen_raft::recover::force_single(&dir, &mut storage, me).await {
        Ok(f) => {
            let totals = storage.state.totals().unwrap_or_default();
            println!(
                "node {me} is now the only member of its cluster (it had {:?}), generation {}: term {}, log entry {}; the log up to {:?} is kept, and the state with it ({} keys in the window, {} messages in the outbox).",
                f.before, firstseen_raft::recover::shown(f.generation), f.term, f.index, f.last_before.map(|l| l.index), totals.window_keys, totals.outbox_messages
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

/// The cluster the storage's log ends in: its members with their peer
/// addresses (voters and learners), and its voter configurations (one, or
/// two during a joint change).
struct OldCluster {
    members: Vec<(NodeId, String)>,
    configs: Vec<BTreeSet<NodeId>>,
}

impl OldCluster {
    fn voters(&self) -> BTreeSet<NodeId> {
        self.configs.iter().flatten().copied().collect()
    }
}

async fn old_cluster(
    storage: &mut firstseen_raft::Storage,
) -> Result<OldCluster, firstseen_raft::recover::RecoverError> {
    let m = firstseen_raft::recover::membership(storage)
        .await?
        .ok_or(firstseen_raft::recover::RecoverError::NoMembership)?;
    Ok(OldCluster {
        members: m.nodes().map(|(id, n)| (*id, n.addr.clone())).collect(),
        configs: m.get_joint_config().clone(),
    })
}

/// Whether the old cluster can still commit with the members in `alive`
/// running: a majority of the voters of each of its configurations (two
/// during a joint change) answers. Learners never count, on either side:
/// they do not vote. Counted among the members, as before, a learner made
/// the denominator larger, so a survivor whose voters still had a
/// majority was recovered anyway (issue 49 item 3).
fn still_has_quorum(configs: &[BTreeSet<NodeId>], alive: &BTreeSet<NodeId>) -> bool {
    !configs.is_empty()
        && configs
            .iter()
            .all(|voters| voters.intersection(alive).count() * 2 > voters.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ids: &[NodeId]) -> BTreeSet<NodeId> {
        ids.iter().copied().collect()
    }

    /// Voters 1, 2, 3 and learners 4, 5: node 1 with voter 2 answering is
    /// a majority of the voters, whatever the learners do. Counted among
    /// all five members (the old rule), 2 of 5 was no quorum and the
    /// survivor was recovered beside a cluster that still commits.
    #[test]
    fn only_voters_make_the_quorum() {
        let voters = vec![set(&[1, 2, 3])];
        assert!(still_has_quorum(&voters, &set(&[1, 2])));
        // Learners answering make no quorum of their own.
        assert!(!still_has_quorum(&voters, &set(&[1, 4, 5])));
        assert!(!still_has_quorum(&voters, &set(&[1])));
    }

    /// During a joint change both configurations must have a majority for
    /// the old cluster to commit.
    #[test]
    fn a_joint_membership_needs_a_majority_of_each() {
        let joint = vec![set(&[1, 2, 3]), set(&[3, 4, 5])];
        assert!(!still_has_quorum(&joint, &set(&[1, 2])));
        assert!(still_has_quorum(&joint, &set(&[1, 3, 4])));
        assert!(!still_has_quorum(&[], &set(&[1])));
    }
}
