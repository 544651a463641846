//! The receive buffer of a large frame: anonymous memory mapped for it alone, grown with
//! `mremap` as its bytes arrive and unmapped when the frame is dropped.
//!
//! A buffer from the global allocator would do, but what it frees (the smaller buffers left
//! behind as it grows, the frames of evicted connections) the allocator keeps for reuse, and
//! under a flood of large frames that kept memory came to more than the frame budget itself
//! (a server with a 64 MiB budget reached 86 MiB above its resting size). A mapping of its
//! own grows without copying and goes back to the system at once, so what a server holds
//! for frames is what their bytes are, within the budget.

use bytes::Bytes;
use std::ptr::NonNull;

/// Growable, page-backed bytes; always zero-initialized beyond `len`.
pub(crate) struct FrameBuffer {
    /// Start of the mapping (dangling while `capacity` is 0).
    ptr: NonNull<u8>,
    /// Bytes written.
    len: usize,
    /// Bytes mapped.
    capacity: usize,
}

// SAFETY: the buffer owns its mapping exclusively; no thread-local state is involved.
unsafe impl Send for FrameBuffer {}
// SAFETY: shared access only reads.
unsafe impl Sync for FrameBuffer {}

impl FrameBuffer {
    pub(crate) fn new() -> FrameBuffer {
        FrameBuffer {
            ptr: NonNull::dangling(),
            len: 0,
            capacity: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Maps `capacity` bytes in all (more than now), keeping the bytes written.
    pub(crate) fn grow(&mut self, capacity: usize) -> std::io::Result<()> {
        assert!(capacity > self.capacity);
        let ptr = if self.capacity == 0 {
            // SAFETY: a fresh private anonymous mapping; the result is checked.
            unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    capacity,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            }
        } else {
            // SAFETY: `ptr` and `capacity` describe our own mapping; it may move, and the
            // result is checked before the old address is forgotten.
            unsafe {
                libc::mremap(
                    self.ptr.as_ptr().cast(),
                    self.capacity,
                    capacity,
                    libc::MREMAP_MAYMOVE,
                )
            }
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        self.ptr = NonNull::new(ptr.cast()).expect("mmap never returns null on success");
        self.capacity = capacity;
        Ok(())
    }

    /// The mapped bytes not written yet (zeros, as the system maps them).
    pub(crate) fn spare(&mut self) -> &mut [u8] {
        if self.capacity == 0 {
            return &mut [];
        }
        // SAFETY: [len, capacity) lies within our mapping, which the system zero-fills, and
        // `&mut self` makes this the only reference.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.ptr.as_ptr().add(self.len),
                self.capacity - self.len,
            )
        }
    }

    /// `count` more bytes of `spare` were written.
    pub(crate) fn advance(&mut self, count: usize) {
        assert!(self.len + count <= self.capacity);
        self.len += count;
    }

    pub(crate) fn into_bytes(self) -> Bytes {
        Bytes::from_owner(self)
    }
}

impl AsRef<[u8]> for FrameBuffer {
    fn as_ref(&self) -> &[u8] {
        if self.capacity == 0 {
            return &[];
        }
        // SAFETY: [0, len) lies within our mapping and was written.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for FrameBuffer {
    fn drop(&mut self) {
        if self.capacity > 0 {
            // SAFETY: unmapping our own mapping once; nothing refers to it after drop.
            unsafe {
                libc::munmap(self.ptr.as_ptr().cast(), self.capacity);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_written_survive_growth_and_come_out_as_bytes() {
        let mut buffer = FrameBuffer::new();
        let mut expected = Vec::new();
        for (step, capacity) in [4096usize, 8192, 1 << 20, (1 << 20) + 4096]
            .iter()
            .enumerate()
        {
            buffer.grow(*capacity).expect("map");
            assert!(buffer.spare().iter().all(|&b| b == 0));
            let chunk = vec![step as u8 + 1; capacity - buffer.len()];
            buffer.spare()[..chunk.len()].copy_from_slice(&chunk);
            buffer.advance(chunk.len());
            expected.extend_from_slice(&chunk);
        }
        let bytes = buffer.into_bytes();
        assert_eq!(&bytes[..], &expected[..]);
        let tail = bytes.slice(4096..8192);
        drop(bytes);
        assert!(
            tail.iter().all(|&b| b == 2),
            "slices keep the mapping alive"
        );
    }
}
