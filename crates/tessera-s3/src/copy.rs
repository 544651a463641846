//! CopyObject, and the conditions of puts and reads that need the object's current ETag.

use crate::conditions::{self, Conditions, Verdict};
use crate::etag_md5::EtagMd5;
use crate::gateway::{name_err, s3_err, Gateway, READ_AHEAD};
use crate::meta::{hex, ObjectMeta, FORMAT_VERSION};
use crate::names;
use futures::StreamExt;
use s3s::dto::*;
use s3s::{s3_error, S3ErrorCode, S3Request, S3Response, S3Result};
use tessera_client::{File, OpenFile, Pieces, StreamUploadError};

impl Gateway {
    /// The object's ETag and modification time, or `None` if there is no such object.
    pub(crate) async fn current_version(
        &self,
        bucket: &str,
        key: &str,
    ) -> S3Result<Option<(File, String, Option<u64>)>> {
        match self.client.open(&names::object_path(bucket, key)).await {
            Ok(file) => {
                let meta = self.object_meta(bucket, key, file.id).await;
                let etag = meta
                    .as_ref()
                    .map_or_else(|| crate::meta::fallback_etag(file.id), |m| m.etag.clone());
                Ok(Some((file, etag, meta.map(|m| m.modified_ms))))
            }
            Err(tessera_client::ClientError::Metadata(tessera_wire::ManagerError::NotFound(_))) => {
                Ok(None)
            }
            Err(e) => Err(s3_err(e, S3ErrorCode::InternalError)),
        }
    }

    /// `If-Match` (the object must exist with that ETag) and `If-None-Match: *` (it must
    /// not exist) of a put.
    pub(crate) async fn check_put_conditions(
        &self,
        bucket: &str,
        key: &str,
        if_match: &Option<ETagCondition>,
        if_none_match: &Option<ETagCondition>,
    ) -> S3Result<()> {
        if if_match.is_none() && if_none_match.is_none() {
            return Ok(());
        }
        let current = self.current_version(bucket, key).await?;
        if let Some(condition) = if_match {
            match &current {
                None => return Err(s3_error!(NoSuchKey, "no object '{key}' to match")),
                Some((_, etag, _)) if !conditions::etag_matches(condition, etag) => {
                    return Err(s3_error!(
                        PreconditionFailed,
                        "If-Match: the ETag is {etag}"
                    ))
                }
                Some(_) => {}
            }
        }
        if let (Some(condition), Some((_, etag, _))) = (if_none_match, &current) {
            if conditions::etag_matches(condition, etag) {
                return Err(s3_error!(
                    PreconditionFailed,
                    "If-None-Match: '{key}' exists"
                ));
            }
        }
        Ok(())
    }

