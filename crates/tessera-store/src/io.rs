//! Small helpers over positioned file I/O and error mapping.

use std::fmt::Display;
use std::io::{self, ErrorKind};
use std::mem::MaybeUninit;

use tessera_wire::StorageError;

use crate::disk::DiskFile;

/// Whether a read may wait for the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Read from the disk if need be.
    Yes,
    /// Only what the page cache holds; anything else fails with [`ErrorKind::WouldBlock`].
    No,
}

/// Fills `buf` from `offset`, with zeros past the end of the file (a never-written region).
pub(crate) fn read_full_at(file: &dyn DiskFile, buf: &mut [u8], offset: u64) -> io::Result<()> {
    read_full_at_with(file, buf, offset, Wait::Yes)
}

/// [`read_full_at`], or with [`Wait::No`] only from the page cache
/// ([`DiskFile::read_cached_at`]).
pub(crate) fn read_full_at_with(
    file: &dyn DiskFile,
    buf: &mut [u8],
    offset: u64,
    wait: Wait,
) -> io::Result<()> {
    // SAFETY: the same memory seen as possibly uninitialized, which it is not; `fill` writes
    // only bytes into it.
    let buf = unsafe { &mut *(buf as *mut [u8] as *mut [MaybeUninit<u8>]) };
    fill(file, buf, offset, wait)
}

/// [`read_full_at_with`] into a new buffer of `len` bytes, which is never zeroed first
/// (only past the end of the file, where the bytes read as zeros).
pub(crate) fn read_full_new(
    file: &dyn DiskFile,
    len: usize,
    offset: u64,
    wait: Wait,
) -> io::Result<Vec<u8>> {
    let mut buf: Vec<u8> = Vec::with_capacity(len);
    fill(file, &mut buf.spare_capacity_mut()[..len], offset, wait)?;
    // SAFETY: `fill` wrote bytes `0..len`, by the reads (which report what they wrote) or
    // with zeros past the end.
    unsafe { buf.set_len(len) };
    Ok(buf)
}

/// Writes every byte of `buf` from the file at `offset` ([`DiskFile::read_uninit_at`]),
/// zeros past its end.
fn fill(
    file: &dyn DiskFile,
    buf: &mut [MaybeUninit<u8>],
    offset: u64,
    wait: Wait,
) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        match file.read_uninit_at(rest, offset + done as u64, wait == Wait::No) {
            Ok(0) => {
                for byte in rest {
                    byte.write(0);
                }
                break;
            }
            Ok(read) => {
                assert!(read <= rest.len(), "a read of more than was asked");
                done += read;
            }
            Err(error) if error.kind() == ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// A disk error, with what was being done.
pub(crate) fn disk(what: impl Display, error: io::Error) -> StorageError {
    StorageError::Disk {
        detail: format!("{what}: {error}"),
    }
}

/// A disk error that is not an OS error (a bad on-disk format).
pub(crate) fn disk_format(detail: impl Into<String>) -> StorageError {
    StorageError::Disk {
        detail: detail.into(),
    }
}

/// A malformed or out-of-bounds request.
pub(crate) fn bad_request(detail: impl Into<String>) -> StorageError {
    StorageError::BadRequest {
        detail: detail.into(),
    }
}

/// Checks that `offset..offset+len` is a sane range: `len` at most `len_max`, and the end
/// within [`crate::FILE_BYTES_MAX`].
pub(crate) fn check_range(offset: u64, len: u64, len_max: u64) -> Result<(), StorageError> {
    if len > len_max {
        return Err(bad_request(format!(
            "length {len} exceeds the maximum of {len_max} bytes"
        )));
    }
    match offset.checked_add(len) {
        Some(end) if end <= crate::FILE_BYTES_MAX => Ok(()),
        _ => Err(bad_request(format!(
            "range {offset}+{len} ends past the maximum file size of {} bytes",
            crate::FILE_BYTES_MAX
        ))),
    }
}

/// `(start, end)` byte ranges of `file` within `offset..end` that hold data, in order: the
/// file system's extents ([`DiskFile::next_data`] and [`DiskFile::next_hole`], `SEEK_DATA`
/// and `SEEK_HOLE`), so holes are skipped without reading them. At most `ranges_max` ranges:
/// past that, the last runs to `end`.
pub(crate) fn data_ranges(
    file: &dyn DiskFile,
    offset: u64,
    end: u64,
    ranges_max: usize,
) -> io::Result<Vec<(u64, u64)>> {
    assert!(ranges_max > 0, "room for at least one range");
    let end = end.min(file.size()?);
    let mut ranges = Vec::new();
    let mut at = offset;
    while at < end {
        let Some(data) = file.next_data(at)? else {
            break;
        };
        if data >= end {
            break;
        }
        let hole = file.next_hole(data)?.min(end);
        assert!(hole > data, "a data extent is not empty");
        if ranges.len() + 1 == ranges_max {
            ranges.push((data, end));
            break;
        }
        ranges.push((data, hole));
        at = hole;
    }
    Ok(ranges)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::{Disk, RealDisk};
    use crate::memdisk::MemDisk;

    /// A read into a new buffer gives the file's bytes and zeros past its end, on a real
    /// file (`preadv2` into memory never zeroed) and on the in-memory disk alike, waiting or
    /// from the page cache only.
    #[test]
    fn a_read_into_a_new_buffer_gives_the_bytes_then_zeros_past_the_end() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let path = dir.path().join("f");
        let bytes: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8 + 1).collect();
        let disks: [Box<dyn Disk>; 2] = [Box::new(RealDisk), Box::new(MemDisk::new())];
        for disk in &disks {
            disk.create_dir_all(dir.path()).expect("directory");
            let file = disk.create(&path).expect("create");
            file.write_all_at(&bytes, 0).expect("write");
            let mut wants = vec![(0, 10_000), (1, 9_999), (4096, 4096), (9_000, 3_000)];
            wants.push((20_000, 64));
            for wait in [Wait::Yes, Wait::No] {
                for &(offset, len) in &wants {
                    let got = match read_full_new(&*file, len, offset as u64, wait) {
                        Ok(got) => got,
                        // Not in the page cache (cannot be for a file just written, but a
                        // file system may not tell).
                        Err(error) if error.kind() == ErrorKind::WouldBlock => continue,
                        Err(error) => panic!("read {offset}+{len}: {error}"),
                    };
                    let want: Vec<u8> = (offset..offset + len)
                        .map(|i| bytes.get(i).copied().unwrap_or(0))
                        .collect();
                    assert!(got == want, "read {offset}+{len} ({wait:?}) differs");
                }
            }
        }
    }
}
