//! A data or redundancy file with its checksum sidecar.
//!
//! The file is written in whole 4 KiB blocks (CSAR 5.2: a partial block write would make the
//! kernel read the block first anyway, and a whole block is what the checksum covers). The
//! sidecar holds one 8-byte entry per block at `block * 8`: the block's crc32c and a marker
//! saying "written". An all-zero entry means the block was never written and must be zeros.

use tessera_layout::Region;
use tessera_wire::{FileId, StorageError};

use crate::disk::{read_file, Disk, DiskFile, FileHandle};
use crate::io::{disk, disk_format, read_full_at, read_full_at_with, read_full_new, Wait};
use crate::BLOCK_BYTES;

/// Bytes of one checksum entry in the sidecar.
pub(crate) const CRC_ENTRY_BYTES: u64 = 8;

/// Second half of a checksum entry: the block was written (format version 1 of blocks).
pub(crate) const CRC_MARKER_WRITTEN: u32 = u32::from_le_bytes(*b"TSB1");

/// Sidecar bytes scanned at a time when counting written blocks.
const CRC_SCAN_BYTES: usize = 64 << 10;

/// Block bytes a sequential read that had to wait for the disk asks the kernel to read ahead
/// of itself (with their checksum entries), so the disk works on the next requests while
/// this one is answered and they find their bytes in the page cache (see [`ReadAhead`]).
pub(crate) const READ_AHEAD_BYTES: u64 = 8 << 20;

/// A data or redundancy file and its checksum sidecar, open.
pub(crate) struct RegionFile {
    /// Which file of which store file, for errors.
    file: FileId,
    region: Region,
    /// The blocks.
    pub(crate) bytes: FileHandle,
    /// The checksum entries.
    pub(crate) crc: FileHandle,
    /// Blocks whose checksum entry is not all zeros.
    blocks_written: u64,
    /// Where reads are going, for read-ahead.
    ahead: ReadAhead,
}

impl RegionFile {
    /// Opens a region over its two files, counting the blocks written so far.
    pub(crate) fn open(
        file: FileId,
        region: Region,
        bytes: FileHandle,
        crc: FileHandle,
    ) -> Result<Self, StorageError> {
        let scan = |error| {
            disk(
                format_args!("scan checksums of file {file} {region:?}"),
                error,
            )
        };
        let blocks_written = count_written(&*crc).map_err(scan)?;
        Ok(RegionFile {
            file,
            region,
            bytes,
            crc,
            blocks_written,
            ahead: ReadAhead::default(),
        })
    }

    /// Blocks written (counted from the checksum entries).
    pub(crate) fn blocks_written(&self) -> u64 {
        self.blocks_written
    }

    /// Reads `len` bytes at `offset`, verifying every block touched.
    pub(crate) fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>, StorageError> {
        self.read_with(offset, len, Wait::Yes)?
            .ok_or_else(|| disk_format("a read that may wait for the disk did not"))
    }

    /// Like [`read`](Self::read), from the page cache only: `None` where the blocks or their
    /// checksums would have to come from the disk.
    pub(crate) fn read_cached(
        &self,
        offset: u64,
        len: usize,
    ) -> Result<Option<Vec<u8>>, StorageError> {
        self.read_with(offset, len, Wait::No)
    }

    fn read_with(
        &self,
        offset: u64,
        len: usize,
        wait: Wait,
    ) -> Result<Option<Vec<u8>>, StorageError> {
        if len == 0 {
            return Ok(Some(Vec::new()));
        }
        let block_first = offset / BLOCK_BYTES;
        let block_end = (offset + len as u64).div_ceil(BLOCK_BYTES);
        let sequential = self.ahead.follows(offset, offset + len as u64);
        let Some(mut blocks) = self.read_blocks_with(block_first, block_end - block_first, wait)?
        else {
            return Ok(None);
        };
        if sequential && wait == Wait::Yes {
            self.advise_ahead(block_end * BLOCK_BYTES);
        }
        let skip = (offset - block_first * BLOCK_BYTES) as usize;
        if skip == 0 {
            // Aligned at the head (the common case): no second copy, just cut the tail.
            blocks.truncate(len);
            return Ok(Some(blocks));
        }
        Ok(Some(blocks[skip..skip + len].to_vec()))
    }

