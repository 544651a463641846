//! CSAR 5.1: parity locks, FIFO per (file, stripe), owned by connections, leased and fenced.

use std::sync::Arc;
use std::time::Duration;

use tessera_store::{ParityLocks, StorageError};
use tokio::task::JoinHandle;

const FILE: u64 = 5;
const LEASE: Duration = Duration::from_millis(500);
/// Long enough that no test here waits that long for a lock.
const WAIT: Duration = Duration::from_secs(3600);

fn locks() -> Arc<ParityLocks> {
    Arc::new(ParityLocks::new(LEASE, 1))
}

/// Lets spawned tasks on the current-thread runtime run until they block.
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

async fn lock(locks: &ParityLocks, stripe: u64, owner: u64) -> u64 {
    locks
        .lock(FILE, stripe, owner, WAIT)
        .await
        .expect("granted")
}

fn spawn_lock(
    locks: &Arc<ParityLocks>,
    stripe: u64,
    owner: u64,
) -> JoinHandle<Result<u64, StorageError>> {
    let locks = Arc::clone(locks);
    tokio::spawn(async move { locks.lock(FILE, stripe, owner, WAIT).await })
}

#[tokio::test]
async fn csar_5_1_second_locker_waits_until_unlock() {
    let locks = locks();
    let first = lock(&locks, 0, 1).await;
    assert_eq!(locks.held(), 1);
    // Another stripe, and another file, are independent.
    let other_stripe = lock(&locks, 1, 2).await;
    let other_file = locks.lock(FILE + 1, 0, 2, WAIT).await.unwrap();
    assert_eq!(locks.held(), 3);

    let second = spawn_lock(&locks, 0, 2);
    settle().await;
    assert!(!second.is_finished());
    assert_eq!(locks.waiting(), 1);
    locks.unlock(FILE, 0, first).unwrap();
    let second = second.await.unwrap().unwrap();
    assert_eq!(locks.holder_of(FILE, 0), Some(2));
    locks.unlock(FILE, 0, second).unwrap();
    locks.unlock(FILE, 1, other_stripe).unwrap();
    locks.unlock(FILE + 1, 0, other_file).unwrap();
    assert_eq!(locks.held(), 0);
    assert_eq!(locks.waiting(), 0);
}

#[tokio::test]
async fn csar_5_1_waiters_are_granted_in_arrival_order() {
    let locks = locks();
    let mut token = lock(&locks, 7, 10).await;
    let mut waiters = Vec::new();
    for owner in [11, 12, 13] {
        waiters.push(spawn_lock(&locks, 7, owner));
        settle().await;
    }
    for ((holder, next), waiter) in [(10, 11), (11, 12), (12, 13)].into_iter().zip(waiters) {
        assert_eq!(locks.holder_of(FILE, 7), Some(holder));
        assert!(!waiter.is_finished());
        locks.unlock(FILE, 7, token).unwrap();
        token = waiter.await.unwrap().unwrap();
        assert_eq!(locks.holder_of(FILE, 7), Some(next));
    }
    locks.unlock(FILE, 7, token).unwrap();
    assert_eq!(locks.held(), 0);
}

#[tokio::test]
async fn unlock_with_a_token_that_does_not_hold_the_lock_is_refused() {
    let locks = locks();
    let stale = |token| Err(StorageError::StaleLock { stripe: 3, token });
    assert_eq!(locks.unlock(FILE, 3, 1), stale(1));
    let token = lock(&locks, 3, 1).await;
    assert_eq!(locks.unlock(FILE, 3, token + 1), stale(token + 1));
    assert_eq!(locks.renew(FILE, 3, token + 1), stale(token + 1));
    assert_eq!(locks.holder_of(FILE, 3), Some(1));
    locks.unlock(FILE, 3, token).unwrap();
    assert_eq!(locks.unlock(FILE, 3, token), stale(token));
}

#[tokio::test]
async fn release_all_frees_held_locks_passes_them_on_and_drops_queued_waits() {
    let locks = locks();
    lock(&locks, 1, 100).await;
    lock(&locks, 2, 100).await;
    let on_3 = lock(&locks, 3, 200).await;
    let next_on_1 = spawn_lock(&locks, 1, 200);
    let queued_on_3 = spawn_lock(&locks, 3, 100);
    settle().await;
    assert_eq!(locks.waiting(), 2);

    locks.release_all(100);
    next_on_1.await.unwrap().unwrap();
    assert_eq!(locks.holder_of(FILE, 1), Some(200));
    assert_eq!(locks.holder_of(FILE, 2), None);
    assert_eq!(locks.holder_of(FILE, 3), Some(200));
    // The closed connection's wait resolved without the lock.
    assert!(matches!(
        queued_on_3.await.unwrap(),
        Err(StorageError::StaleLock { stripe: 3, .. })
    ));
    assert_eq!(locks.waiting(), 0);
    locks.unlock(FILE, 3, on_3).unwrap();
    assert_eq!(locks.holder_of(FILE, 3), None);
    assert_eq!(locks.held(), 1);
    locks.release_all(200);
    assert_eq!(locks.held(), 0);
}

