//! Write-back and read-ahead for one open file: the kernel sends at most 1 MiB per call;
//! the store is fastest with whole stripes, so small sequential writes are gathered into
//! one buffer and reads are served from blocks fetched ahead.

/// Sequential writes gathered until they fill this many bytes (or a non-contiguous write,
/// a read, `flush`, `fsync` or `release` comes).
pub const WRITE_BACK_BYTES: usize = 8 << 20;
/// Reads are fetched in aligned blocks of this many bytes.
pub const READ_AHEAD_BYTES: u64 = 8 << 20;

/// Bytes written but not yet sent to the store: one contiguous run.
#[derive(Debug, Default)]
pub struct WriteBack {
    /// Offset of the first buffered byte.
    pub offset: u64,
    /// The buffered bytes.
    pub data: Vec<u8>,
}

/// What to do with a write.
#[derive(Debug, PartialEq, Eq)]
pub enum WritePlan {
    /// Append it to the buffer; nothing goes to the store now.
    Buffer,
    /// Send the buffer first, then buffer the write.
    FlushThenBuffer,
    /// Send the buffer first, then send the write itself (it is large).
    FlushThenWrite,
}

impl WriteBack {
    /// Where the buffered run ends (its offset if empty).
    pub fn end(&self) -> u64 {
        self.offset + self.data.len() as u64
    }

    /// How a write of `len` bytes at `offset` is handled.
    pub fn plan(&self, offset: u64, len: usize) -> WritePlan {
        if len >= WRITE_BACK_BYTES {
            return WritePlan::FlushThenWrite;
        }
        let contiguous = self.data.is_empty() || offset == self.end();
        if contiguous && self.data.len() + len <= WRITE_BACK_BYTES {
            WritePlan::Buffer
        } else {
            WritePlan::FlushThenBuffer
        }
    }

    /// Adds a write that [`plan`](Self::plan) said to buffer (into an emptied buffer if it
    /// said to flush first).
    pub fn buffer(&mut self, offset: u64, data: &[u8]) {
        if self.data.is_empty() {
            self.offset = offset;
        }
        debug_assert_eq!(offset, self.end());
        self.data.extend_from_slice(data);
    }

    /// Takes the buffered run out, leaving the buffer empty.
    pub fn take(&mut self) -> Option<(u64, Vec<u8>)> {
        if self.data.is_empty() {
            return None;
        }
        Some((self.offset, std::mem::take(&mut self.data)))
    }
}

/// One block of a file read ahead.
#[derive(Debug)]
pub struct ReadAhead {
    /// Offset of the block.
    pub offset: u64,
    /// Its bytes (shorter than a block at the end of the file).
    pub data: std::sync::Arc<Vec<u8>>,
    /// The file's size when the block was read.
    pub file_size: u64,
}

impl ReadAhead {
    /// The bytes of `offset..offset + len` if the block holds all of them (or all there are,
    /// the block ending the file).
    pub fn get(&self, offset: u64, len: u32) -> Option<&[u8]> {
        let file_size = self.file_size;
        let start = offset.checked_sub(self.offset)?;
        let end = (offset.saturating_add(len as u64)).min(file_size);
        let block_end = self.offset + self.data.len() as u64;
        if start > self.data.len() as u64 || end > block_end {
            return None;
        }
        let end = end.max(offset);
        Some(&self.data[start as usize..(end - self.offset) as usize])
    }
}

/// The aligned block that holds `offset`.
pub fn block_of(offset: u64) -> u64 {
    offset - offset % READ_AHEAD_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn sequential_writes_gather_and_others_flush() {
        let mut wb = WriteBack::default();
        assert_eq!(wb.plan(100, 10), WritePlan::Buffer);
        wb.buffer(100, &[1; 10]);
        assert_eq!(wb.plan(110, 5), WritePlan::Buffer);
        assert_eq!(wb.plan(111, 5), WritePlan::FlushThenBuffer);
        assert_eq!(wb.plan(110, WRITE_BACK_BYTES), WritePlan::FlushThenWrite);
        assert_eq!(wb.plan(110, WRITE_BACK_BYTES - 10), WritePlan::Buffer);
        assert_eq!(
            wb.plan(110, WRITE_BACK_BYTES - 9),
            WritePlan::FlushThenBuffer
        );
        assert_eq!(wb.take(), Some((100, vec![1; 10])));
        assert_eq!(wb.take(), None);
    }

    #[test]
    fn a_block_serves_what_it_holds_and_the_end_of_the_file() {
        let block = |file_size| ReadAhead {
            offset: 8,
            data: Arc::new((8u8..16).collect()),
            file_size,
        };
        assert_eq!(block(100).get(9, 3), Some(&[9u8, 10, 11][..]));
        assert_eq!(block(100).get(14, 4), None, "runs past the block");
        assert_eq!(block(16).get(14, 4), Some(&[14u8, 15][..]), "ends the file");
        assert_eq!(
            block(16).get(16, 4),
            Some(&[][..]),
            "at the end of the file"
        );
        assert_eq!(block(100).get(7, 1), None, "before the block");
        assert_eq!(block(100).get(u64::MAX - 1, 4), None);
        assert_eq!(block_of(READ_AHEAD_BYTES + 5), READ_AHEAD_BYTES);
    }
}
