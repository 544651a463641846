//! Mirror fences (`StorageRequest::MirrorFence`): a scrub's hold on the writes of one file at
//! this server while it repairs the copy held here from the other copy.
//!
//! Why a hold suffices is argued in `tessera-client`'s `maintain` module: a writer sends a
//! mirrored write to the mirror only once its primary copy is answered, so while no write
//! lands at the mirror, the primary read under the fence is at least as new as anything the
//! mirror will have been given, and the repair copies it there without undoing any write.
//! Writes held back wait here, before they take a disk slot (so that they never keep the
//! repair's own write from the disk), and go on when the fence is released or lapses. The
//! repair's own writes come wrapped in `UnderMirrorFence` with the fence's token, pass, and
//! are refused if the fence no longer stands. A fence is in memory only: a server that
//! restarts has none, and the repair's write under it is then refused (`NotFenced`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tessera_wire::{FileId, StorageError, StorageRequest};
use tokio::sync::Notify;
use tokio::time::Instant;

/// The fences standing at this server.
#[derive(Debug, Default)]
pub(crate) struct MirrorFences {
    standing: Mutex<HashMap<FileId, Standing>>,
    /// Woken when a fence is released.
    lifted: Notify,
}

#[derive(Debug, Clone, Copy)]
struct Standing {
    token: u64,
    until: Instant,
}

/// The file of a write that a mirror fence holds back, if `request` is one.
pub(crate) fn held_back_file(request: &StorageRequest) -> Option<FileId> {
    match request {
        StorageRequest::Write { file, .. }
        | StorageRequest::OverflowWrite { file, .. }
        | StorageRequest::OverflowInvalidate { file, .. }
        | StorageRequest::OverflowRepairDamaged { file, .. }
        | StorageRequest::Discard { file, .. } => Some(*file),
        _ => None,
    }
}

/// The file of a write that may be made under a mirror fence (`UnderMirrorFence`), if
/// `request` is one.
pub(crate) fn repair_file(request: &StorageRequest) -> Option<FileId> {
    match request {
        StorageRequest::Write { file, .. }
        | StorageRequest::OverflowWrite { file, .. }
        | StorageRequest::OverflowInvalidate { file, .. } => Some(*file),
        _ => None,
    }
}

/// How a request passes this server's mirror fences.
pub(crate) enum Passage {
    /// Answered here: a fence raised or released, or a repair of the wrong kind refused.
    Answered(Result<(), StorageError>),
    /// To be served; for a repair, the file and the token of the fence that must still stand
    /// when it is ([`MirrorFences::require`]).
    Serve(StorageRequest, Option<(FileId, u64)>),
}

impl MirrorFences {
    /// Answers a fence's own requests, unwraps a repair, and holds back a write of a fenced
    /// file until its fence is lifted; other requests pass at once.
    pub(crate) async fn pass(&self, request: StorageRequest) -> Passage {
        match request {
            StorageRequest::MirrorFence { file, fence } => {
                let lease = Duration::from_millis(tessera_wire::MIRROR_FENCE_LEASE_MS);
                Passage::Answered(self.raise(file, fence, lease).await)
            }
            StorageRequest::MirrorRelease { file, fence } => {
                self.release(file, fence);
                Passage::Answered(Ok(()))
            }
            StorageRequest::UnderMirrorFence { fence, request } => match repair_file(&request) {
                Some(file) => Passage::Serve(*request, Some((file, fence))),
                None => Passage::Answered(Err(StorageError::BadRequest {
                    detail: "only a Write, OverflowWrite or OverflowInvalidate is made under a \
                             mirror fence"
                        .into(),
                })),
            },
            other => {
                if let Some(file) = held_back_file(&other) {
                    self.wait_out(file).await;
                }
                Passage::Serve(other, None)
            }
        }
    }

    /// The fence of `file` standing at `now`, if one does.
    fn standing(&self, file: FileId, now: Instant) -> Option<Standing> {
        let standing = self.standing.lock().unwrap();
        standing.get(&file).copied().filter(|s| s.until > now)
    }

    /// Whether a fence of `file` stands now (a write of it is then not answered inline).
    pub(crate) fn stands(&self, file: FileId) -> bool {
        self.standing(file, Instant::now()).is_some()
    }

