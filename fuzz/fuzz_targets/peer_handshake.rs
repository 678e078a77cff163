//! The peer handshake's messages (transport/tcp/handshake.rs): any bytes either fail to decode
//! as a hello or a reply, or decode to one that survives encoding and decoding again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rustdist_core::transport::tcp::{Hello, Reply, HELLO_LEN, REPLY_LEN};

fuzz_target!(|data: &[u8]| {
    if let Some(bytes) = data.get(..HELLO_LEN) {
        let mut b = [0u8; HELLO_LEN];
        b.copy_from_slice(bytes);
        if let Some(h) = Hello::decode(&b) {
            assert_eq!(Hello::decode(&h.encode()), Some(h));
        }
    }
    if let Some(bytes) = data.get(..REPLY_LEN) {
        let mut b = [0u8; REPLY_LEN];
        b.copy_from_slice(bytes);
        if let Some(r) = Reply::decode(&b) {
            assert_eq!(Reply::decode(&r.encode()), Some(r));
        }
    }
});
