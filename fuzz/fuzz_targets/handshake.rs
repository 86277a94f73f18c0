//! The peer handshake as both sides run it (`cluster::wire::handshake`), with
//! the bytes a peer sends replaced by fuzzed ones at each step. Nothing may
//! panic; a message the fuzzer made must never pass as a proof from a node
//! knowing the secret; an honest exchange must pass; and an honest message
//! with any byte of its proof changed must fail.
#![no_main]

use firstseen::cluster::wire::{handshake, ClusterKey, HandshakeError};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let key = ClusterKey::from_secret(b"fuzzing secret");
    let take = |at: usize, n: usize| -> Vec<u8> {
        (0..n).map(|i| data.get(at + i).copied().unwrap_or(0)).collect()
    };
    let challenge: [u8; 32] = take(0, 32).try_into().unwrap();
    let nonce: [u8; 32] = take(32, 32).try_into().unwrap();

    // A client given any hello: only the magic decides whether it answers.
    let hello: [u8; handshake::HELLO] = take(64, handshake::HELLO).try_into().unwrap();
    match handshake::answer(&key, &hello, 1, &nonce) {
        Ok(_) => assert_eq!(&hello[..8], firstseen::cluster::wire::MAGIC),
        Err(e) => assert_eq!(e, HandshakeError::NotAPeer),
    }

    // A server given any answer: accepted only if it is exactly the proof.
    let forged: [u8; handshake::CLIENT] = take(104, handshake::CLIENT).try_into().unwrap();
    if let Ok((node, _)) = handshake::accept(&key, &challenge, &forged, 2) {
        let honest = handshake::answer(&key, &handshake::hello(&challenge), node, &forged[8..40].try_into().unwrap()).unwrap();
        assert_eq!(forged, honest, "a forged answer passed");
    }

    // A client given any server reply: likewise.
    let reply: [u8; handshake::SERVER] = take(176, handshake::SERVER).try_into().unwrap();
    if let Ok(node) = handshake::confirm(&key, &nonce, &reply) {
        assert_eq!(reply[8..], key.server_proof(&nonce, node), "a forged reply passed");
    }

    // The honest exchange passes, and one changed byte breaks it.
    let hello = handshake::hello(&challenge);
    let answer = handshake::answer(&key, &hello, 7, &nonce).unwrap();
    let (node, reply) = handshake::accept(&key, &challenge, &answer, 3).unwrap();
    assert_eq!(node, 7);
    assert_eq!(handshake::confirm(&key, &nonce, &reply), Ok(3));
    if let (Some(&at), Some(&flip)) = (data.get(216), data.get(217)) {
        let flip = flip | 1;
        let mut bad = answer;
        bad[40 + at as usize % 32] ^= flip;
        assert!(handshake::accept(&key, &challenge, &bad, 3).is_err());
        let mut bad = reply;
        bad[8 + at as usize % 32] ^= flip;
        assert!(handshake::confirm(&key, &nonce, &bad).is_err());
    }
});
