//! CSAR 5.1 parity locks: one FIFO lock per (file, stripe), held by a connection.
//!
//! A client doing a read-modify-write of a partial stripe reads the parity unit with a lock,
//! and writes it back with an unlock. Meanwhile other lockers of that stripe queue in arrival
//! order. A connection that closes releases its locks and leaves the queues it waited in.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use tessera_wire::{FileId, StorageError};
use tokio::sync::oneshot;

type LockKey = (FileId, u64);

/// Who holds a lock: the owner (a connection id) and the ticket of the `lock` call.
#[derive(Clone, Copy, Debug)]
struct Holder {
    owner: u64,
    ticket: u64,
}

/// A queued `lock` call, woken by sending on `grant`.
struct Waiter {
    owner: u64,
    ticket: u64,
    grant: oneshot::Sender<()>,
}

/// One held lock and the calls queued behind it.
struct LockState {
    holder: Holder,
    queue: VecDeque<Waiter>,
}

/// The parity locks of one storage server (CSAR 5.1): FIFO per (file, stripe), owned by a
/// connection id. `Send + Sync`; share it in an `Arc`.
///
/// An entry exists only while its lock is held, so memory is bounded by the locks held and
/// the calls waiting, which the server bounds by its limit on requests in flight.
#[derive(Default)]
pub struct ParityLocks {
    table: Mutex<HashMap<LockKey, LockState>>,
    ticket_next: AtomicU64,
}

impl ParityLocks {
    /// No locks held.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the lock of `stripe` of `file` for `owner`; resolves once it is granted. Lockers
    /// queue in arrival order behind the holder. A lock is not reentrant: an owner locking a
    /// stripe it holds queues behind itself until it unlocks.
    ///
    /// Cancel-safe: if the future is dropped while queued, it leaves the queue; if it is
    /// dropped after the lock was handed to it, the lock passes on to the next waiter.
    /// If [`ParityLocks::release_all`] drops the wait (its owner closed), the future resolves
    /// without the lock; [`ParityLocks::unlock`] by that owner then fails.
    pub async fn lock(&self, file: FileId, stripe: u64, owner: u64) {
        let key = (file, stripe);
        let ticket = self.ticket_next.fetch_add(1, Ordering::Relaxed);
        let granted = {
            let mut table = self.table();
            match table.entry(key) {
                Entry::Vacant(vacant) => {
                    vacant.insert(LockState {
                        holder: Holder { owner, ticket },
                        queue: VecDeque::new(),
                    });
                    return;
                }
                Entry::Occupied(mut occupied) => {
                    let (grant, granted) = oneshot::channel();
                    occupied.get_mut().queue.push_back(Waiter {
                        owner,
                        ticket,
                        grant,
                    });
                    granted
                }
            }
        };
        let mut pending = PendingLock {
            locks: self,
            key,
            ticket,
            settled: false,
        };
        // An error means release_all dropped this wait; either way the call is over.
        let _ = granted.await;
        pending.settled = true;
    }

    /// Releases the lock of `stripe` of `file` held by `owner` and hands it to the next
    /// waiter still waiting. [`StorageError::NotLockHolder`] if `owner` does not hold it.
    pub fn unlock(&self, file: FileId, stripe: u64, owner: u64) -> Result<(), StorageError> {
        let key = (file, stripe);
        let mut table = self.table();
        match table.get(&key) {
            Some(state) if state.holder.owner == owner => {
                hand_over(&mut table, key);
                Ok(())
            }
            _ => Err(StorageError::NotLockHolder { stripe }),
        }
    }

    /// Releases every lock `owner` holds (passing each to its next waiter) and drops every
    /// wait it has queued: its connection closed.
    pub fn release_all(&self, owner: u64) {
        let mut table = self.table();
        let keys: Vec<LockKey> = table.keys().copied().collect();
        for key in keys {
            let state = table.get_mut(&key).expect("key was just listed");
            state.queue.retain(|waiter| waiter.owner != owner);
            if state.holder.owner == owner {
                hand_over(&mut table, key);
            }
        }
    }

    /// Number of locks held.
    pub fn held(&self) -> usize {
        self.table().len()
    }

    /// The owner holding the lock of `stripe` of `file`, if any.
    pub fn holder(&self, file: FileId, stripe: u64) -> Option<u64> {
        self.table()
            .get(&(file, stripe))
            .map(|state| state.holder.owner)
    }

    /// Number of `lock` calls queued behind holders (including ones whose future was dropped
    /// but not yet skipped).
    pub fn waiting(&self) -> usize {
        self.table().values().map(|state| state.queue.len()).sum()
    }

    /// The table; every step leaves it consistent, so a poisoned mutex is still usable.
    fn table(&self) -> MutexGuard<'_, HashMap<LockKey, LockState>> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Gives the lock at `key` to the first waiter whose future is still alive, or removes it.
fn hand_over(table: &mut HashMap<LockKey, LockState>, key: LockKey) {
    let Some(state) = table.get_mut(&key) else {
        return;
    };
    while let Some(waiter) = state.queue.pop_front() {
        // Sending fails if the waiter's future was dropped: skip it.
        if waiter.grant.send(()).is_ok() {
            state.holder = Holder {
                owner: waiter.owner,
                ticket: waiter.ticket,
            };
            return;
        }
    }
    table.remove(&key);
}

/// Cleans up after a `lock` future dropped before it resolved.
struct PendingLock<'a> {
    locks: &'a ParityLocks,
    key: LockKey,
    ticket: u64,
    settled: bool,
}

impl Drop for PendingLock<'_> {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let mut table = self.locks.table();
        let Some(state) = table.get_mut(&self.key) else {
            return;
        };
        if state.holder.ticket == self.ticket {
            // Granted, but nobody will ever know: pass it on.
            hand_over(&mut table, self.key);
        } else {
            state.queue.retain(|waiter| waiter.ticket != self.ticket);
        }
    }
}
