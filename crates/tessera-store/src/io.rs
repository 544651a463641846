//! Small helpers over positioned file I/O and error mapping.

use std::fmt::Display;
use std::fs::File;
use std::io::{self, ErrorKind};
use std::os::unix::fs::FileExt;

use tessera_wire::StorageError;

/// Fills `buf` from `offset`, with zeros past the end of the file (a never-written region).
pub(crate) fn read_full_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
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
