//! CSAR 5.1 parity locks: one FIFO lock per (file, stripe), held under a lease, fenced by a
//! token.
//!
//! A client doing a read-modify-write of a partial stripe reads the parity unit with a lock,
//! and writes it back with an unlock. Meanwhile other lockers of that stripe queue in arrival
//! order. A lock is a lease: each grant, renewal and fenced request from its holder extends it
//! by [`ParityLocks::lease`], and once it has run out a waiting locker breaks it (the lock
//! passes to the next waiter). The holder's requests carry the grant's token, and a token that
//! no longer names the holder is refused with [`StorageError::StaleLock`], so a holder that
//! was only slow cannot write parity over the next holder's. A connection that closes releases
//! its locks at once and leaves the queues it waited in; over a datagram transport a dead
//! client's session may never close, and the lease is what frees its locks.
//!
//! What a broken lock's holder left half done is not this module's business: the store keeps
//! its intent record, and the next holder is told of it (see `intent.rs`).
//!
//! It also keeps a *generation* per stripe, for readers that take no lock: a degraded read
//! reconstructs a lost unit from the parity and the other data units, read in parallel, and
//! a write that lands between those reads would make it XOR old parity with new data (bytes
//! that are neither the old nor the new). Every write to a stripe of a committed file is
//! covered by a record from before its first byte until after its last is answered (an intent
//! record for a read-modify-write, a stale-parity record for a full-stripe write), and the
//! server changes the stripe's generation just before it deletes such a record
//! ([`ParityLocks::stripes_changed`]). So a reader that asks for the generation before its
//! reads and for the records and the generation again after them sees, of any write that
//! overlapped its reads, either the record still there or the generation changed; it then
//! reads again. Generations live in a fixed table of slots shared by hashing (a collision
//! costs a reader a needless retry, never a wrong byte), drawn from the token counter, so a
//! restarted server does not hand out a generation a reader saw before it.
//!
//! Full-stripe writes take no lock, but they must not run while a lock holder computes
//! parity from the stripe's data (a scrub, a torn-stripe resolver, a read-modify-writer): the
//! holder would read some units before the write and some after, and write parity matching
//! neither (explorer seed 3776 of `write_hole_no_acknowledged_byte_lost_parity_schemes`: a
//! resolver's parity, computed across a full-stripe write, later rebuilt a lost unit wrong).
//! So a holder *settles* once it has seen no live stale-parity record over its stripe
//! ([`ParityLocks::settle`]), and a full-stripe writer's record, once taken, waits for the
//! settled holders of its stripes to unlock ([`ParityLocks::wait_settled`]); holders granted
//! after it see the record and wait it out, as before. Settling compares a count of records
//! begun ([`ParityLocks::record_begins`]) under the table's mutex, so a holder that looked
//! before a record was taken but settles after it began looks again: each side sees the other.
//!
//! And it keeps the *snapshot fences* of the files whose snapshot is being taken (the
//! protocol is argued in `snapshot.rs`): while a fence of a file stands, no lock of that file
//! is granted or queued for anew ([`ParityLocks::lock`] waits, within its bound) and no
//! stale-parity record of it is taken ([`ParityLocks::enter_unfenced`] refuses), so the
//! writes in flight drain and none starts. The fence check and the lock's entry in the table
//! happen under the fences' mutex, and a stale-parity record is taken while its request is
//! counted as entered, so a fence raised sees every write that got past it.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tessera_wire::{FileId, IndexRange, LockToken, StorageError};
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

type LockKey = (FileId, u64);

/// Slots of the stripe generation table (8 bytes each): enough that unrelated stripes
/// written at once rarely share one.
const GENERATION_SLOTS: usize = 4096;

/// The snapshot fences standing, and the stale-parity record requests in progress.
#[derive(Default)]
struct Fences {
    /// Per file, the epochs being taken and when each fence lapses.
    standing: HashMap<FileId, HashMap<u64, Instant>>,
    /// Per file, the `RecordStale` requests admitted and not yet done.
    entered: HashMap<FileId, u32>,
}

impl Fences {
    /// When the last fence of `file` standing at `now` lapses, if one stands.
    fn until(&self, file: FileId, now: Instant) -> Option<Instant> {
        let epochs = self.standing.get(&file)?;
        epochs.values().copied().filter(|&until| until > now).max()
    }
}

