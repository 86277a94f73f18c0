//! The peer handshake's 72-byte answer (node id, nonce, proof), checked
//! against a challenge: arbitrary bytes must never pass as a proof.
#![no_main]

use firstseen::cluster::wire::ClusterKey;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 + 32 + 32 + 32 {
        return;
    }
    let key = ClusterKey::from_secret(b"fuzzing secret");
    let challenge: [u8; 32] = data[72..104].try_into().unwrap();
    let node = u64::from_be_bytes(data[..8].try_into().unwrap());
    let proof: [u8; 32] = data[40..72].try_into().unwrap();
    // A forged proof matching by chance would be a 2^-256 event: any hit is
    // a bug in the check.
    assert!(
        !key.check_client(&challenge, node, &proof) || proof == key.client_proof(&challenge, node)
    );
});
