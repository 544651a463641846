//! Small helpers over positioned file I/O and error mapping.

use std::fmt::Display;
use std::fs::File;
use std::io::{self, ErrorKind};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

use tessera_wire::StorageError;

/// Whether a read may wait for the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Read from the disk if need be.
    Yes,
    /// Only what the page cache holds; anything else fails with [`ErrorKind::WouldBlock`].
    No,
}

/// Fills `buf` from `offset`, with zeros past the end of the file (a never-written region).
pub(crate) fn read_full_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    read_full_at_with(file, buf, offset, Wait::Yes)
}

/// [`read_full_at`], or with [`Wait::No`] only from the page cache (`preadv2` with
/// `RWF_NOWAIT`, Linux 4.14): the kernel fails the read rather than start disk I/O. A file
/// system without it fails the same way, so the caller takes the slow path.
pub(crate) fn read_full_at_with(
    file: &File,
    buf: &mut [u8],
    offset: u64,
    wait: Wait,
) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let at = offset + done as u64;
        let read = match wait {
            Wait::Yes => file.read_at(&mut buf[done..], at),
            Wait::No => read_cached_at(file, &mut buf[done..], at),
        };
        match read {
            Ok(0) => {
                buf[done..].fill(0);
                break;
            }
            Ok(read) => done += read,
            Err(error) if error.kind() == ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// One `preadv2(RWF_NOWAIT)`; a file system that does not support it counts as "would block".
fn read_cached_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let offset =
        libc::off_t::try_from(offset).map_err(|_| io::Error::from(ErrorKind::InvalidInput))?;
    let iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: one iovec over `buf`, valid and writable for its whole length during the call.
    let read = unsafe { libc::preadv2(file.as_raw_fd(), &iov, 1, offset, libc::RWF_NOWAIT) };
    if read >= 0 {
        return Ok(read as usize);
    }
    let error = io::Error::last_os_error();
    match error.raw_os_error() {
        Some(libc::EOPNOTSUPP) | Some(libc::EINVAL) => Err(ErrorKind::WouldBlock.into()),
        _ => Err(error),
    }
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
/// file system's extents (`lseek` with `SEEK_DATA` and `SEEK_HOLE`), so holes are skipped
/// without reading them. A file system without them reports the whole file as data, which is
/// what the kernel's generic fallback does too. At most `ranges_max` ranges: past that, the
/// last runs to `end`.
pub(crate) fn data_ranges(
    file: &File,
    offset: u64,
    end: u64,
    ranges_max: usize,
) -> io::Result<Vec<(u64, u64)>> {
    assert!(ranges_max > 0, "room for at least one range");
    let end = end.min(file.metadata()?.len());
    let mut ranges = Vec::new();
    let mut at = offset;
    while at < end {
        let data = match seek(file, at, libc::SEEK_DATA) {
            Ok(data) => data,
            // No data at or past `at`.
            Err(error) if error.raw_os_error() == Some(libc::ENXIO) => break,
            Err(error) if error.raw_os_error() == Some(libc::EINVAL) => {
                ranges.push((at, end));
                break;
            }
            Err(error) => return Err(error),
        };
        if data >= end {
            break;
        }
        let hole = seek(file, data, libc::SEEK_HOLE)?.min(end);
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

/// One `lseek` with `whence`; the file position it moves is not used by positioned I/O.
fn seek(file: &File, offset: u64, whence: libc::c_int) -> io::Result<u64> {
    let offset =
        libc::off_t::try_from(offset).map_err(|_| io::Error::from(ErrorKind::InvalidInput))?;
    // SAFETY: lseek on a file descriptor we own for the duration of the call.
    let found = unsafe { libc::lseek(file.as_raw_fd(), offset, whence) };
    if found < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(found as u64)
}
