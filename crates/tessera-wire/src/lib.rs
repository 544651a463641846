//! Tessera's wire messages and their framing.
//!
//! This crate owns every byte that crosses the network between clients, storage servers and the
//! metadata manager: the typed messages ([`StorageRequest`], addressed to one store as a
//! [`StorageCall`], [`ManagerRequest`] and their responses) and the frame that carries them. It is pure: it turns values into bytes and bytes
//! into values, and never touches a socket. Transports (TCP now, the datagram transport later)
//! move [`Frame`]s and know nothing of what is inside.
//!
//! A frame is a fixed 20-byte header, a small serialized message (postcard) and an optional bulk
//! payload of raw bytes (stripe-unit data), kept apart so that data is never re-encoded:
//!
//! ```text
//! magic "TS" | version u8 | kind u8 | message_len u32 | payload_len u32 | request_id u64
//! ```
//!
//! Every length is bounded before anything is allocated, and decoding garbage returns an error,
//! never a panic.
//!
//! Protocol version 1 grows only by appending variants at the ends of the message enums
//! (postcard numbers variants by position, so every earlier message keeps its bytes; an older
//! peer answers a variant it does not know as an undecodable message). Appended since the
//! first release: the manager's pending files and orphans (`CreatePending`, `RenewPending`,
//! `CommitPending`, `AbandonPending`, `Orphans`, `OrphansRemoved`; responses `Pending`,
//! `Committed`, `Orphans`; errors `NotPending`, `TooLarge`) and the storage request
//! `Allocated` with its response; the manager's store (issue 15, item 8): `StorageRequest::Describe`
//! and `Records`, `StorageResponse::Records`, `ManagerError::StoreLost` and `NoStore`.
//!
//! Every connection opens with a [`Handshake`] (frame protocol version 3; version 1 had none
//! and is refused by the version check). Appended for authentication: `KeyCreate`,
//! `KeyList`, `KeyRemove`, `StorageKeys` (responses `KeyCreated`, `Keys`, `StorageKeys`;
//! errors `Forbidden`, `UnknownKey`). Protocol version 4 appends the stale-parity records of
//! full-stripe writes: `StorageRequest::RecordStale`, `RenewStale`, `ClearStale`,
//! `StorageResponse::StaleRecorded`, and the `stale` flag of `Locked` and `Intent`.
//! Version 5: degraded reads wait for a live stale record (`ListStale`). Version 6: the
//! stripe `generation` of `Intent` (degraded reads fenced against writes that complete while
//! they read); appended with it, the directory tree (`ManagerRequest::Namespace`, responses
//! `Entry` and `Dir`, errors `NotEmpty`, `IsDir`, `NotDir`) and Radon's admission control
//! (`Reserve`, `RenewReservation`, `ReleaseReservation`, response `Reserved`, error
//! `ReservationRefused`), and copy-on-write snapshots:
//! `StorageRequest::SnapshotBegin`, `ReadSnapshot`, `SnapshotDrop`, `SnapshotUsage`,
//! `ManagerRequest::SnapshotCreate`, `SnapshotReady`, `SnapshotList`, `SnapshotRemove`, and
//! `ManagerResponse::Snapshots`, `SnapshotRemoved`, `Retained`; and `CommitPendingSized` (a
//! commit that carries the file's size, issue 19). Version 8: a snapshot is begun behind a
//! fence against writes in flight (`StorageRequest::SnapshotFence`, `SnapshotRelease`).
//! Appended in version 8: `StorageError::Removed`, a write refused because the manager
//! removed its file (an older peer cannot decode it, and fails the write all the same).
//! Appended in version 8: `ManagerRequest::ReplicaChange` and `ReplicaGroup`,
//! `ManagerResponse::ReplicaGroup` (the replicated manager's membership; an older replica
//! cannot decode them and refuses the request). Appended in version 15:
//! `StorageRequest::KeptBytes` and `StorageResponse::Kept` (the bytes a store kept at a power
//! loss, put back by a rebuild with nothing else to go on; an older server refuses it, and
//! the rebuild then fails as it did before). Version 16 appends the mirror fence of a
//! scrub's repairs: `StorageRequest::MirrorFence`, `MirrorRelease` and `UnderMirrorFence`, and
//! `OverflowRepairDamaged` (a damaged overflow log repaired only where it is damaged).

mod frame;
mod handshake;
mod messages;
mod namespace;

pub use frame::*;
pub use handshake::*;
pub use messages::*;
pub use namespace::*;
pub use tessera_auth::{Claim, Key, KeyId, Refusal, Role};

#[cfg(test)]
mod tests;
