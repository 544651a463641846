//! The directory tree (made directories, renames, listings, times) for the
//! POSIX mount and anyone else who wants directories over the flat namespace.

use crate::{Client, ClientError, File};
use tessera_wire::{
    DirListing, ManagerRequest, ManagerResponse, NamespaceEntry, NamespaceRequest, Times, TimesOf,
};

impl Client {
    async fn namespace_call(
        &self,
        request: NamespaceRequest,
    ) -> Result<ManagerResponse, ClientError> {
        self.manager_call(ManagerRequest::Namespace(request)).await
    }

    async fn namespace_change(&self, request: NamespaceRequest) -> Result<(), ClientError> {
        match self.namespace_call(request).await? {
            ManagerResponse::Done => Ok(()),
            other => Err(self.unexpected("done", other)),
        }
    }

    /// Make an empty directory (its parent must be a directory).
    pub async fn make_dir(&self, path: &str) -> Result<(), ClientError> {
        self.namespace_change(NamespaceRequest::MakeDir { path: path.into() })
            .await
    }

    /// Remove an empty directory.
    pub async fn remove_dir(&self, path: &str) -> Result<(), ClientError> {
        self.namespace_change(NamespaceRequest::RemoveDir { path: path.into() })
            .await
    }

    /// Rename a file or a directory with everything below it, in one change. A file at `to`
    /// is replaced (its data is freed by its servers when they next ask for orphans).
    pub async fn rename(&self, from: &str, to: &str) -> Result<(), ClientError> {
        self.namespace_change(NamespaceRequest::Rename {
            from: from.into(),
            to: to.into(),
        })
        .await?;
        self.describe_renamed(to).await;
        Ok(())
    }

    /// Tells the servers of every file now at or below `to` its new path, for the records
    /// a lost manager store is recovered from. Best effort: a sync tells them again.
    async fn describe_renamed(&self, to: &str) {
        let metas = match self.entry(to).await {
            Ok(Some(NamespaceEntry::File { meta, .. })) => vec![meta],
            Ok(Some(NamespaceEntry::Dir { .. })) => {
                self.list(&format!("{to}/")).await.unwrap_or_default()
            }
            _ => Vec::new(),
        };
        for meta in metas {
            if let Ok(ctx) = self.context_of(meta.id).await {
                ctx.describe(self, true).await;
            }
        }
    }

    /// The files and directories directly below `path` (`""`: the root).
    pub async fn list_dir(&self, path: &str) -> Result<DirListing, ClientError> {
        match self
            .namespace_call(NamespaceRequest::ListDir { path: path.into() })
            .await?
        {
            ManagerResponse::Dir(listing) => Ok(listing),
            other => Err(self.unexpected("listing", other)),
        }
    }

    /// What `path` names: a file, a directory, or nothing.
    pub async fn entry(&self, path: &str) -> Result<Option<NamespaceEntry>, ClientError> {
        match self
            .namespace_call(NamespaceRequest::Entry { path: path.into() })
            .await?
        {
            ManagerResponse::Entry(entry) => Ok(entry),
            other => Err(self.unexpected("entry", other)),
        }
    }

    /// Record `file`'s modification time, in nanoseconds since the Unix epoch.
    pub async fn touch(&self, file: &File, modified: u64) -> Result<(), ClientError> {
        self.namespace_change(NamespaceRequest::Touch {
            file: file.id,
            modified,
        })
        .await
    }

    /// Record directory `path`'s modification time, in nanoseconds since the Unix epoch.
    pub async fn touch_dir(&self, path: &str, modified: u64) -> Result<(), ClientError> {
        self.namespace_change(NamespaceRequest::TouchDir {
            path: path.into(),
            modified,
        })
        .await
    }

    /// Record the times given of what `of` names (a `None` keeps the recorded time), in
    /// nanoseconds since the Unix epoch.
    pub async fn set_times(&self, of: TimesOf, times: Times) -> Result<(), ClientError> {
        self.namespace_change(NamespaceRequest::SetTimes { of, times })
            .await
    }
}
