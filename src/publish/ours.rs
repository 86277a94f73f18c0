//! Which messages in a topic are this cluster's: the proof-reading half of
//! the tail read ([`super::tail`] is the read itself). A message is ours
//! when it carries the cluster's proof ([`super::proof`]), or, at level 1
//! only, a producer name of the cluster's; a newer generation's proven
//! messages mean a recovered cluster publishes there ([`Superseded`]).

use super::proof::{Claim, Message, ProofKeys, Retired};
use super::props;

/// Every firstseen producer's name starts with this.
pub const PRODUCER_PREFIX: &str = "firstseen-";

/// Which messages are this cluster's: those that carry its proof
/// ([`super::proof`]), and, while the cluster runs at level 1 (a member may
/// be of a release that writes no proofs), those its producers' names claim.
///
/// Its producers are named `firstseen-c<cluster id>-…`, with the id derived
/// from the cluster secret ([`crate::secret::ClusterKey::cluster_id`]);
/// a name is for the operator, and counts as evidence only at level 1.
#[derive(Clone, Debug)]
pub struct Ours {
    prefix: String,
    /// Name prefixes counted at level 1: this secret's, the previous
    /// secrets', and, on a group of one without a secret file, `clocal`
    /// (what releases before the node kept a secret of its own named it).
    names: Vec<String>,
    proofs: ProofKeys,
    /// The topics this node found superseded (shared by every clone).
    superseded: Superseded,
    /// The cluster's generation, as the publisher last read it from the
    /// state (shared by every clone; 0 until then, and in `verify`).
    generation: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

/// The topics where this node found a proven message of a newer generation
/// than its cluster's, with that generation: a cluster recovered from this
/// one's data (`firstseen recover --force-new-cluster` on a member cut off
/// from it, not gone) publishes there, with the same secret. Both cannot
/// publish one topic: each would take the other's proven messages for its
/// own tail and skip or repeat what it lacks, and both have the same
/// upstream feed. The older one gives the topic up, for good: only the
/// operator can tell which cluster is to live (this one has to be stopped,
/// or the other), so nothing here lets go of the record but a restart, and
/// a restart finds the newer generation in the topic again. Read by
/// readiness. Shared by every clone.
#[derive(Clone, Debug, Default)]
pub struct Superseded {
    inner: std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<String, Found>>>,
}

/// What a superseded topic's tail read found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Found {
    /// This cluster's generation.
    pub ours: u64,
    /// The newer one found in the topic.
    pub newer: u64,
}

impl Superseded {
    /// Records that `topic` holds a proven message of generation `newer`,
    /// above this cluster's `ours`. Returns whether it is new.
    pub fn record(&self, topic: &str, ours: u64, newer: u64) -> bool {
        firstseen_store::lock::lock(&self.inner)
            .insert(topic.to_string(), Found { ours, newer })
            .is_none()
    }

    /// Whether `topic` was found superseded.
    pub fn contains(&self, topic: &str) -> bool {
        firstseen_store::lock::lock(&self.inner).contains_key(topic)
    }

    /// Every superseded topic.
    pub fn all(&self) -> Vec<(String, Found)> {
        firstseen_store::lock::lock(&self.inner)
            .iter()
            .map(|(t, f)| (t.clone(), *f))
            .collect()
    }
}

/// Whether a leader of generation `ours` must stop publishing a topic whose
/// tail read found proven messages of generation up to `found`: another
/// cluster, recovered from this one, publishes there.
pub fn superseded(ours: u64, found: u64) -> bool {
    found > ours
}

/// Where a message read from a topic comes from, as far as the cluster can
/// tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// It carries the cluster's proof: sequence `seq` is the cluster's.
    Proven(u64),
    /// No proof, but a producer name of the cluster's: counted as its own
    /// only while the cluster runs at level 1.
    Named(u64),
    /// It carries firstseen's properties and a proof that does not hold, or
    /// a sequence the cluster never assigned: someone else's, made to look
    /// like the cluster's.
    Forged,
    /// Anything else.
    Foreign,
}

impl Ours {
    /// The messages of the cluster with secret key `current`, and of the
    /// secrets it had before (`previous`). `local` for a group of one
    /// without a secret file.
    pub fn new(
        current: &crate::secret::ClusterKey,
        previous: &[crate::secret::ClusterKey],
        local: bool,
    ) -> Self {
        let name = |id: &str| format!("{PRODUCER_PREFIX}c{id}-");
        let mut names: Vec<String> = std::iter::once(current)
            .chain(previous)
            .map(|k| name(&k.cluster_id()))
            .collect();
        if local {
            names.push(name("local"));
        }
        Self {
            prefix: names[0].clone(),
            names,
            proofs: ProofKeys::new(current, previous),
            superseded: Superseded::default(),
            generation: Default::default(),
        }
    }