/// A `RecordStale` request admitted past the fences: counted until dropped.
pub struct Entered<'a> {
    locks: &'a ParityLocks,
    file: FileId,
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        let mut fences = self.locks.fences();
        if let Some(count) = fences.entered.get_mut(&self.file) {
            *count -= 1;
            if *count == 0 {
                fences.entered.remove(&self.file);
            }
        }
    }
}

/// Who holds a lock: the owner (a connection id), the grant's token, and when its lease ends.
#[derive(Clone, Copy, Debug)]
struct Holder {
    owner: u64,
    token: LockToken,
    lease_end: Instant,
    /// Past its check for live stale-parity records: full-stripe writers wait for it.
    settled: bool,
}

/// A queued `lock` call, woken by sending on `grant`.
struct Waiter {
    owner: u64,
    token: LockToken,
    grant: oneshot::Sender<()>,
}

/// One held lock and the calls queued behind it.
struct LockState {
    holder: Holder,
    queue: VecDeque<Waiter>,
}

/// The parity locks of one storage server (CSAR 5.1): FIFO per (file, stripe), owned by a
/// connection id, leased and fenced. `Send + Sync`; share it in an `Arc`.
///
/// An entry exists only while its lock is held, so memory is bounded by the locks held and
/// the calls waiting, which the server bounds by its limit on requests in flight.
pub struct ParityLocks {
    table: Mutex<HashMap<LockKey, LockState>>,
    token_next: AtomicU64,
    lease: Duration,
    broken: AtomicU64,
    /// Each stripe's generation, by hash of (file, stripe): see the module doc.
    generations: Box<[AtomicU64]>,
    /// Snapshot fences; taken before `table` when both are.
    fences: Mutex<Fences>,
    /// Woken when a fence is released.
    fence_lifted: Notify,
    /// Stale-parity records begun (see the module doc).
    records_begun: AtomicU64,
    /// Woken when a lock is released, passed on or broken.
    released: Notify,
}

impl ParityLocks {
    /// No locks held. Each lease lasts `lease` past the holder's last sign of life; tokens are
    /// handed out from `first_token` on (draw it at random, so that a holder from before a
    /// restart never holds a token of this run).
    pub fn new(lease: Duration, first_token: LockToken) -> Self {
        assert!(!lease.is_zero(), "a lease must last some time");
        ParityLocks {
            table: Mutex::new(HashMap::new()),
            token_next: AtomicU64::new(first_token.max(1)),
            lease,
            broken: AtomicU64::new(0),
            generations: (0..GENERATION_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            fences: Mutex::new(Fences::default()),
            fence_lifted: Notify::new(),
            records_begun: AtomicU64::new(0),
            released: Notify::new(),
        }
    }

    /// Raises the fence of snapshot `epoch` on `files` until `until` (or its release): from
    /// now on no lock of them is granted anew and no stale-parity record taken.
    pub fn fence(&self, files: &[FileId], epoch: u64, until: Instant) {
        let mut fences = self.fences();
        // Fences that lapsed unreleased (their taker died) go here, so they never pile up.
        let now = Instant::now();
        fences.standing.retain(|_, epochs| {
            epochs.retain(|_, until| *until > now);
            !epochs.is_empty()
        });
        for &file in files {
            fences
                .standing
                .entry(file)
                .or_default()
                .insert(epoch, until);
        }
    }

    /// Lifts the fence of snapshot `epoch` on `files`.
    pub fn release_fence(&self, files: &[FileId], epoch: u64) {
        let mut fences = self.fences();
        for file in files {
            if let Some(epochs) = fences.standing.get_mut(file) {
                epochs.remove(&epoch);
                if epochs.is_empty() {
                    fences.standing.remove(file);
                }
            }
        }
        drop(fences);
        self.fence_lifted.notify_waiters();
    }

    /// Whether the fence of snapshot `epoch` on `file` stands at `now`.
    pub fn is_fenced(&self, file: FileId, epoch: u64, now: Instant) -> bool {
        let fences = self.fences();
        let until = fences.standing.get(&file).and_then(|e| e.get(&epoch));
        until.is_some_and(|&until| until > now)
    }

    /// [`is_fenced`](Self::is_fenced) as an answer: [`StorageError::NotFenced`] unless the
    /// fence of `epoch` on `file` stands at `now` (what a request done under a fence checks).
    pub fn require_fenced(
        &self,
        file: FileId,
        epoch: u64,
        now: Instant,
    ) -> Result<(), StorageError> {
        if self.is_fenced(file, epoch, now) {
            Ok(())
        } else {
            Err(StorageError::NotFenced { file, epoch })
        }
    }

    /// Admits a request that takes a stale-parity record of `file`, counted until the guard
    /// drops; [`StorageError::Fenced`] while a snapshot fence of `file` stands.
    pub fn enter_unfenced(&self, file: FileId) -> Result<Entered<'_>, StorageError> {
        let mut fences = self.fences();
        if fences.until(file, Instant::now()).is_some() {
            return Err(StorageError::Fenced { file });
        }
        *fences.entered.entry(file).or_default() += 1;
        Ok(Entered { locks: self, file })
    }