    /// Raises fence `token` on `file` for `lease` (renewed if it is this token's already),
    /// once any other caller's fence of it is released or lapses; [`StorageError::FenceBusy`]
    /// if that takes longer than `lease`.
    pub(crate) async fn raise(
        &self,
        file: FileId,
        token: u64,
        lease: Duration,
    ) -> Result<(), StorageError> {
        let give_up = Instant::now() + lease;
        loop {
            let lifted = self.lifted.notified();
            tokio::pin!(lifted);
            lifted.as_mut().enable();
            let now = Instant::now();
            let other = {
                let mut standing = self.standing.lock().unwrap();
                standing.retain(|_, s| s.until > now);
                match standing.get(&file) {
                    Some(s) if s.token != token => Some(s.until),
                    _ => {
                        let until = now + lease;
                        standing.insert(file, Standing { token, until });
                        None
                    }
                }
            };
            let Some(until) = other else {
                return Ok(());
            };
            if now >= give_up {
                return Err(StorageError::FenceBusy { file });
            }
            tokio::select! {
                _ = lifted => {}
                _ = tokio::time::sleep_until(until.min(give_up)) => {}
            }
        }
    }

    /// Lifts fence `token` of `file`, if it stands.
    pub(crate) fn release(&self, file: FileId, token: u64) {
        let mut standing = self.standing.lock().unwrap();
        if standing.get(&file).is_some_and(|s| s.token == token) {
            standing.remove(&file);
        }
        drop(standing);
        self.lifted.notify_waiters();
    }

    /// Waits until no fence of `file` stands.
    pub(crate) async fn wait_out(&self, file: FileId) {
        loop {
            let lifted = self.lifted.notified();
            tokio::pin!(lifted);
            lifted.as_mut().enable();
            let Some(standing) = self.standing(file, Instant::now()) else {
                return;
            };
            tokio::select! {
                _ = lifted => {}
                _ = tokio::time::sleep_until(standing.until) => {}
            }
        }
    }

    /// [`StorageError::NotFenced`] unless fence `token` of `file` stands now.
    pub(crate) fn require(&self, file: FileId, token: u64) -> Result<(), StorageError> {
        match self.standing(file, Instant::now()) {
            Some(s) if s.token == token => Ok(()),
            _ => Err(StorageError::NotFenced { file, epoch: token }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    const LEASE: Duration = Duration::from_millis(1000);

    /// A write waits out a fence until it is released, and a repair under it passes only
    /// while it stands.
    #[tokio::test(start_paused = true)]
    async fn a_write_waits_until_the_fence_is_released() {
        let fences = Arc::new(MirrorFences::default());
        fences.raise(7, 42, LEASE).await.unwrap();
        assert!(fences.stands(7) && !fences.stands(8));
        assert!(fences.require(7, 42).is_ok());
        assert!(fences.require(7, 43).is_err());
        let waiting = {
            let fences = fences.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                fences.wait_out(7).await;
                started.elapsed()
            })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiting.is_finished(), "the write is held back");
        fences.release(7, 42);
        let waited = waiting.await.unwrap();
        assert!(waited >= Duration::from_millis(100) && waited < LEASE);
        assert!(fences.require(7, 42).is_err(), "released");
    }

    /// A fence whose holder went silent lapses: writes go on, the repair is refused, and
    /// another caller's fence is raised once the first lapses.
    #[tokio::test(start_paused = true)]
    async fn a_fence_lapses_by_itself() {
        let fences = MirrorFences::default();
        fences.raise(7, 1, LEASE).await.unwrap();
        let started = Instant::now();
        fences.raise(7, 2, LEASE * 2).await.unwrap();
        assert!(started.elapsed() >= LEASE, "waited out the first fence");
        assert!(fences.require(7, 1).is_err());
        assert!(fences.require(7, 2).is_ok());
        fences.release(7, 1);
        assert!(fences.stands(7), "a stale token lifts nothing");
        let started = Instant::now();
        fences.wait_out(7).await;
        assert!(started.elapsed() >= LEASE * 2 - Duration::from_millis(1));
        assert!(!fences.stands(7));
    }

    /// Another caller's fence that outlasts the wait is refused as busy.
    #[tokio::test(start_paused = true)]
    async fn a_second_fence_gives_up_when_the_first_stands_too_long() {
        let fences = MirrorFences::default();
        fences.raise(7, 1, LEASE * 10).await.unwrap();
        let refused = fences.raise(7, 2, LEASE).await.unwrap_err();
        assert!(matches!(refused, StorageError::FenceBusy { file: 7 }));
    }
}
