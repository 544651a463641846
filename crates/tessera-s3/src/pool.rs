//! Chunk buffers used again: an object's blocks (GET) are ~8 MiB each (a PUT's body is
//! written from the pieces it arrived in, see `tessera_client::Pieces`), and a fresh buffer of that size is new memory from the kernel every time (glibc
//! maps it, the first write to each page faults and the kernel clears it, and it is unmapped
//! when freed), and a GET block was zeroed by the gateway as well before it was filled.
//! perf of the gateway during `bench --against-minio`: `clear_page_erms`, page faults and
//! `memset` were ~5-8% of the samples of its threads. A buffer handed out of a [`ChunkPool`]
//! goes back to it when the last [`Bytes`] made from it is dropped (after hyper sent it).

use bytes::Bytes;
use std::sync::{Arc, Mutex};

/// Idle buffers a pool keeps at most: beyond, a returned buffer is freed. A few chunks of a
/// handful of concurrent transfers; bounded so that a burst does not pin its peak forever.
pub(crate) const POOL_BUFFERS_MAX: usize = 12;

/// Buffers of one size, shared by every request of a gateway.
#[derive(Clone)]
pub(crate) struct ChunkPool {
    inner: Arc<PoolInner>,
}

struct PoolInner {
    idle: Mutex<Vec<Vec<u8>>>,
    keep_max: usize,
}

impl Default for ChunkPool {
    fn default() -> ChunkPool {
        ChunkPool::with_max(POOL_BUFFERS_MAX)
    }
}

impl ChunkPool {
    pub(crate) fn with_max(keep_max: usize) -> ChunkPool {
        ChunkPool {
            inner: Arc::new(PoolInner {
                idle: Mutex::new(Vec::new()),
                keep_max,
            }),
        }
    }

    /// An idle buffer of at least `capacity` bytes, else a new one (empty). An idle buffer
    /// keeps the bytes it last held (its length says how many are initialized).
    fn reuse(&self, capacity: usize) -> Vec<u8> {
        let reused = {
            let mut idle = self.inner.idle.lock().expect("pool lock");
            let at = idle.iter().position(|b| b.capacity() >= capacity);
            at.map(|at| idle.swap_remove(at))
        };
        reused.unwrap_or_else(|| Vec::with_capacity(capacity))
    }

    /// A buffer of exactly `len` bytes, to be overwritten whole: a reused buffer keeps what
    /// it held (only bytes it never held are zeroed), where a new one is zeroed once.
    pub(crate) fn take_filled(&self, len: usize) -> Vec<u8> {
        let mut buf = self.reuse(len);
        if buf.len() >= len {
            buf.truncate(len);
        } else {
            buf.resize(len, 0);
        }
        buf
    }

    /// `buf` as [`Bytes`] of its first `len` bytes, going back to the pool when dropped.
    pub(crate) fn bytes(&self, buf: Vec<u8>, len: usize) -> Bytes {
        assert!(
            len <= buf.len(),
            "a pooled chunk of {len} bytes in {}",
            buf.len()
        );
        Bytes::from_owner(Pooled {
            buf,
            len,
            pool: self.clone(),
        })
    }

    fn give_back(&self, buf: Vec<u8>) {
        let mut idle = self.inner.idle.lock().expect("pool lock");
        if idle.len() < self.inner.keep_max {
            idle.push(buf);
        }
    }

    /// Buffers idle in the pool.
    #[cfg(test)]
    pub(crate) fn idle(&self) -> usize {
        self.inner.idle.lock().expect("pool lock").len()
    }
}

/// A pooled buffer owned by [`Bytes`].
struct Pooled {
    buf: Vec<u8>,
    len: usize,
    pool: ChunkPool,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        self.pool.give_back(std::mem::take(&mut self.buf));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A buffer goes back to the pool only when the last `Bytes` of it is dropped, and the
    /// next take of that size is the same allocation, its bytes not zeroed again.
    #[test]
    fn buffers_come_back_when_their_last_bytes_drop() {
        let pool = ChunkPool::with_max(2);
        let mut buf = pool.take_filled(1_000);
        assert!(buf.iter().all(|&b| b == 0), "a new buffer is zeroed");
        buf.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
        let at = buf.as_ptr();
        let bytes = pool.bytes(buf, 600);
        assert_eq!(bytes.len(), 600);
        let part = bytes.slice(100..200);
        drop(bytes);
        assert_eq!(pool.idle(), 0, "a slice still holds it");
        assert_eq!(part[0], 100);
        drop(part);
        assert_eq!(pool.idle(), 1);
        let again = pool.take_filled(800);
        assert_eq!(again.as_ptr(), at, "the same allocation");
        assert!(
            again.iter().enumerate().all(|(i, &b)| b == i as u8),
            "a reused buffer is not zeroed"
        );
        // Too small for what is asked: a new one, zeroed.
        let large = pool.take_filled(4_000);
        assert!(large.iter().all(|&b| b == 0));
    }

    /// The pool keeps at most its bound of idle buffers.
    #[test]
    fn the_pool_keeps_a_bounded_number() {
        let pool = ChunkPool::with_max(2);
        let held: Vec<Bytes> = (0..5)
            .map(|_| {
                let buf = pool.take_filled(64);
                pool.bytes(buf, 64)
            })
            .collect();
        drop(held);
        assert_eq!(pool.idle(), 2);
    }
}
