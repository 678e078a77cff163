//! Little-endian, length-prefixed encoding shared by the TCP protocol and the FileStore log.
//! The reader never trusts a claimed length or count beyond the bytes actually present.

use crate::error::{Error, Result};

/// Appends fields to a byte buffer.
#[derive(Default)]
pub(crate) struct Writer(pub Vec<u8>);

impl Writer {
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// The bytes as they are (a fixed-size field).
    pub fn raw(&mut self, v: &[u8]) -> &mut Self {
        self.0.extend_from_slice(v);
        self
    }
    /// A u32 length then the bytes. Callers keep fields below the frame limit (< 4 GiB).
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.u32(v.len() as u32);
        self.0.extend_from_slice(v);
        self
    }
    pub fn strs(&mut self, v: &[String]) -> &mut Self {
        self.u32(v.len() as u32);
        for s in v {
            self.bytes(s.as_bytes());
        }
        self
    }
    pub fn byte_lists(&mut self, v: &[Vec<u8>]) -> &mut Self {
        self.u32(v.len() as u32);
        for b in v {
            self.bytes(b);
        }
        self
    }
}

/// Reads fields from a byte slice; every read is bounds-checked.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

fn truncated() -> Error {
    Error::store("malformed message: truncated field")
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }
    pub fn pos(&self) -> usize {
        self.pos
    }
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(truncated());
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    /// A fixed-size field of `N` bytes.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    pub fn u32(&mut self) -> Result<u32> {
        self.array().map(u32::from_le_bytes)
    }
    pub fn u64(&mut self) -> Result<u64> {
        self.array().map(u64::from_le_bytes)
    }
    pub fn i64(&mut self) -> Result<i64> {
        self.array().map(i64::from_le_bytes)
    }
    pub fn bytes(&mut self) -> Result<Vec<u8>> {
        let n = self.u32()? as usize;
        Ok(self.take(n)?.to_vec())
    }
    pub fn string(&mut self) -> Result<String> {
        String::from_utf8(self.bytes()?)
            .map_err(|_| Error::store("malformed message: key is not UTF-8"))
    }
    /// A count of items that each take at least 4 bytes; capacity is bounded by what is left.
    fn count(&mut self) -> Result<usize> {
        let n = self.u32()? as usize;
        if n > self.remaining() / 4 {
            return Err(truncated());
        }
        Ok(n)
    }
    pub fn strs(&mut self) -> Result<Vec<String>> {
        let n = self.count()?;
        (0..n).map(|_| self.string()).collect()
    }
    pub fn byte_lists(&mut self) -> Result<Vec<Vec<u8>>> {
        let n = self.count()?;
        (0..n).map(|_| self.bytes()).collect()
    }
    /// Fails unless every byte was consumed.
    pub fn finish(&self) -> Result<()> {
        if self.remaining() == 0 {
            Ok(())
        } else {
            Err(Error::store("malformed message: trailing bytes"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_codec_round_trip_and_bounds() {
        let mut w = Writer::default();
        w.u8(7)
            .u64(9)
            .i64(-3)
            .bytes(b"ab")
            .strs(&["k".into(), "".into()])
            .byte_lists(&[vec![1, 2]]);
        let mut r = Reader::new(&w.0);
        assert_eq!(r.u8().unwrap(), 7);
        assert_eq!(r.u64().unwrap(), 9);
        assert_eq!(r.i64().unwrap(), -3);
        assert_eq!(r.bytes().unwrap(), b"ab");
        assert_eq!(r.strs().unwrap(), vec!["k".to_string(), String::new()]);
        assert_eq!(r.byte_lists().unwrap(), vec![vec![1, 2]]);
        r.finish().unwrap();
        // A huge claimed length or count fails without allocating it.
        let mut r = Reader::new(&[0xff, 0xff, 0xff, 0xff, 1]);
        assert!(r.bytes().is_err());
        let mut r = Reader::new(&[0xff, 0xff, 0xff, 0x7f]);
        assert!(r.strs().is_err());
        let mut r = Reader::new(&[1, 0, 0, 0, 0xff]);
        assert!(r.string().is_err());
    }
}