    pub(crate) async fn copy_object_impl(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        let input = req.input;
        let (from_bucket, from_key) = match &input.copy_source {
            CopySource::Bucket { bucket, key, .. } => (bucket.to_string(), key.to_string()),
            _ => return Err(s3_error!(NotImplemented, "only bucket/key copy sources")),
        };
        let (bucket, key) = (&input.bucket, &input.key);
        names::check_key(key).map_err(name_err)?;
        names::check_key(&from_key).map_err(name_err)?;
        let Some((source, etag, modified_ms)) =
            self.current_version(&from_bucket, &from_key).await?
        else {
            self.bucket_layout(&from_bucket).await?;
            return Err(s3_error!(
                NoSuchKey,
                "no object '{from_key}' in '{from_bucket}'"
            ));
        };
        let when = Conditions {
            if_match: input.copy_source_if_match.as_ref(),
            if_none_match: input.copy_source_if_none_match.as_ref(),
            if_modified_since: input.copy_source_if_modified_since.as_ref(),
            if_unmodified_since: input.copy_source_if_unmodified_since.as_ref(),
        };
        if conditions::evaluate(when, &etag, modified_ms) != Verdict::Proceed {
            return Err(s3_error!(
                PreconditionFailed,
                "a copy-source condition does not hold"
            ));
        }
        let replace = input
            .metadata_directive
            .as_ref()
            .is_some_and(|d| d.as_str() == MetadataDirective::REPLACE);
        if (&from_bucket, &from_key) == (bucket, key) && !replace {
            return Err(s3_error!(
                InvalidRequest,
                "copying an object onto itself needs new metadata (x-amz-metadata-directive: REPLACE)"
            ));
        }
        let layout =
            crate::ops::layout_from_headers(&req.headers, self.bucket_layout(bucket).await?)?;
        let source_meta = self.object_meta(&from_bucket, &from_key, source.id).await;
        let (content_type, metadata) = if replace {
            (input.content_type, input.metadata.unwrap_or_default())
        } else {
            let meta = source_meta.unwrap_or_else(|| ObjectMeta {
                version: FORMAT_VERSION,
                file: 0,
                etag: String::new(),
                modified_ms: 0,
                content_type: None,
                metadata: Default::default(),
            });
            (meta.content_type, meta.metadata.into_iter().collect())
        };
        let internal = |e| s3_err(e, S3ErrorCode::InternalError);
        let (pending, open) = self
            .client
            .create_pending_open(&names::object_path(bucket, key), layout.clone())
            .await
            .map_err(internal)?;
        // Synced as it is written (its commit syncs it).
        let mut open = open.sync_ahead();
        let md5 = self
            .fill_pending(&pending, &mut open, async |open: &mut OpenFile| {
                let size = self.client.size(&source).await.map_err(internal)?;
                self.copy_hashed(&source, open, size).await
            })
            .await?;
        let meta = ObjectMeta {
            version: FORMAT_VERSION,
            file: pending.file.id,
            etag: hex(&md5),
            modified_ms: crate::ops::now_ms(),
            content_type,
            metadata: metadata.into_iter().collect(),
        };
        self.commit_object((bucket, key), layout, (&pending, Some(&open)), &meta)
            .await?;
        let output = CopyObjectOutput {
            copy_object_result: Some(CopyObjectResult {
                e_tag: Some(ETag::Strong(meta.etag)),
                last_modified: Some(crate::ops::timestamp(meta.modified_ms)),
                ..CopyObjectResult::default()
            }),
            ..CopyObjectOutput::default()
        };
        Ok(S3Response::new(output))
    }

    /// Copy the first `len` bytes of `from` to the start of `to`, a chunk at a time; the
    /// MD5 of what was copied.
    async fn copy_hashed(&self, from: &File, to: &mut OpenFile, len: u64) -> S3Result<[u8; 16]> {
        let mut md5 = EtagMd5::new();
        self.copy_bytes((from, 0), (to, 0), len, Some(&mut md5))
            .await?;
        Ok(md5.finalize())
    }

    /// Copy `len` bytes of `from` at `from_at` to `to` at `to_at`, a chunk at a time (reads
    /// ahead and writes in flight overlap), hashing them into `md5` if given. Both files are
    /// looked up once. The ranges must not overlap unless `from_at >= to_at + len`.
    pub(crate) async fn copy_bytes(
        &self,
        (from, from_at): (&File, u64),
        (to, to_at): (&mut OpenFile, u64),
        len: u64,
        mut md5: Option<&mut EtagMd5>,
    ) -> S3Result<()> {
        let internal = |e| s3_err(e, S3ErrorCode::InternalError);
        let chunk = to.chunk_bytes(None);
        let source = self.client.open_id(from).await.map_err(internal)?;
        let range = from_at..from_at.saturating_add(len);
        // Each block is written from the source's answers as received (no copy into a
        // block of the gateway's).
        let blocks = self
            .client
            .read_open_blocks(source, range, chunk as usize, READ_AHEAD);
        let mut done = 0;
        let chunks = blocks.map(|block| {
            let wanted = chunk.min(len - done);
            let block = block.map_err(internal)?;
            let short = short_block(&from.path, &block, from_at + done, wanted, "copy");
            short.map_err(|detail| s3_error!(InternalError, "{detail}"))?;
            if let Some(md5) = md5.as_deref_mut() {
                md5.update_pieces(&block);
            }
            done += wanted;
            Ok(block)
        });
        match self.client.upload_stream(to, to_at, Box::pin(chunks)).await {
            Ok(_) => Ok(()),
            Err(StreamUploadError::Source(e)) => Err(e),
            Err(StreamUploadError::Store(e)) => Err(internal(e)),
        }
    }
}

/// Refuses a block of a read that holds fewer bytes than `wanted` at `at`: the file was
/// shorter than its size said (changed under the read or copy `what`).
pub(crate) fn short_block(
    path: &str,
    block: &Pieces,
    at: u64,
    wanted: u64,
    what: &str,
) -> Result<(), String> {
    if (block.len() as u64) < wanted {
        return Err(format!(
            "{path}: {} bytes at {at} where {wanted} were expected (changed under the {what}?)",
            block.len()
        ));
    }
    Ok(())
}