    /// Writes `data` at `offset` in whole blocks: edge blocks partly covered are read (and
    /// verified) first, so a corrupt edge block fails the write before anything changes. The
    /// blocks are written before their checksum entries.
    pub(crate) fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), StorageError> {
        if data.is_empty() {
            return Ok(());
        }
        let end = offset + data.len() as u64;
        let block_first = offset / BLOCK_BYTES;
        let block_end = end.div_ceil(BLOCK_BYTES);
        let block_count = block_end - block_first;
        let block_bytes = BLOCK_BYTES as usize;
        let head_partial = !offset.is_multiple_of(BLOCK_BYTES);
        let tail_partial = !end.is_multiple_of(BLOCK_BYTES);
        // Whole blocks (the common case) are written straight from the caller's buffer.
        let merged: Vec<u8>;
        let blocks: &[u8] = if !head_partial && !tail_partial {
            data
        } else {
            merged = self.merge_edges(offset, data)?;
            &merged
        };

        let mut entries = vec![0u8; (block_count * CRC_ENTRY_BYTES) as usize];
        read_full_at(&*self.crc, &mut entries, block_first * CRC_ENTRY_BYTES)
            .map_err(|error| self.disk("read checksums", error))?;
        let blocks_new = entries
            .chunks_exact(CRC_ENTRY_BYTES as usize)
            .filter(|entry| entry.iter().all(|&byte| byte == 0))
            .count() as u64;
        for (entry, block) in entries
            .chunks_exact_mut(CRC_ENTRY_BYTES as usize)
            .zip(blocks.chunks_exact(block_bytes))
        {
            entry[..4].copy_from_slice(&crc32c::crc32c(block).to_le_bytes());
            entry[4..].copy_from_slice(&CRC_MARKER_WRITTEN.to_le_bytes());
        }

        self.bytes
            .write_all_at(blocks, block_first * BLOCK_BYTES)
            .map_err(|error| self.disk("write blocks", error))?;
        self.crc
            .write_all_at(&entries, block_first * CRC_ENTRY_BYTES)
            .map_err(|error| self.disk("write checksums", error))?;
        self.blocks_written += blocks_new;
        Ok(())
    }

    /// Length of the block file (everything past it reads as zeros).
    pub(crate) fn len(&self) -> Result<u64, StorageError> {
        self.bytes.size().map_err(|error| self.disk("size", error))
    }

    /// Discards every block from `from` (a block boundary) on: they read as zeros after.
    /// Whether anything was cut. The checksum entries are cut first. A kill between the two
    /// cuts leaves blocks with no entries, which read as corrupt, as do blocks whose entries
    /// a damaged disk lost: the caller marks the cut beforehand ([`CutMark`]) so that
    /// opening the region finishes it rather than report those blocks.
    /// `before_cut` runs first if there is anything to cut (the caller's [`CutMark`]).
    pub(crate) fn discard_from(
        &mut self,
        from: u64,
        before_cut: impl FnOnce() -> Result<(), StorageError>,
    ) -> Result<bool, StorageError> {
        debug_assert!(from.is_multiple_of(BLOCK_BYTES));
        let entries_end = from / BLOCK_BYTES * CRC_ENTRY_BYTES;
        let cut_entries = self.crc.size().map_err(|e| self.disk("size", e))? > entries_end;
        let cut_blocks = self.len()? > from;
        if !(cut_entries || cut_blocks) {
            return Ok(false);
        }
        before_cut()?;
        if cut_entries {
            self.crc
                .set_len(entries_end)
                .map_err(|error| self.disk("cut checksums", error))?;
        }
        if cut_blocks {
            self.bytes
                .set_len(from)
                .map_err(|error| self.disk("cut blocks", error))?;
        }
        self.blocks_written =
            count_written(&*self.crc).map_err(|error| self.disk("scan checksums", error))?;
        Ok(true)
    }

    /// Makes the blocks and their checksum entries durable.
    pub(crate) fn sync(&self) -> Result<(), StorageError> {
        self.bytes
            .sync_data()
            .and_then(|()| self.crc.sync_data())
            .map_err(|error| self.disk("sync", error))
    }

    /// `data` at `offset` merged into the whole blocks it partly covers (edge blocks read and
    /// verified first).
    fn merge_edges(&self, offset: u64, data: &[u8]) -> Result<Vec<u8>, StorageError> {
        let end = offset + data.len() as u64;
        let block_first = offset / BLOCK_BYTES;
        let block_end = end.div_ceil(BLOCK_BYTES);
        let block_count = block_end - block_first;
        let block_bytes = BLOCK_BYTES as usize;
        let mut blocks = vec![0u8; (block_count * BLOCK_BYTES) as usize];
        let head_partial = !offset.is_multiple_of(BLOCK_BYTES);
        let tail_partial = !end.is_multiple_of(BLOCK_BYTES);
        if head_partial || (tail_partial && block_count == 1) {
            let head = self.read_blocks(block_first, 1)?;
            blocks[..block_bytes].copy_from_slice(&head);
        }
        if tail_partial && block_count > 1 {
            let tail = self.read_blocks(block_end - 1, 1)?;
            blocks[(block_count as usize - 1) * block_bytes..].copy_from_slice(&tail);
        }
        let skip = (offset - block_first * BLOCK_BYTES) as usize;
        blocks[skip..skip + data.len()].copy_from_slice(data);
        Ok(blocks)
    }

    /// Reads whole blocks `block_first..block_first+block_count` and verifies each.
    fn read_blocks(&self, block_first: u64, block_count: u64) -> Result<Vec<u8>, StorageError> {
        self.read_blocks_with(block_first, block_count, Wait::Yes)?
            .ok_or_else(|| disk_format("a read that may wait for the disk did not"))
    }

    /// [`read_blocks`](Self::read_blocks); with [`Wait::No`], `None` if that would wait.
    fn read_blocks_with(
        &self,
        block_first: u64,
        block_count: u64,
        wait: Wait,
    ) -> Result<Option<Vec<u8>>, StorageError> {
        let would_wait = |error: &std::io::Error| {
            wait == Wait::No && error.kind() == std::io::ErrorKind::WouldBlock
        };
        let mut entries = vec![0u8; (block_count * CRC_ENTRY_BYTES) as usize];
        match read_full_at_with(
            &*self.crc,
            &mut entries,
            block_first * CRC_ENTRY_BYTES,
            wait,
        ) {
            Err(error) if would_wait(&error) => return Ok(None),
            result => result.map_err(|error| self.disk("read checksums", error))?,
        }
        let len = (block_count * BLOCK_BYTES) as usize;
        let blocks = match read_full_new(&*self.bytes, len, block_first * BLOCK_BYTES, wait) {
            Err(error) if would_wait(&error) => return Ok(None),
            result => result.map_err(|error| self.disk("read blocks", error))?,
        };
        let pairs = blocks
            .chunks_exact(BLOCK_BYTES as usize)
            .zip(entries.chunks_exact(CRC_ENTRY_BYTES as usize));
        for (index, (block, entry)) in pairs.enumerate() {
            if !block_matches(block, entry) {
                return Err(StorageError::Corrupt {
                    file: self.file,
                    region: self.region,
                    offset: (block_first + index as u64) * BLOCK_BYTES,
                });
            }
        }
        Ok(Some(blocks))
    }

    /// Asks the kernel to read [`READ_AHEAD_BYTES`] of blocks from `from` (a block boundary)
    /// and their checksum entries in the background. Only a hint: the reads that come for
    /// those bytes still read them and verify every block, and a write in between updates
    /// the page cache the hint filled, so nothing is served from it that a read would not
    /// see. A failed hint is ignored.
    fn advise_ahead(&self, from: u64) {
        let entries_from = from / BLOCK_BYTES * CRC_ENTRY_BYTES;
        let entries_len = READ_AHEAD_BYTES / BLOCK_BYTES * CRC_ENTRY_BYTES;
        let advised = self
            .bytes
            .advise_will_need(from, READ_AHEAD_BYTES)
            .and_then(|()| self.crc.advise_will_need(entries_from, entries_len));
        if let Err(error) = advised {
            tracing::debug!("read-ahead hint for {}: {error}", self.file);
        }
    }

    fn disk(&self, what: &str, error: std::io::Error) -> StorageError {
        disk(
            format_args!("{what} of file {} {:?}", self.file, self.region),
            error,
        )
    }
}

