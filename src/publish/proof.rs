//! The cluster's proof on every message it publishes, and the check that
//! tells its messages from anyone else's.
//!
//! Anyone who may write to a topic can name a producer like the cluster's
//! (`firstseen-c<id>-…`: the id is in every producer name the broker
//! shows) and number messages like the cluster's. A new leader that took
//! such a message for the end of what the cluster published resumed after
//! it, and the watermark that followed trimmed the cluster's own messages
//! from every outbox unpublished, while `verify`, counting by name, said OK.
//! So each message carries `firstseen-proof`: a MAC under a key derived from
//! the cluster secret, over what makes it this message in this place: the
//! Pulsar topic, the sequence, the key, whether it is a marker, and the
//! body. Only a holder of the secret can make one; a copy of a real message
//! moved to another topic or sequence fails it.
//!
//! What a proof cannot stop: the same message written again at the end of
//! its topic (a replay). Its sequence is one the cluster already wrote, so
//! a publisher resumes no further than that (at worst a few messages twice,
//! never one skipped), and `verify` counts the copy as a repeat.

use crate::secret::ClusterKey;

/// Bytes of a proof: 128 bits of blake3 in keyed mode, written as hex.
const PROOF_BYTES: usize = 16;

/// What a proof covers: one message as it is in Pulsar.
#[derive(Debug, Clone, Copy)]
pub struct Claim<'a> {
    /// The Pulsar topic, in any spelling ([`canonical_topic`] is taken).
    pub topic: &'a str,
    pub seq: u64,
    pub key: &'a [u8; 32],
    /// A marker in place of a message the broker would refuse.
    pub marker: bool,
    /// The message's body as written (the payload, or its envelope).
    pub body: &'a [u8],
}

/// A topic as the broker names it: `my-topic` is
/// `persistent://public/default/my-topic`. A proof made for one spelling
/// holds for the other.
pub fn canonical_topic(topic: &str) -> std::borrow::Cow<'_, str> {
    if topic.contains("://") {
        std::borrow::Cow::Borrowed(topic)
    } else if topic.matches('/').count() == 2 {
        std::borrow::Cow::Owned(format!("persistent://{topic}"))
    } else {
        std::borrow::Cow::Owned(format!("persistent://public/default/{topic}"))
    }
}

/// The key proofs are made with, derived from a cluster secret.
#[derive(Clone)]
pub struct ProofKey([u8; 32]);

impl std::fmt::Debug for ProofKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProofKey(…)")
    }
}

impl ProofKey {
    pub fn of(cluster: &ClusterKey) -> Self {
        Self(cluster.derive("firstseen pulsar proof v1"))
    }

    fn mac(&self, c: &Claim<'_>) -> [u8; PROOF_BYTES] {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        let topic = canonical_topic(c.topic);
        h.update(&(topic.len() as u64).to_be_bytes());
        h.update(topic.as_bytes());
        h.update(&c.seq.to_be_bytes());
        h.update(c.key);
        h.update(&[c.marker as u8]);
        h.update(&(c.body.len() as u64).to_be_bytes());
        h.update(c.body);
        let mut out = [0u8; PROOF_BYTES];
        out.copy_from_slice(&h.finalize().as_bytes()[..PROOF_BYTES]);
        out
    }

    /// The proof of `c`, as the property's value.
    pub fn sign(&self, c: &Claim<'_>) -> String {
        hex::encode(self.mac(c))
    }

    /// Whether `proof` is this key's proof of `c`. Compared in constant
    /// time (through blake3's hash equality).
    pub fn verifies(&self, c: &Claim<'_>, proof: &str) -> bool {
        let Ok(given) = hex::decode(proof) else {
            return false;
        };
        if given.len() != PROOF_BYTES {
            return false;
        }
        let mut want = [0u8; 32];
        want[..PROOF_BYTES].copy_from_slice(&self.mac(c));
        let mut got = [0u8; 32];
        got[..PROOF_BYTES].copy_from_slice(&given);
        blake3::Hash::from(want) == blake3::Hash::from(got)
    }
}