    /// Whether no write of `file` is in flight here as far as locks tell: no lock of it held
    /// or waited for, no stale-parity record request admitted. A lock whose lease has run out
    /// is broken first: its holder's later requests are refused, so it writes no parity.
    pub fn quiet(&self, file: FileId) -> bool {
        let fences = self.fences();
        if fences.entered.contains_key(&file) {
            return false;
        }
        let now = Instant::now();
        let mut table = self.table();
        let keys: Vec<LockKey> = table.keys().filter(|k| k.0 == file).copied().collect();
        for key in keys {
            if table[&key].holder.lease_end <= now {
                self.broken.fetch_add(1, Ordering::Relaxed);
                hand_over(&mut table, key, self.lease);
            }
        }
        !table.keys().any(|key| key.0 == file)
    }

    /// Gives `stripes` of `file` a new generation. Called before a record covering their
    /// writes is deleted (and after the parity write it covered), so that a reader that does
    /// not see the record any more sees the change.
    pub fn stripes_changed(&self, file: FileId, stripes: IndexRange) {
        let generation = self.token_next.fetch_add(1, Ordering::SeqCst);
        let count = stripes.end.saturating_sub(stripes.start);
        if count >= GENERATION_SLOTS as u64 {
            for slot in self.generations.iter() {
                slot.store(generation, Ordering::SeqCst);
            }
            return;
        }
        for stripe in stripes.start..stripes.end {
            self.generations[generation_slot(file, stripe)].store(generation, Ordering::SeqCst);
        }
    }

    /// The generation of `stripe` of `file` now (see [`ParityLocks::stripes_changed`]).
    pub fn generation(&self, file: FileId, stripe: u64) -> u64 {
        self.generations[generation_slot(file, stripe)].load(Ordering::SeqCst)
    }

    /// How long a lock lasts past its holder's last sign of life.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// Takes the lock of `stripe` of `file` for `owner`; resolves with the grant's token once
    /// it is granted. Lockers queue in arrival order behind the holder; a holder whose lease
    /// has run out is broken. Waits `wait_max` at most, then fails with
    /// [`StorageError::LockBusy`]. A lock is not reentrant: an owner locking a stripe it holds
    /// queues behind itself until it unlocks or its lease ends.
    ///
    /// Cancel-safe: if the future is dropped while queued, it leaves the queue; if it is
    /// dropped after the lock was handed to it, the lock passes on to the next waiter.
    /// If [`ParityLocks::release_all`] drops the wait (its owner closed), the future fails with
    /// [`StorageError::StaleLock`].
    pub async fn lock(
        &self,
        file: FileId,
        stripe: u64,
        owner: u64,
        wait_max: Duration,
    ) -> Result<LockToken, StorageError> {
        let key = (file, stripe);
        let token = self.token_next.fetch_add(1, Ordering::Relaxed);
        let give_up = Instant::now() + wait_max;
        let mut granted = loop {
            self.past_fences(file, stripe, give_up).await?;
            let fences = self.fences();
            if fences.until(file, Instant::now()).is_some() {
                // Raised since: wait again.
                continue;
            }
            let mut table = self.table();
            match table.entry(key) {
                Entry::Vacant(vacant) => {
                    vacant.insert(LockState {
                        holder: self.holder(owner, token, Instant::now()),
                        queue: VecDeque::new(),
                    });
                    return Ok(token);
                }
                Entry::Occupied(mut occupied) => {
                    let (grant, granted) = oneshot::channel();
                    occupied.get_mut().queue.push_back(Waiter {
                        owner,
                        token,
                        grant,
                    });
                    break granted;
                }
            }
        };
        let mut pending = PendingLock {
            locks: self,
            key,
            token,
            settled: false,
        };
        loop {
            let wake = self.lease_end(key).map_or(give_up, |end| end.min(give_up));
            match tokio::time::timeout_at(wake, &mut granted).await {
                Ok(answer) => {
                    pending.settled = true;
                    // An error means release_all dropped this wait: its connection is gone.
                    return answer
                        .map(|()| token)
                        .map_err(|_| StorageError::StaleLock { stripe, token });
                }
                Err(_) if Instant::now() >= give_up => {
                    // `pending` leaves the queue (or passes on a lock granted just now).
                    return Err(StorageError::LockBusy { stripe });
                }
                Err(_) => self.break_expired(key, Instant::now()),
            }
        }
    }

