//! Which authenticated role may make which manager request.
//!
//! Every connection to the manager is authenticated by its handshake (`tessera_auth`) as the
//! admin, a storage server or the holder of a client access key; a request its role may not
//! make is refused with [`ManagerError::Forbidden`] and changes nothing.
//!
//! | request | admin | server | client | why |
//! |---|:-:|:-:|:-:|---|
//! | `Register`, `Heartbeat` | | yes | | only a server joins, takes its id back, or keeps one up |
//! | `Orphans`, `OrphansRemoved` | | yes | | a server learns which removed files to delete, and says it did |
//! | `StorageKeys` | | yes | | the keys servers check clients by |
//! | `Resynced` | yes | | | clears a debt: a lie would serve stale bytes, so rebuild runs as admin |
//! | `KeyCreate`, `KeyList`, `KeyRemove` | yes | | | access keys are the admin's |
//! | `ReportDown`, `ReportMissed` | yes | | yes | writers report what they could not reach; a false report only degrades (reads reconstruct, rebuild repairs) |
//! | `Create`, `Lookup`, `LookupId`, `List`, `Remove`, `SetSize`, `Sync`, `SyncFile`, `Status`, `FilesOnServer`, `CreatePending`, `RenewPending`, `CommitPending`, `CommitPendingSized`, `AbandonPending`, `Namespace`, `SnapshotCreate`, `SnapshotReady`, `SnapshotList`, `SnapshotRemove` | yes | | yes | the namespace is the clients' |
//! | `Reserve`, `RenewReservation`, `ReleaseReservation` | yes | | yes | streams reserve their rate (admission control, `reservations.rs`) |
//!
//! | `Replica` | yes | yes | yes | a replica's role, view and position |
//! | `Snapshot` | yes | | | a copy of the whole store, for a replica catching up (replicas hold the secret) |
//! | `ReplicaGroup` | yes | yes | yes | the replicas' group as a replica's store records it |
//! | `ReplicaChange` | yes | | | adds or removes a replica (`tessera manager add|remove`) |
//! | `Once` | | | | as the request it wraps |
//!
//! The admin may do everything a client may, so operators need no second key for rebuild.

use tessera_auth::Role;
use tessera_wire::{ManagerError, ManagerRequest};

/// The roles that may make `request`.
pub fn roles_allowed(request: &ManagerRequest) -> &'static [Role] {
    use ManagerRequest as R;
    match request {
        R::Once { request, .. } => roles_allowed(request),
        R::Replica | R::ReplicaGroup => &[Role::Admin, Role::Server, Role::Client],
        R::Snapshot { .. } | R::ReplicaChange { .. } => &[Role::Admin],
        R::Register { .. }
        | R::Heartbeat { .. }
        | R::StorageKeys
        | R::Orphans { .. }
        | R::OrphansRemoved { .. } => &[Role::Server],
        R::Resynced { .. } | R::KeyCreate { .. } | R::KeyList | R::KeyRemove { .. } => {
            &[Role::Admin]
        }
        R::ReportDown { .. }
        | R::ReportMissed { .. }
        | R::Create { .. }
        | R::Lookup { .. }
        | R::LookupId { .. }
        | R::List { .. }
        | R::Remove { .. }
        | R::SetSize { .. }
        | R::Sync
        | R::SyncFile { .. }
        | R::Status
        | R::FilesOnServer { .. }
        | R::CreatePending { .. }
        | R::RenewPending { .. }
        | R::CommitPending { .. }
        | R::CommitPendingSized { .. }
        | R::AbandonPending { .. }
        | R::Namespace(_)
        | R::Reserve { .. }
        | R::RenewReservation { .. }
        | R::ReleaseReservation { .. }
        | R::SnapshotCreate { .. }
        | R::SnapshotReady { .. }
        | R::SnapshotList { .. }
        | R::SnapshotRemove { .. } => &[Role::Admin, Role::Client],
    }
}

/// Refuses `request` unless `role` may make it.
pub fn authorize(request: &ManagerRequest, role: Role) -> Result<(), ManagerError> {
    let allowed = roles_allowed(request);
    if allowed.contains(&role) {
        return Ok(());
    }
    let name = format!("{request:?}");
    let name = name
        .split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or("request");
    Err(ManagerError::Forbidden {
        request: name.to_string(),
        needs: allowed
            .iter()
            .map(|r| r.name())
            .collect::<Vec<_>>()
            .join(" or "),
        role,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_wire::IndexRange;

    #[test]
    fn privileged_requests_need_their_role() {
        let resynced = ManagerRequest::Resynced {
            server: 1,
            file: 1,
            stripes: IndexRange::new(0, u64::MAX),
            tag: 1,
        };
        assert!(authorize(&resynced, Role::Admin).is_ok());
        assert_eq!(
            authorize(&resynced, Role::Client),
            Err(ManagerError::Forbidden {
                request: "Resynced".into(),
                needs: "admin".into(),
                role: Role::Client,
            })
        );
        let register = ManagerRequest::Register {
            server: Some(1),
            addr: "127.0.0.1:1".into(),
            incarnation: 1,
            cluster: None,
        };
        assert!(authorize(&register, Role::Server).is_ok());
        assert!(authorize(&register, Role::Client).is_err());
        assert!(authorize(&register, Role::Admin).is_err());
        assert!(authorize(&ManagerRequest::ReportDown { server: 1 }, Role::Server).is_err());
        assert!(authorize(&ManagerRequest::ReportDown { server: 1 }, Role::Client).is_ok());
        assert!(authorize(&ManagerRequest::KeyList, Role::Client).is_err());
        assert!(authorize(&ManagerRequest::Status, Role::Server).is_err());
    }
}