/// Whether a region is being read sequentially: a read is sequential if it starts within
/// [`READ_AHEAD_BYTES`] of where the last one ended (either side: a stream's requests are
/// served by several threads, so they arrive slightly out of order). A random reader's
/// requests land far apart and get no read-ahead, which would only cost it disk time.
#[derive(Debug, Default)]
struct ReadAhead {
    /// End of the last read (0 before any: a read from the start counts as sequential).
    last_end: std::sync::atomic::AtomicU64,
}

impl ReadAhead {
    /// Notes a read of `offset..end`; whether it follows the last one.
    fn follows(&self, offset: u64, end: u64) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let last = self.last_end.swap(end, Relaxed);
        offset.abs_diff(last) <= READ_AHEAD_BYTES
    }
}

/// Whether a block's bytes agree with its checksum entry.
fn block_matches(block: &[u8], entry: &[u8]) -> bool {
    let crc = u32::from_le_bytes(entry[..4].try_into().expect("entry is 8 bytes"));
    let marker = u32::from_le_bytes(entry[4..].try_into().expect("entry is 8 bytes"));
    if crc == 0 && marker == 0 {
        block.iter().all(|&byte| byte == 0)
    } else {
        marker == CRC_MARKER_WRITTEN && crc32c::crc32c(block) == crc
    }
}

