//! A snapshot stream as a leader sends it (or a file holds it), imported
//! into a fresh state database: any bytes must give an error or a state,
//! never a panic.
#![no_main]

use firstseen_store::StateStore;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let db = sled::Config::new().temporary(true).open().unwrap();
    let store = StateStore::open(&db).unwrap();
    let _ = store.import(&mut &data[..]);
});
