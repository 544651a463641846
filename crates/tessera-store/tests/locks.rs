//! CSAR 5.1: parity locks, FIFO per (file, stripe), owned by connections.

use std::sync::Arc;
use std::time::Duration;

use tessera_store::{ParityLocks, StorageError};
use tokio::task::JoinHandle;

const FILE: u64 = 5;

/// Lets spawned tasks on the current-thread runtime run until they block.
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

fn spawn_lock(locks: &Arc<ParityLocks>, stripe: u64, owner: u64) -> JoinHandle<()> {
    let locks = Arc::clone(locks);
    tokio::spawn(async move { locks.lock(FILE, stripe, owner).await })
}

#[tokio::test]
async fn csar_5_1_second_locker_waits_until_unlock() {
    let locks = Arc::new(ParityLocks::new());
    locks.lock(FILE, 0, 1).await;
    assert_eq!(locks.held(), 1);
    // Another stripe, and another file, are independent.
    locks.lock(FILE, 1, 2).await;
    locks.lock(FILE + 1, 0, 2).await;
    assert_eq!(locks.held(), 3);

    let second = spawn_lock(&locks, 0, 2);
    settle().await;
    assert!(!second.is_finished());
    assert_eq!(locks.waiting(), 1);
    locks.unlock(FILE, 0, 1).unwrap();
    second.await.unwrap();
    assert_eq!(locks.holder(FILE, 0), Some(2));
    locks.unlock(FILE, 0, 2).unwrap();
    locks.unlock(FILE, 1, 2).unwrap();
    locks.unlock(FILE + 1, 0, 2).unwrap();
    assert_eq!(locks.held(), 0);
    assert_eq!(locks.waiting(), 0);
}

#[tokio::test]
async fn csar_5_1_waiters_are_granted_in_arrival_order() {
    let locks = Arc::new(ParityLocks::new());
    locks.lock(FILE, 7, 10).await;
    let mut waiters = Vec::new();
    for owner in [11, 12, 13] {
        waiters.push(spawn_lock(&locks, 7, owner));
        settle().await;
    }
    for ((holder, next), waiter) in [(10, 11), (11, 12), (12, 13)].into_iter().zip(waiters) {
        assert_eq!(locks.holder(FILE, 7), Some(holder));
        assert!(!waiter.is_finished());
        locks.unlock(FILE, 7, holder).unwrap();
        waiter.await.unwrap();
        assert_eq!(locks.holder(FILE, 7), Some(next));
    }
    locks.unlock(FILE, 7, 13).unwrap();
    assert_eq!(locks.held(), 0);
}

#[tokio::test]
async fn unlock_by_a_non_holder_is_refused() {
    let locks = ParityLocks::new();
    assert_eq!(
        locks.unlock(FILE, 3, 1),
        Err(StorageError::NotLockHolder { stripe: 3 })
    );
    locks.lock(FILE, 3, 1).await;
    assert_eq!(
        locks.unlock(FILE, 3, 2),
        Err(StorageError::NotLockHolder { stripe: 3 })
    );
    assert_eq!(locks.holder(FILE, 3), Some(1));
    locks.unlock(FILE, 3, 1).unwrap();
    assert_eq!(
        locks.unlock(FILE, 3, 1),
        Err(StorageError::NotLockHolder { stripe: 3 })
    );
}

#[tokio::test]
async fn release_all_frees_held_locks_passes_them_on_and_drops_queued_waits() {
    let locks = Arc::new(ParityLocks::new());
    locks.lock(FILE, 1, 100).await;
    locks.lock(FILE, 2, 100).await;
    locks.lock(FILE, 3, 200).await;
    let next_on_1 = spawn_lock(&locks, 1, 200);
    let queued_on_3 = spawn_lock(&locks, 3, 100);
    settle().await;
    assert_eq!(locks.waiting(), 2);

    locks.release_all(100);
    next_on_1.await.unwrap();
    assert_eq!(locks.holder(FILE, 1), Some(200));
    assert_eq!(locks.holder(FILE, 2), None);
    assert_eq!(locks.holder(FILE, 3), Some(200));
    // The closed connection's wait resolved without the lock.
    queued_on_3.await.unwrap();
    assert_eq!(locks.waiting(), 0);
    locks.unlock(FILE, 3, 200).unwrap();
    assert_eq!(locks.holder(FILE, 3), None);
    assert_eq!(locks.held(), 1);
    locks.release_all(200);
    assert_eq!(locks.held(), 0);
}

#[tokio::test]
async fn a_dropped_waiter_is_skipped() {
    let locks = Arc::new(ParityLocks::new());
    locks.lock(FILE, 0, 1).await;
    // A waiter that gives up: its future is dropped while queued.
    let gave_up = tokio::time::timeout(Duration::from_millis(10), locks.lock(FILE, 0, 2)).await;
    assert!(gave_up.is_err());
    let aborted = spawn_lock(&locks, 0, 3);
    let patient = spawn_lock(&locks, 0, 4);
    settle().await;
    aborted.abort();
    settle().await;
    locks.unlock(FILE, 0, 1).unwrap();
    patient.await.unwrap();
    assert_eq!(locks.holder(FILE, 0), Some(4));
    assert_eq!(locks.waiting(), 0);
}

#[tokio::test]
async fn a_lock_granted_to_a_dropped_future_passes_on() {
    let locks = Arc::new(ParityLocks::new());
    locks.lock(FILE, 0, 1).await;
    let doomed = spawn_lock(&locks, 0, 2);
    settle().await;
    let patient = spawn_lock(&locks, 0, 3);
    settle().await;
    // The lock is handed to owner 2's future, which is dropped before it ever runs again.
    locks.unlock(FILE, 0, 1).unwrap();
    assert_eq!(locks.holder(FILE, 0), Some(2));
    doomed.abort();
    patient.await.unwrap();
    assert_eq!(locks.holder(FILE, 0), Some(3));
    locks.unlock(FILE, 0, 3).unwrap();
    assert_eq!(locks.held(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_lockers_of_one_stripe_hold_it_one_at_a_time() {
    let locks = Arc::new(ParityLocks::new());
    let inside = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let tasks: Vec<_> = (0..32u64)
        .map(|owner| {
            let locks = Arc::clone(&locks);
            let inside = Arc::clone(&inside);
            tokio::spawn(async move {
                for _ in 0..20 {
                    locks.lock(FILE, 9, owner).await;
                    let before = inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    assert_eq!(before, 0, "two holders at once");
                    tokio::task::yield_now().await;
                    inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    locks.unlock(FILE, 9, owner).unwrap();
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