    /// Waits until no snapshot fence of `file` stands (or `give_up`: then
    /// [`StorageError::LockBusy`]). The caller checks again under the fences' mutex.
    async fn past_fences(
        &self,
        file: FileId,
        stripe: u64,
        give_up: Instant,
    ) -> Result<(), StorageError> {
        loop {
            let lifted = self.fence_lifted.notified();
            tokio::pin!(lifted);
            lifted.as_mut().enable();
            let now = Instant::now();
            let Some(until) = self.fences().until(file, now) else {
                return Ok(());
            };
            if now >= give_up {
                return Err(StorageError::LockBusy { stripe });
            }
            tokio::select! {
                () = lifted => {}
                () = tokio::time::sleep_until(until.min(give_up)) => {}
            }
        }
    }

    /// Extends the lease of the lock of `stripe` of `file` held with `token`;
    /// [`StorageError::StaleLock`] if `token` does not hold it.
    pub fn renew(&self, file: FileId, stripe: u64, token: LockToken) -> Result<(), StorageError> {
        let mut table = self.table();
        match table.get_mut(&(file, stripe)) {
            Some(state) if state.holder.token == token => {
                state.holder.lease_end = Instant::now() + self.lease;
                Ok(())
            }
            _ => Err(StorageError::StaleLock { stripe, token }),
        }
    }

