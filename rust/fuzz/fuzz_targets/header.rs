//! Any bytes as a request header: decoding and validation must never panic, and whatever
//! decodes must re-encode to the same bytes.
#![no_main]

use benchfs_core::protocol::{check_request, Header};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = Header::decode(data) {
        assert_eq!(&h.encode()[..], data);
        let _ = check_request(&h, data.len(), 1 << 22);
    }
});
