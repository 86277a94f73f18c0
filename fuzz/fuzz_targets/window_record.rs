//! The packed records of the dedup window and the outbox (varints, masks,
//! runs), as read back from the state database. Whatever decodes must
//! encode to the same value again.
#![no_main]

use firstseen_store::record;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut at = 0;
    while let Some(_) = record::get_varint(data, &mut at) {
        assert!(at <= data.len());
    }
    if let Some((ts, items)) = record::decode_record(data) {
        let again = record::encode_record(ts, &items);
        assert_eq!(record::decode_record(&again), Some((ts, items)));
    }
    if let Some(masks) = record::decode_masks(data) {
        assert_eq!(
            record::decode_masks(&record::encode_masks(&masks)),
            Some(masks)
        );
    }
    if let Some(run) = record::decode_run(data) {
        assert_eq!(record::decode_run(&record::encode_run(&run)), Some(run));
    }
    let _ = record::record_ts(data);
});
