//! The TCP store's wire format: request and response decoding, and `read_frame` over a stream
//! that hands the bytes out in pieces of a fuzzed size. Decoding never panics, a decoded
//! request re-encodes to the same bytes, a decoded response round-trips, and a frame read
//! never holds more than the bytes that arrived.
#![no_main]

use std::io::{self, Read};

use libfuzzer_sys::fuzz_target;
use rustdist_core::store::tcp::protocol::{
    read_frame, Request, Response, MAX_AUTH_FRAME, MAX_FRAME,
};

/// Gives out `data` at most `step` bytes per read.
struct Pieces<'a> {
    data: &'a [u8],
    step: usize,
}

impl Read for Pieces<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf.len().min(self.step).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = Request::decode(data) {
        assert_eq!(&req.encode()[4..], data);
    }
    if let Ok(resp) = Response::decode(data) {
        assert_eq!(Response::decode(&resp.encode()[4..]).ok(), Some(resp));
    }
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    for max in [MAX_FRAME, MAX_AUTH_FRAME] {
        let mut stream = Pieces {
            data: rest,
            step: usize::from(first) + 1,
        };
        if let Ok(Some(body)) = read_frame(&mut stream, max) {
            assert!(body.len() + 4 <= rest.len() && body.len() <= max);
            let _ = Request::decode(&body);
        }
    }
});