    /// Releases the lock of `stripe` of `file` held with `token` and hands it to the next
    /// waiter still waiting. [`StorageError::StaleLock`] if `token` does not hold it.
    pub fn unlock(&self, file: FileId, stripe: u64, token: LockToken) -> Result<(), StorageError> {
        let key = (file, stripe);
        let mut table = self.table();
        match table.get(&key) {
            Some(state) if state.holder.token == token => {
                hand_over(&mut table, key, self.lease);
                drop(table);
                self.released.notify_waiters();
                Ok(())
            }
            _ => Err(StorageError::StaleLock { stripe, token }),
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
                hand_over(&mut table, key, self.lease);
            }
        }
        drop(table);
        self.released.notify_waiters();
    }

    /// Counts a stale-parity record about to be taken; call before taking it, then
    /// [`wait_settled`](Self::wait_settled) once it is taken.
    pub fn record_begins(&self) {
        self.records_begun.fetch_add(1, Ordering::SeqCst);
    }

    /// The count of records begun, read before a holder looks for live records.
    pub fn records_begun(&self) -> u64 {
        self.records_begun.load(Ordering::SeqCst)
    }

    /// Marks the holder `token` of `stripe` of `file` settled, if no record began since
    /// `begun` was read (`Ok(false)`: look for live records again).
    /// [`StorageError::StaleLock`] if `token` does not hold the lock.
    pub fn settle(
        &self,
        file: FileId,
        stripe: u64,
        token: LockToken,
        begun: u64,
    ) -> Result<bool, StorageError> {
        let mut table = self.table();
        match table.get_mut(&(file, stripe)) {
            Some(state) if state.holder.token == token => {
                if self.records_begun() != begun {
                    return Ok(false);
                }
                state.holder.settled = true;
                Ok(true)
            }
            _ => Err(StorageError::StaleLock { stripe, token }),
        }
    }

    /// Waits until no settled holder of a lock of `stripes` of `file` is left (unlocked, or
    /// broken once its lease ran out); [`StorageError::LockBusy`] at `give_up`.
    pub async fn wait_settled(
        &self,
        file: FileId,
        stripes: IndexRange,
        give_up: Instant,
    ) -> Result<(), StorageError> {
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            let now = Instant::now();
            let held: Vec<(LockKey, Instant)> = self
                .table()
                .iter()
                .filter(|(key, state)| {
                    key.0 == file && stripes.contains(key.1) && state.holder.settled
                })
                .map(|(&key, state)| (key, state.holder.lease_end))
                .collect();
            let Some(&((_, stripe), _)) = held.first() else {
                return Ok(());
            };
            for &(key, lease_end) in &held {
                if lease_end <= now {
                    self.break_expired(key, now);
                }
            }
            if now >= give_up {
                return Err(StorageError::LockBusy { stripe });
            }
            let wake = held.iter().map(|&(_, end)| end).min().unwrap_or(give_up);
            tokio::select! {
                () = released => {}
                () = tokio::time::sleep_until(wake.max(now).min(give_up)) => {}
            }
        }
    }

    /// Number of locks held.
    pub fn held(&self) -> usize {
        self.table().len()
    }

    /// The owner holding the lock of `stripe` of `file`, if any.
    pub fn holder_of(&self, file: FileId, stripe: u64) -> Option<u64> {
        self.table()
            .get(&(file, stripe))
            .map(|state| state.holder.owner)
    }

    /// Number of `lock` calls queued behind holders (including ones whose future was dropped
    /// but not yet skipped).
    pub fn waiting(&self) -> usize {
        self.table().values().map(|state| state.queue.len()).sum()
    }

    /// Number of locks broken because their lease ran out.
    pub fn broken(&self) -> u64 {
        self.broken.load(Ordering::Relaxed)
    }

    fn holder(&self, owner: u64, token: LockToken, now: Instant) -> Holder {
        Holder {
            owner,
            token,
            lease_end: now + self.lease,
            settled: false,
        }
    }

    /// When the lease of the lock at `key` ends, if it is held.
    fn lease_end(&self, key: LockKey) -> Option<Instant> {
        self.table().get(&key).map(|state| state.holder.lease_end)
    }

    /// Breaks the lock at `key` if its lease has run out by `now`.
    fn break_expired(&self, key: LockKey, now: Instant) {
        let mut table = self.table();
        if table
            .get(&key)
            .is_some_and(|state| state.holder.lease_end <= now)
        {
            self.broken.fetch_add(1, Ordering::Relaxed);
            hand_over(&mut table, key, self.lease);
            drop(table);
            self.released.notify_waiters();
        }
    }

    /// The fences; every step leaves them consistent, so a poisoned mutex is still usable.
    fn fences(&self) -> MutexGuard<'_, Fences> {
        self.fences.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The table; every step leaves it consistent, so a poisoned mutex is still usable.
    fn table(&self) -> MutexGuard<'_, HashMap<LockKey, LockState>> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The generation table's slot of `stripe` of `file`.
fn generation_slot(file: FileId, stripe: u64) -> usize {
    // A multiplicative hash, which spreads the stripes of one file over the slots.
    let mixed =
        (file.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ stripe).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    (mixed >> 32) as usize % GENERATION_SLOTS
}

/// Gives the lock at `key` to the first waiter whose future is still alive (with a fresh
/// lease), or removes it.
fn hand_over(table: &mut HashMap<LockKey, LockState>, key: LockKey, lease: Duration) {
    let Some(state) = table.get_mut(&key) else {
        return;
    };
    while let Some(waiter) = state.queue.pop_front() {
        // Sending fails if the waiter's future was dropped: skip it.
        if waiter.grant.send(()).is_ok() {
            state.holder = Holder {
                owner: waiter.owner,
                token: waiter.token,
                lease_end: Instant::now() + lease,
                settled: false,
            };
            return;
        }
    }
    table.remove(&key);
}

/// Cleans up after a `lock` future dropped (or given up) before it resolved.
struct PendingLock<'a> {
    locks: &'a ParityLocks,
    key: LockKey,
    token: LockToken,
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
        if state.holder.token == self.token {
            // Granted, but nobody will ever know: pass it on.
            hand_over(&mut table, self.key, self.locks.lease);
            drop(table);
            self.locks.released.notify_waiters();
        } else {
            state.queue.retain(|waiter| waiter.token != self.token);
        }
    }
}