    /// The cluster's generation the tail read goes by: the publisher sets
    /// it from the state before each read.
    pub fn set_generation(&self, generation: u64) {
        self.generation
            .store(generation, std::sync::atomic::Ordering::Release);
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The topics this node found superseded (shared by every clone).
    pub fn superseded(&self) -> &Superseded {
        &self.superseded
    }

    /// With the previous secrets' cut-offs in `retired` (shared by every
    /// clone: the publisher records into it, the tail read checks by it).
    pub fn with_retired(mut self, retired: Retired) -> Self {
        self.proofs = self.proofs.with_retired(retired);
        self
    }

    /// The name of a producer of this cluster, `rest` telling them apart.
    pub fn producer_name(&self, rest: &str) -> String {
        format!("{}{rest}", self.prefix)
    }

    /// The keys proofs are made and checked with.
    pub fn proofs(&self) -> &ProofKeys {
        &self.proofs
    }

    /// Whether a producer of this cluster's name wrote it.
    fn named(&self, producer_name: &str) -> bool {
        self.names.iter().any(|p| producer_name.starts_with(p))
    }

    /// Where message (`meta`, `body`) of `topic` comes from. `assigned`:
    /// the last sequence the group assigned on the topic, when known (a
    /// sequence beyond it cannot be the cluster's, proof or not).
    pub fn origin(
        &self,
        topic: &str,
        meta: &pulsar::proto::MessageMetadata,
        body: &[u8],
        assigned: Option<u64>,
    ) -> Origin {
        let seq = props::get(meta, props::SEQ).and_then(|s| s.parse::<u64>().ok());
        let key = props::get(meta, props::KEY).and_then(super::proof::key_of);
        let (Some(seq), Some(key)) = (seq, key) else {
            return Origin::Foreign;
        };
        if seq == 0 || assigned.is_some_and(|a| seq > a) {
            return Origin::Forged;
        }
        match props::get(meta, props::PROOF) {
            Some(proof) => {
                if self.proves(topic, meta, body, seq, &key, proof) {
                    Origin::Proven(seq)
                } else {
                    Origin::Forged
                }
            }
            None if self.named(&meta.producer_name) => Origin::Named(seq),
            None => Origin::Foreign,
        }
    }

    /// Whether `proof` is the cluster's proof of message (`meta`, `body`),
    /// numbered `seq` with key `key`.
    fn proves(
        &self,
        topic: &str,
        meta: &pulsar::proto::MessageMetadata,
        body: &[u8],
        seq: u64,
        key: &[u8; 32],
        proof: &str,
    ) -> bool {
        self.judge(topic, meta, body, seq, key, proof, false)
    }

    /// [`Self::proves`], or with `whole` only the current secret's v2 proof
    /// ([`super::proof::ProofKeys::holds_whole`]).
    #[allow(clippy::too_many_arguments)]
    fn judge(
        &self,
        topic: &str,
        meta: &pulsar::proto::MessageMetadata,
        body: &[u8],
        seq: u64,
        key: &[u8; 32],
        proof: &str,
        whole: bool,
    ) -> bool {
        let claim = Claim {
            topic,
            seq,
            key,
            marker: props::get(meta, props::SET_ASIDE).is_some(),
            body,
        };
        // Every property counts (a v2 proof covers them all).
        let properties: Vec<(&str, &str)> = meta
            .properties
            .iter()
            .map(|kv| (kv.key.as_str(), kv.value.as_str()))
            .collect();
        let message = Message {
            claim,
            properties: &properties,
        };
        if whole {
            return self.proofs.holds_whole(&message, proof);
        }
        // A previous secret without a recorded cut-off proves as before
        // cut-offs: only `verify` without the node's record meets one (it
        // says so), as the publisher reads no tail until the record is
        // made.
        self.proofs.verifies(&message, proof)
    }

    /// Message (`meta`, `body`) as (sequence, key), when it carries the
    /// cluster's proof and is of a generation older than `own`, whatever
    /// its sequence: the lost members of a recovered cluster numbered on
    /// from where the survivor lagged.
    pub(super) fn of_older_generation(
        &self,
        topic: &str,
        meta: &pulsar::proto::MessageMetadata,
        body: &[u8],
        own: u64,
    ) -> Option<(u64, [u8; 32])> {
        let generation = match props::get(meta, props::GENERATION) {
            Some(g) => g.parse::<u64>().ok()?,
            None => 0,
        };
        if generation >= own {
            return None;
        }
        let seq = props::get(meta, props::SEQ)?.parse::<u64>().ok()?;
        let key = props::get(meta, props::KEY).and_then(super::proof::key_of)?;
        let proof = props::get(meta, props::PROOF)?;
        (seq != 0 && self.proves(topic, meta, body, seq, &key, proof)).then_some((seq, key))
    }

    /// The generation of message (`meta`, `body`) when it carries one
    /// (`firstseen-generation`) above `above` and the cluster's proof:
    /// whatever its sequence, since a cluster recovered from this one
    /// numbers on from its own survivor's sequences. Only the current
    /// secret's v2 proof counts: a generation stops a leader for good, and
    /// a v1 proof (which covers no property) or a retired secret's would let
    /// an outsider or a leaked old secret stop a healthy cluster.
    pub fn generation_above(
        &self,
        topic: &str,
        meta: &pulsar::proto::MessageMetadata,
        body: &[u8],
        above: u64,
    ) -> Option<u64> {
        let generation = props::get(meta, props::GENERATION)?.parse::<u64>().ok()?;
        if generation <= above {
            return None;
        }
        let seq = props::get(meta, props::SEQ)?.parse::<u64>().ok()?;
        let key = props::get(meta, props::KEY).and_then(super::proof::key_of)?;
        let proof = props::get(meta, props::PROOF)?;
        (seq != 0 && self.judge(topic, meta, body, seq, &key, proof, true)).then_some(generation)
    }
}
