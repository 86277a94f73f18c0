//! The JSON-field key extractor on any payload: an error or a key, never a
//! panic, and the same payload re-serialised by serde_json keys the same
//! (field order and number format do not change a key).
#![no_main]

use firstseen::key::{field_key, FieldKey, Missing};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let spec = FieldKey {
        json: vec!["/VP/veh".into(), "/VP/tst".into(), "".into()],
        topic: true,
        missing: Missing::default(),
    };
    let Ok(key) = field_key(&spec, "/hfp/v2/journey", data) else {
        return;
    };
    let doc: serde_json::Value = serde_json::from_slice(data).expect("it parsed once");
    let again = serde_json::to_vec(&doc).unwrap();
    assert_eq!(field_key(&spec, "/hfp/v2/journey", &again).ok(), Some(key));
});
