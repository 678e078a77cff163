//! The mesh's frame header parser: any 40 bytes either fail to decode or decode to a header
//! that encodes back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rustdist_core::transport::frame::{Header, HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    let Some(bytes) = data.get(..HEADER_LEN) else {
        return;
    };
    let mut b = [0u8; HEADER_LEN];
    b.copy_from_slice(bytes);
    if let Ok(h) = Header::decode(&b, 1) {
        assert_eq!(h.encode(), b);
    }
});