/// Counts the checksum entries that are not all zeros (a torn last entry counts too).
fn count_written(crc: &dyn DiskFile) -> std::io::Result<u64> {
    let len = crc.size()?;
    let mut chunk = vec![0u8; CRC_SCAN_BYTES];
    let mut written = 0u64;
    let mut offset = 0u64;
    while offset < len {
        let take = (len - offset).min(CRC_SCAN_BYTES as u64) as usize;
        read_full_at(crc, &mut chunk[..take], offset)?;
        written += chunk[..take]
            .chunks(CRC_ENTRY_BYTES as usize)
            .filter(|entry| entry.iter().any(|&byte| byte != 0))
            .count() as u64;
        offset += take as u64;
    }
    Ok(written)
}

/// A discard of a region's tail in progress: `discard.data` or `discard.redundancy` in the
/// file's directory, holding where the cut starts (u64 LE) and its crc32c (u32 LE).
///
/// Blocks past the checksum sidecar's end are either the unfinished cut of a killed discard
/// (the sidecar is cut first) or the sidecar's tail lost by the disk while the blocks, maybe
/// acknowledged and synced, are still there. They looked the same, and opening a region cut
/// them both: a lost sidecar tail silently turned acknowledged data into zeros. Now a
/// discard writes this mark before its cuts and removes it after; opening finishes a marked
/// cut, and unmarked blocks without entries read as corrupt (repaired from redundancy). So
/// does a write killed between its blocks and its entries, a write never answered. The
/// mark is not synced: after a process crash the page cache keeps the order of the writes,
/// and after a power loss with unsynced writes the whole store starts a new incarnation
/// (`boot.rs`).
pub(crate) struct CutMark {
    path: std::path::PathBuf,
}

impl CutMark {
    /// The mark of `region` in the file directory `dir`.
    pub(crate) fn new(dir: &std::path::Path, region: Region) -> CutMark {
        let name = match region {
            Region::Data => "discard.data",
            Region::Redundancy => "discard.redundancy",
        };
        CutMark {
            path: dir.join(name),
        }
    }

    /// Records a cut from `from`, before its first change (not synced: see above).
    pub(crate) fn set(&self, disk: &dyn Disk, from: u64) -> Result<(), StorageError> {
        let file = disk
            .create(&self.path)
            .map_err(|e| self.disk_error("create", e))?;
        file.write_all_at(&crate::seal::encode(from), 0)
            .map_err(|e| self.disk_error("write", e))
    }

    /// Removes the mark once its cut is done.
    pub(crate) fn clear(&self, disk: &dyn Disk) -> Result<(), StorageError> {
        match disk.remove_file(&self.path) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                Err(self.disk_error("remove", error))
            }
            _ => Ok(()),
        }
    }

    /// Finishes a cut a killed discard left marked, if any (a damaged mark is dropped: the
    /// blocks it would have cut read as corrupt, never as zeros they may not be).
    pub(crate) fn finish(
        &self,
        disk: &dyn Disk,
        region: &mut RegionFile,
    ) -> Result<(), StorageError> {
        let bytes = match read_file(disk, &self.path) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(error) => return Err(self.disk_error("read", error)),
        };
        let from = crate::seal::decode(&bytes).filter(|from| from.is_multiple_of(BLOCK_BYTES));
        match from {
            Some(from) => {
                region.discard_from(from, || Ok(()))?;
                region.sync()?;
            }
            None => tracing::warn!("{} is damaged: ignored", self.path.display()),
        }
        self.clear(disk)
    }

    fn disk_error(&self, what: &str, error: std::io::Error) -> StorageError {
        disk(format_args!("{what} {}", self.path.display()), error)
    }
}