#[tokio::test]
async fn a_dropped_waiter_is_skipped() {
    let locks = locks();
    let first = lock(&locks, 0, 1).await;
    // A waiter that gives up: its future is dropped while queued.
    let gave_up = tokio::time::timeout(Duration::from_millis(10), lock(&locks, 0, 2)).await;
    assert!(gave_up.is_err());
    let aborted = spawn_lock(&locks, 0, 3);
    let patient = spawn_lock(&locks, 0, 4);
    settle().await;
    aborted.abort();
    settle().await;
    locks.unlock(FILE, 0, first).unwrap();
    patient.await.unwrap().unwrap();
    assert_eq!(locks.holder_of(FILE, 0), Some(4));
    assert_eq!(locks.waiting(), 0);
}

#[tokio::test]
async fn a_lock_granted_to_a_dropped_future_passes_on() {
    let locks = locks();
    let first = lock(&locks, 0, 1).await;
    let doomed = spawn_lock(&locks, 0, 2);
    settle().await;
    let patient = spawn_lock(&locks, 0, 3);
    settle().await;
    // The lock is handed to owner 2's future, which is dropped before it ever runs again.
    locks.unlock(FILE, 0, first).unwrap();
    assert_eq!(locks.holder_of(FILE, 0), Some(2));
    doomed.abort();
    let token = patient.await.unwrap().unwrap();
    assert_eq!(locks.holder_of(FILE, 0), Some(3));
    locks.unlock(FILE, 0, token).unwrap();
    assert_eq!(locks.held(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_silent_holder_is_broken_after_its_lease_and_fenced_off() {
    let locks = locks();
    let dead = lock(&locks, 4, 1).await;
    let started = tokio::time::Instant::now();
    // Renewed halfway: the lease runs from the renewal.
    tokio::time::sleep(LEASE / 2).await;
    locks.renew(FILE, 4, dead).unwrap();
    let next = lock(&locks, 4, 2).await;
    let waited = started.elapsed();
    assert_eq!(
        waited,
        LEASE / 2 + LEASE,
        "broken exactly when the lease ran out"
    );
    assert_eq!(locks.broken(), 1);
    assert_eq!(locks.holder_of(FILE, 4), Some(2));
    assert!(next > dead, "tokens grow");
    // The old holder's late requests are refused; the new holder's are not.
    let stale = Err(StorageError::StaleLock {
        stripe: 4,
        token: dead,
    });
    assert_eq!(locks.renew(FILE, 4, dead), stale);
    assert_eq!(locks.unlock(FILE, 4, dead), stale);
    locks.unlock(FILE, 4, next).unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_uncontended_expired_lock_is_kept_until_someone_waits() {
    let locks = locks();
    let slow = lock(&locks, 0, 1).await;
    tokio::time::sleep(LEASE * 4).await;
    // Nobody needed the lock: the slow holder may still finish.
    locks.renew(FILE, 0, slow).unwrap();
    locks.unlock(FILE, 0, slow).unwrap();
    assert_eq!(locks.broken(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_wait_longer_than_its_bound_is_busy_not_granted() {
    let locks = locks();
    let holder = lock(&locks, 0, 1).await;
    let busy = tokio::spawn({
        let locks = Arc::clone(&locks);
        async move { locks.lock(FILE, 0, 2, LEASE / 5).await }
    });
    // The holder keeps renewing, so its lease never runs out.
    for _ in 0..4 {
        tokio::time::sleep(LEASE / 10).await;
        locks.renew(FILE, 0, holder).unwrap();
    }
    assert_eq!(
        busy.await.unwrap(),
        Err(StorageError::LockBusy { stripe: 0 })
    );
    assert_eq!(locks.waiting(), 0, "a busy waiter leaves the queue");
    locks.unlock(FILE, 0, holder).unwrap();
    assert_eq!(locks.held(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_lockers_of_one_stripe_hold_it_one_at_a_time() {
    let locks = Arc::new(ParityLocks::new(Duration::from_secs(60), 1));
    let inside = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let tasks: Vec<_> = (0..32u64)
        .map(|owner| {
            let locks = Arc::clone(&locks);
            let inside = Arc::clone(&inside);
            tokio::spawn(async move {
                for _ in 0..20 {
                    let token = lock(&locks, 9, owner).await;
                    let before = inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    assert_eq!(before, 0, "two holders at once");
                    tokio::task::yield_now().await;
                    inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    locks.unlock(FILE, 9, token).unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(locks.held(), 0);
    assert_eq!(locks.waiting(), 0);
}

/// A stripe's generation changes when it is marked changed, for every stripe of the range
/// (and of a range longer than the table), and stays put otherwise; it does not restart at a
/// value a reader may have seen from the server's previous run.
#[test]
fn a_stripe_changed_gets_a_new_generation() {
    use tessera_wire::IndexRange;
    let locks = ParityLocks::new(LEASE, 1 << 40);
    let before: Vec<u64> = (0..8).map(|s| locks.generation(FILE, s)).collect();
    locks.stripes_changed(FILE, IndexRange::new(2, 5));
    for stripe in 0..8 {
        let now = locks.generation(FILE, stripe);
        if (2..5).contains(&stripe) {
            assert_ne!(now, before[stripe as usize], "stripe {stripe} changed");
            assert!(now >= 1 << 40, "drawn from the token counter");
        }
        // A stripe outside the range may share a slot with one inside; most do not.
    }
    let unchanged = (0..8)
        .filter(|&s| !(2..5).contains(&s))
        .filter(|&s| locks.generation(FILE, s) == before[s as usize])
        .count();
    assert!(
        unchanged >= 4,
        "{unchanged} of 5 stripes outside the range kept theirs"
    );
    let first = locks.generation(FILE, 3);
    locks.stripes_changed(FILE, IndexRange::new(3, 4));
    assert_ne!(
        locks.generation(FILE, 3),
        first,
        "each change is a new generation"
    );
    let far = locks.generation(FILE + 1, 1 << 50);
    locks.stripes_changed(FILE, IndexRange::new(0, u64::MAX));
    assert_ne!(
        locks.generation(FILE + 1, 1 << 50),
        far,
        "a huge range changes every slot"
    );
}

/// A full-stripe writer's record waits for the settled holders of its stripes (a scrub or a
/// read-modify-writer computing parity from the data), not for holders that have not looked
/// for records yet (they will see the record and wait it out), and not for other stripes.
#[tokio::test(start_paused = true)]
async fn a_record_waits_for_settled_holders_of_its_stripes_only() {
    let locks = locks();
    let settled = lock(&locks, 3, 1).await;
    let begun = locks.records_begun();
    assert!(locks.settle(FILE, 3, settled, begun).unwrap());
    let unsettled = lock(&locks, 4, 2).await;
    let elsewhere = lock(&locks, 9, 3).await;
    assert!(locks.settle(FILE, 9, elsewhere, begun).unwrap());

    locks.record_begins();
    let writer = {
        let locks = Arc::clone(&locks);
        let give_up = tokio::time::Instant::now() + WAIT;
        let stripes = tessera_wire::IndexRange::new(2, 6);
        tokio::spawn(async move { locks.wait_settled(FILE, stripes, give_up).await })
    };
    settle().await;
    assert!(
        !writer.is_finished(),
        "the settled holder of stripe 3 is still working"
    );
    // Renewed, it is waited for past its lease.
    tokio::time::sleep(LEASE / 2).await;
    locks.renew(FILE, 3, settled).unwrap();
    tokio::time::sleep(LEASE / 2).await;
    settle().await;
    assert!(!writer.is_finished());
    locks.unlock(FILE, 3, settled).unwrap();
    writer
        .await
        .unwrap()
        .expect("done once stripe 3 is unlocked");
    // The unsettled holder of stripe 4 looked before the record began: it looks again.
    assert!(!locks.settle(FILE, 4, unsettled, begun).unwrap());
    locks.unlock(FILE, 4, unsettled).unwrap();
    locks.unlock(FILE, 9, elsewhere).unwrap();
}

/// A settled holder that stops renewing is broken once its lease runs out, and the record's
/// writer goes on; one that outlasts the writer's bound makes it busy.
#[tokio::test(start_paused = true)]
async fn a_record_breaks_a_silent_settled_holder_and_gives_up_at_its_bound() {
    let locks = locks();
    let silent = lock(&locks, 0, 1).await;
    assert!(locks
        .settle(FILE, 0, silent, locks.records_begun())
        .unwrap());
    let stripes = tessera_wire::IndexRange::new(0, 1);
    let started = tokio::time::Instant::now();
    locks
        .wait_settled(FILE, stripes, started + WAIT)
        .await
        .expect("the silent holder is broken");
    assert!(started.elapsed() >= LEASE);
    assert_eq!(locks.held(), 0);
    assert!(matches!(
        locks.unlock(FILE, 0, silent),
        Err(StorageError::StaleLock { .. })
    ));

    let busy = lock(&locks, 0, 2).await;
    assert!(locks.settle(FILE, 0, busy, locks.records_begun()).unwrap());
    let keep = {
        let locks = Arc::clone(&locks);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(LEASE / 4).await;
                if locks.renew(FILE, 0, busy).is_err() {
                    return;
                }
            }
        })
    };
    let bound = tokio::time::Instant::now() + LEASE * 3;
    let answer = locks.wait_settled(FILE, stripes, bound).await;
    assert!(matches!(answer, Err(StorageError::LockBusy { stripe: 0 })));
    keep.abort();
}
