//! A peer frame as it arrives: a 4-byte length, checked before the body is
//! read, then the bincode body of a request or a reply. Nothing may panic
//! or allocate without bound; a frame that decodes must encode again.
#![no_main]

use firstseen::cluster::wire::{self, Envelope, Reply, Request};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let header: [u8; 4] = data[..4].try_into().unwrap();
    if wire::frame_len(header).is_err() {
        return;
    }
    let body = &data[4..];
    if let Ok(r) = wire::decode::<Envelope<Request>>(body) {
        wire::encode(&r).expect("a decoded request encodes");
    }
    if let Ok(r) = wire::decode::<Envelope<Reply>>(body) {
        wire::encode(&r).expect("a decoded reply encodes");
    }
});