/// The keys a cluster's messages can carry proofs of: its secret's, and
/// those of the secrets it had before a rotation (messages written under
/// them are still its own). Signs with the first.
#[derive(Clone, Debug)]
pub struct ProofKeys(Vec<ProofKey>);

impl ProofKeys {
    pub fn new(current: &ClusterKey, previous: &[ClusterKey]) -> Self {
        Self(
            std::iter::once(current)
                .chain(previous)
                .map(ProofKey::of)
                .collect(),
        )
    }

    pub fn sign(&self, c: &Claim<'_>) -> String {
        self.0[0].sign(c)
    }

    /// Whether any of the keys made `proof` for `c`.
    pub fn verifies(&self, c: &Claim<'_>, proof: &str) -> bool {
        self.0.iter().any(|k| k.verifies(c, proof))
    }
}

/// A message's key from its `firstseen-key` property.
pub fn key_of(hex_key: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(hex_key, &mut out).ok()?;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim<'a>(topic: &'a str, seq: u64, key: &'a [u8; 32], body: &'a [u8]) -> Claim<'a> {
        Claim {
            topic,
            seq,
            key,
            marker: false,
            body,
        }
    }

    #[test]
    fn a_proof_holds_for_its_message_only_and_only_under_the_secret() {
        let keys = ProofKeys::new(&ClusterKey::from_secret(b"the cluster's secret"), &[]);
        let key = [7u8; 32];
        let c = claim("persistent://public/default/t", 5, &key, b"payload");
        let proof = keys.sign(&c);
        assert_eq!(proof.len(), 32);
        assert!(keys.verifies(&c, &proof));
        // Moved to another topic or sequence, changed, or made a marker.
        let other_key = [8u8; 32];
        for forged in [
            claim("persistent://public/default/u", 5, &key, b"payload"),
            claim("persistent://public/default/t", 6, &key, b"payload"),
            claim("persistent://public/default/t", 5, &other_key, b"payload"),
            claim("persistent://public/default/t", 5, &key, b"payloaD"),
            Claim { marker: true, ..c },
        ] {
            assert!(!keys.verifies(&forged, &proof), "{forged:?}");
        }
        // Another secret's proof, or no proof at all.
        let other = ProofKeys::new(&ClusterKey::from_secret(b"a guess"), &[]);
        assert!(!keys.verifies(&c, &other.sign(&c)));
        assert!(!keys.verifies(&c, "not hex"));
        assert!(!keys.verifies(&c, ""));
    }

    #[test]
    fn the_topic_counts_in_any_spelling() {
        let keys = ProofKeys::new(&ClusterKey::from_secret(b"s"), &[]);
        let key = [1u8; 32];
        let proof = keys.sign(&claim("t", 1, &key, b""));
        assert!(keys.verifies(
            &claim("persistent://public/default/t", 1, &key, b""),
            &proof
        ));
        assert!(keys.verifies(&claim("public/default/t", 1, &key, b""), &proof));
    }

    /// After a rotation the old secret's messages are still the cluster's;
    /// the new one signs.
    #[test]
    fn a_previous_secret_s_proofs_still_hold() {
        let old = ClusterKey::from_secret(b"old secret");
        let new = ClusterKey::from_secret(b"new secret");
        let key = [3u8; 32];
        let c = claim("t", 9, &key, b"x");
        let before = ProofKeys::new(&old, &[]).sign(&c);
        let rotated = ProofKeys::new(&new, std::slice::from_ref(&old));
        assert!(rotated.verifies(&c, &before));
        assert_ne!(rotated.sign(&c), before);
        assert!(!ProofKeys::new(&new, &[]).verifies(&c, &before));
    }

    #[test]
    fn keys_are_read_from_their_hex() {
        assert_eq!(key_of(&"ab".repeat(32)), Some([0xab; 32]));
        assert_eq!(key_of("ab"), None);
        assert_eq!(key_of(&"zz".repeat(32)), None);
    }
}
