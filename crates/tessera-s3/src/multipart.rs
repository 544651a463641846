//! Multipart uploads, with the parts written straight into the striped file of the object.
//!
//! An upload is a pending file (see `Client::create_pending`) that takes the key at
//! CompleteMultipartUpload, as a put's does. Clients send every part but the last at one size,
//! so the first part of at least [`PART_BYTES_MIN`] to arrive fixes the upload's *part size*
//! `P`, and every later part of exactly `P` bytes is written in place, at `(n - 1) * P` of the
//! pending file: completing such an upload copies at most the last part (which is shorter) and
//! sets the size. A part of any other size goes to a side file of its own; completing an upload
//! whose parts do not line up (other sizes, gaps in the numbers) copies every part into a new
//! file, in order: slower, never wrong.
//!
//! Records under `.s3/uploads/B/ID/` (JSON with a format version, written as pending files
//! and committed, so a record is replaced whole): `upload` (key, pending file, layout, content
//! type, user metadata), `part/NNNNN` (size, MD5, where the bytes are), and the side files
//! `side/NNNNN.T`. A part's bytes are synced before its record is committed, so a listed part
//! is a durable part. The gateway renews the pending files of every upload it finds every
//! [`RENEW_EVERY`] (also those of a gateway that ran before it); an upload whose pending file
//! is gone (its lease ran out while no gateway ran, or it completed and the gateway died before
//! it removed the records) has its records removed by the same sweep.
//!
//! Two gateways writing parts of one upload at once may each fix a part size; the parts then
//! do not line up and completion takes the copying path.

use crate::gateway::{name_err, s3_err, Gateway};
use crate::meta::{hex, BucketConfig, ObjectMeta, FORMAT_VERSION};
use crate::names;
use md5::{Digest, Md5};
use s3s::dto::*;
use s3s::{s3_error, S3Error, S3ErrorCode, S3Request, S3Response, S3Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;
use tessera_client::{ClientError, File, LayoutRequest, PendingFile};
use tessera_wire::ManagerError;

/// Where upload records live.
pub const UPLOADS_PREFIX: &str = ".s3/uploads/";
/// Smallest part but the last (S3's rule).
pub const PART_BYTES_MIN: u64 = 5 << 20;
/// Largest part (S3's rule).
pub const PART_BYTES_MAX: u64 = 5 << 30;
/// Highest part number (S3's rule).
pub const PART_NUMBER_MAX: i32 = 10_000;
/// How often the gateway renews the pending files of open uploads (their lease is a minute
/// by default).
pub const RENEW_EVERY: Duration = Duration::from_secs(10);

/// An upload's record.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct UploadRecord {
    version: u32,
    key: String,
    /// The pending file that becomes the object.
    file: u64,
    layout: BucketConfig,
    initiated_ms: u64,
    content_type: Option<String>,
    metadata: BTreeMap<String, String>,
}

/// Where a part's bytes are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
enum Place {
    /// In the upload's pending file, at this offset.
    InPlace { offset: u64 },
    /// In a side file of its own.
    Side { path: String },
}

/// A part's record.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct PartRecord {
    version: u32,
    part: i32,
    size: u64,
    /// MD5 of the part, hex.
    etag: String,
    modified_ms: u64,
    place: Place,
}

fn upload_dir(bucket: &str, id: &str) -> String {
    format!("{UPLOADS_PREFIX}{bucket}/{id}/")
}

fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8], what: &str) -> S3Result<T> {
    let value: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| s3_error!(InternalError, "{what} is damaged: {e}"))?;
    if value.get("version").and_then(|v| v.as_u64()) != Some(u64::from(FORMAT_VERSION)) {
        return Err(s3_error!(
            InternalError,
            "{what} has another format version"
        ));
    }
    serde_json::from_value(value).map_err(|e| s3_error!(InternalError, "{what} is damaged: {e}"))
}

/// An upload id: the pending file's id and 64 random bits, in hex (only ids this gateway gave
/// parse, so a made-up id never names a record path).
fn new_upload_id(file: u64) -> String {
    format!("{file:016x}{:016x}", rand::random::<u64>())
}

fn check_upload_id(id: &str) -> S3Result<()> {
    if id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(())
    } else {
        Err(s3_error!(NoSuchUpload, "no upload '{id}'"))
    }
}

fn internal(e: ClientError) -> S3Error {
    s3_err(e, S3ErrorCode::InternalError)
}

fn etag_value(etag: &ETag) -> &str {
    etag.value().trim_matches('"')
}

/// The S3 multipart ETag: the MD5 of the parts' MD5s, and their count.
fn multipart_etag(parts: &[&PartRecord]) -> S3Result<String> {
    let mut md5 = Md5::new();
    for part in parts {
        let digest = (0..part.etag.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(part.etag.get(i..i + 2).unwrap_or("zz"), 16))
            .collect::<Result<Vec<u8>, _>>()
            .map_err(|_| s3_error!(InternalError, "part {} has a damaged ETag", part.part))?;
        md5.update(&digest);
    }
    Ok(format!("{}-{}", hex(&md5.finalize()), parts.len()))
}

impl Gateway {
    async fn load_upload(&self, bucket: &str, key: &str, id: &str) -> S3Result<UploadRecord> {
        names::check_bucket(bucket).map_err(name_err)?;
        check_upload_id(id)?;
        let path = format!("{}upload", upload_dir(bucket, id));
        let bytes = self.read_record(&path).await.map_err(internal)?;
        let record: UploadRecord = match bytes {
            Some(bytes) => decode(&bytes, "the upload's record")?,
            None => return Err(s3_error!(NoSuchUpload, "no upload '{id}'")),
        };
        if record.key != key {
            return Err(s3_error!(
                NoSuchUpload,
                "upload '{id}' is not of key '{key}'"
            ));
        }
        Ok(record)
    }

    async fn load_parts(&self, bucket: &str, id: &str) -> S3Result<BTreeMap<i32, PartRecord>> {
        let prefix = format!("{}part/", upload_dir(bucket, id));
        let files = self.client.list(&prefix).await.map_err(internal)?;
        let mut parts = BTreeMap::new();
        for file in files {
            if let Some(bytes) = self.read_record(&file.path).await.map_err(internal)? {
                let part: PartRecord = decode(&bytes, &file.path)?;
                parts.insert(part.part, part);
            }
        }
        Ok(parts)
    }

    /// Write `bytes` as the record at `path`, replacing any record there.
    async fn put_record(&self, path: &str, bytes: &[u8]) -> Result<(), ClientError> {
        let layout = LayoutRequest {
            scheme: tessera_client::Scheme::Raid1,
            ..self.defaults.clone()
        };
        let (pending, open) = self.write_pending_record(path, layout, bytes).await?;
        if let Err(e) = self.client.commit_upload(&open).await {
            let _ = self.client.abandon_pending(&pending).await;
            return Err(e);
        }
        Ok(())
    }

    /// Remove every file of an upload (records and side files).
    async fn remove_upload_files(&self, bucket: &str, id: &str) {
        let dir = upload_dir(bucket, id);
        let files = match self.client.list(&dir).await {
            Ok(files) => files,
            Err(e) => return tracing::warn!("{dir}: cannot list to remove: {e}"),
        };
        // The upload record last: while it is there, a sweep finds the rest.
        let (record, rest): (Vec<_>, Vec<_>) =
            files.into_iter().partition(|f| f.path.ends_with("/upload"));
        for file in rest.into_iter().chain(record) {
            if let Err(e) = self.client.remove(&file.path).await {
                tracing::warn!("{}: cannot remove: {e}", file.path);
            }
        }
    }

    /// Where part `number` of `size` bytes goes: in place when it has the upload's part size
    /// (which the first part of at least [`PART_BYTES_MIN`] fixes), else a side file.
    async fn place_part(
        &self,
        bucket: &str,
        id: &str,
        number: i32,
        size: Option<u64>,
    ) -> S3Result<Place> {
        let side = || Place::Side {
            path: format!(
                "{}side/{number:05}.{:016x}",
                upload_dir(bucket, id),
                rand::random::<u64>()
            ),
        };
        let Some(size) = size.filter(|s| *s >= PART_BYTES_MIN) else {
            return Ok(side());
        };
        let mut sizes = self.part_sizes.lock().await;
        let part_size = match sizes.get(id) {
            Some(p) => *p,
            None => {
                // After a restart, the parts already in place say what the size is.
                let known = self
                    .load_parts(bucket, id)
                    .await?
                    .into_values()
                    .find_map(|p| matches!(p.place, Place::InPlace { .. }).then_some(p.size));
                *sizes.entry(id.to_string()).or_insert(known.unwrap_or(size))
            }
        };
        let offset = u64::try_from(number - 1)
            .ok()
            .and_then(|n| n.checked_mul(part_size));
        match offset {
            Some(offset) if size == part_size => Ok(Place::InPlace { offset }),
            _ => Ok(side()),
        }
    }
}

/// The parts a completion names, checked against the stored ones: ascending numbers, known
/// parts with their ETags, every part but the last at least [`PART_BYTES_MIN`].
fn chosen_parts<'a>(
    wanted: &[CompletedPart],
    stored: &'a BTreeMap<i32, PartRecord>,
) -> S3Result<Vec<&'a PartRecord>> {
    if wanted.is_empty() {
        return Err(s3_error!(MalformedXML, "the completion names no parts"));
    }
    let mut chosen: Vec<&PartRecord> = Vec::with_capacity(wanted.len());
    for part in wanted {
        let number = part.part_number.unwrap_or(0);
        if chosen.last().is_some_and(|p| p.part >= number) {
            return Err(s3_error!(
                InvalidPartOrder,
                "parts must be listed in ascending order"
            ));
        }
        let record = stored
            .get(&number)
            .ok_or_else(|| s3_error!(InvalidPart, "part {number} was not uploaded"))?;
        if let Some(etag) = &part.e_tag {
            if etag_value(etag) != record.etag {
                return Err(s3_error!(InvalidPart, "part {number}: the ETag differs"));
            }
        }
        chosen.push(record);
    }
    if let Some(small) = chosen[..chosen.len() - 1]
        .iter()
        .find(|p| p.size < PART_BYTES_MIN)
    {
        return Err(s3_error!(
            EntityTooSmall,
            "part {} has {} bytes; every part but the last needs at least {PART_BYTES_MIN}",
            small.part,
            small.size
        ));
    }
    Ok(chosen)
}

/// Whether the chosen parts already lie end to end in the pending file (all but the last in
/// place, numbered 1, 2, ... at multiples of one part size).
fn lined_up(parts: &[&PartRecord]) -> bool {
    let part_size = parts[0].size;
    parts[..parts.len() - 1].iter().enumerate().all(|(i, p)| {
        p.part == i as i32 + 1
            && p.size == part_size
            && p.place
                == Place::InPlace {
                    offset: i as u64 * part_size,
                }
    }) && parts.last().is_some_and(|p| p.part == parts.len() as i32)
}

impl Gateway {
    pub(crate) async fn create_multipart(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let input = req.input;
        let (bucket, key) = (&input.bucket, &input.key);
        names::check_key(key).map_err(name_err)?;
        let layout =
            crate::ops::layout_from_headers(&req.headers, self.bucket_layout(bucket).await?)?;
        let path = names::object_path(bucket, key);
        let pending = self
            .client
            .create_pending(&path, layout.clone())
            .await
            .map_err(internal)?;
        let id = new_upload_id(pending.file.id);
        let record = UploadRecord {
            version: FORMAT_VERSION,
            key: key.clone(),
            file: pending.file.id,
            layout: BucketConfig::of(&layout),
            initiated_ms: crate::ops::now_ms(),
            content_type: input.content_type,
            metadata: input.metadata.unwrap_or_default().into_iter().collect(),
        };
        let bytes = serde_json::to_vec(&record).expect("serializable");
        let path = format!("{}upload", upload_dir(bucket, &id));
        if let Err(e) = self.put_record(&path, &bytes).await {
            let _ = self.client.abandon_pending(&pending).await;
            return Err(internal(e));
        }
        let output = CreateMultipartUploadOutput {
            bucket: Some(bucket.clone()),
            key: Some(key.clone()),
            upload_id: Some(id),
            ..CreateMultipartUploadOutput::default()
        };
        Ok(S3Response::new(output))
    }

    pub(crate) async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        let input = req.input;
        let (bucket, id, number) = (&input.bucket, &input.upload_id, input.part_number);
        if !(1..=PART_NUMBER_MAX).contains(&number) {
            return Err(s3_error!(
                InvalidArgument,
                "part number {number}: must be 1 to {PART_NUMBER_MAX}"
            ));
        }
        let length = input.content_length.map(|l| l.max(0) as u64);
        if length.is_some_and(|l| l > PART_BYTES_MAX) {
            return Err(s3_error!(EntityTooLarge, "a part holds at most 5 GiB"));
        }
        let upload = self.load_upload(bucket, &input.key, id).await?;
        let place = self.place_part(bucket, id, number, length).await?;
        let target = match &place {
            Place::InPlace { .. } => File {
                id: upload.file,
                path: names::object_path(bucket, &upload.key),
            },
            Place::Side { path } => {
                let layout = upload
                    .layout
                    .layout()
                    .map_err(|e| s3_error!(InternalError, "{e}"))?;
                self.client.create(path, layout).await.map_err(internal)?
            }
        };
        let base = match place {
            Place::InPlace { offset } => offset,
            Place::Side { .. } => 0,
        };
        let stored = async {
            // Synced as it is written (the part is synced before its record is kept).
            let open = self.client.open_id(&target).await.map_err(internal)?;
            let mut open = open.sync_ahead();
            let (size, md5) = self.write_body_at(&mut open, base, input.body).await?;
            crate::ops::check_body(
                size,
                &md5,
                input.content_length,
                input.content_md5.as_deref(),
            )?;
            self.client.sync_open(&mut open).await.map_err(internal)?;
            Ok::<_, S3Error>((size, md5))
        };
        let (size, md5) = match stored.await {
            Ok(done) => done,
            Err(e) => {
                if let Place::Side { path } = &place {
                    let _ = self.client.remove(path).await;
                }
                return Err(e);
            }
        };
        // The record this part replaces, if any (one record read, not the upload's every one).
        let path = format!("{}part/{number:05}", upload_dir(bucket, id));
        let old: Option<PartRecord> = match self.read_record(&path).await.map_err(internal)? {
            Some(bytes) => Some(decode(&bytes, &path)?),
            None => None,
        };
        let record = PartRecord {
            version: FORMAT_VERSION,
            part: number,
            size,
            etag: hex(&md5),
            modified_ms: crate::ops::now_ms(),
            place,
        };
        let bytes = serde_json::to_vec(&record).expect("serializable");
        self.put_record(&path, &bytes).await.map_err(internal)?;
        if let Some(PartRecord {
            place: Place::Side { path },
            ..
        }) = old
        {
            let _ = self.client.remove(&path).await;
        }
        let output = UploadPartOutput {
            e_tag: Some(ETag::Strong(record.etag)),
            ..UploadPartOutput::default()
        };
        Ok(S3Response::new(output))
    }

    pub(crate) async fn complete_multipart(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let input = req.input;
        let (bucket, key, id) = (&input.bucket, &input.key, &input.upload_id);
        let upload = self.load_upload(bucket, key, id).await?;
        let stored = self.load_parts(bucket, id).await?;
        let wanted = input
            .multipart_upload
            .and_then(|m| m.parts)
            .unwrap_or_default();
        let parts = chosen_parts(&wanted, &stored)?;
        let etag = multipart_etag(&parts)?;
        let path = names::object_path(bucket, key);
        let pending = self.upload_pending(&upload, &path).await?;
        let object = self.assemble(bucket, &upload, &pending, &parts).await?;
        let meta = ObjectMeta {
            version: FORMAT_VERSION,
            file: object.file.id,
            etag: etag.clone(),
            modified_ms: crate::ops::now_ms(),
            content_type: upload.content_type.clone(),
            metadata: upload.metadata.clone(),
        };
        let layout = upload
            .layout
            .layout()
            .map_err(|e| s3_error!(InternalError, "{e}"))?;
        self.commit_object((bucket, key), layout, (&object, None), &meta)
            .await?;
        if object.file.id != pending.file.id {
            let _ = self.client.abandon_pending(&pending).await;
        }
        self.part_sizes.lock().await.remove(id.as_str());
        self.remove_upload_files(bucket, id).await;
        let output = CompleteMultipartUploadOutput {
            bucket: Some(bucket.clone()),
            key: Some(key.clone()),
            e_tag: Some(ETag::Strong(etag)),
            location: Some(format!("/{bucket}/{key}")),
            ..CompleteMultipartUploadOutput::default()
        };
        Ok(S3Response::new(output))
    }

    /// The upload's pending file, still pending (else the upload is over).
    async fn upload_pending(&self, upload: &UploadRecord, path: &str) -> S3Result<PendingFile> {
        let file = File {
            id: upload.file,
            path: path.to_string(),
        };
        match self.client.renew_pending(&file).await {
            Ok(()) => {}
            Err(ClientError::Metadata(ManagerError::NotPending(_) | ManagerError::NotFound(_))) => {
                return Err(s3_error!(
                    NoSuchUpload,
                    "the upload's file is gone (its lease ran out?)"
                ));
            }
            Err(e) => return Err(internal(e)),
        }
        let meta = self.client.meta(&file).await.map_err(internal)?;
        Ok(PendingFile {
            file,
            meta,
            lease: Duration::from_secs(60),
        })
    }

    /// The file holding the parts end to end, synced: the upload's own when they line up
    /// (the last part copied into place if it is elsewhere), else a new one they are copied
    /// into.
    async fn assemble(
        &self,
        bucket: &str,
        upload: &UploadRecord,
        pending: &PendingFile,
        parts: &[&PartRecord],
    ) -> S3Result<PendingFile> {
        let source = |p: &PartRecord| match &p.place {
            Place::InPlace { offset } => (pending.file.clone(), *offset),
            Place::Side { path } => (
                File {
                    id: 0,
                    path: path.clone(),
                },
                0,
            ),
        };
        let total: u64 = parts.iter().map(|p| p.size).sum();
        let copied = if lined_up(parts) {
            let last = parts[parts.len() - 1];
            let at = (parts.len() as u64 - 1) * parts[0].size;
            if last.place != (Place::InPlace { offset: at }) {
                let (from, from_at) = self.resolve(source(last)).await?;
                let mut to = self.client.open_id(&pending.file).await.map_err(internal)?;
                self.copy_bytes((&from, from_at), (&mut to, at), last.size, None)
                    .await?;
            }
            pending.clone()
        } else {
            let layout = upload
                .layout
                .layout()
                .map_err(|e| s3_error!(InternalError, "{e}"))?;
            let (target, to) = self
                .client
                .create_pending_open(&names::object_path(bucket, &upload.key), layout)
                .await
                .map_err(internal)?;
            // Synced as it is written (its commit syncs it).
            let mut to = to.sync_ahead();
            let mut at = 0;
            for part in parts {
                let (from, from_at) = self.resolve(source(part)).await?;
                let copied = self
                    .copy_bytes((&from, from_at), (&mut to, at), part.size, None)
                    .await;
                if let Err(e) = copied {
                    let _ = self.client.abandon_pending(&target).await;
                    return Err(e);
                }
                at += part.size;
            }
            target
        };
        self.client
            .set_size(&copied.file, total)
            .await
            .map_err(internal)?;
        self.client.sync(&copied.file).await.map_err(internal)?;
        Ok(copied)
    }

    /// A part's source with its file opened (side files are known by path).
    async fn resolve(&self, (file, at): (File, u64)) -> S3Result<(File, u64)> {
        if file.id != 0 {
            return Ok((file, at));
        }
        let opened = self.client.open(&file.path).await.map_err(|e| {
            S3Error::with_message(S3ErrorCode::InvalidPart, format!("{}: {e}", file.path))
        })?;
        Ok((opened, at))
    }

    pub(crate) async fn abort_multipart(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let input = req.input;
        let (bucket, key, id) = (&input.bucket, &input.key, &input.upload_id);
        let upload = self.load_upload(bucket, key, id).await?;
        let path = names::object_path(bucket, key);
        if let Ok(pending) = self.upload_pending(&upload, &path).await {
            self.client
                .abandon_pending(&pending)
                .await
                .map_err(internal)?;
        }
        self.part_sizes.lock().await.remove(id.as_str());
        self.remove_upload_files(bucket, id).await;
        Ok(S3Response::new(AbortMultipartUploadOutput::default()))
    }

    pub(crate) async fn list_parts_of(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        let input = req.input;
        let (bucket, key, id) = (&input.bucket, &input.key, &input.upload_id);
        self.load_upload(bucket, key, id).await?;
        let after = input.part_number_marker.unwrap_or(0);
        let max = input.max_parts.unwrap_or(1000).clamp(1, 1000) as usize;
        let stored = self.load_parts(bucket, id).await?;
        let mut later = stored.range(after.saturating_add(1)..).map(|(_, p)| p);
        let page: Vec<&PartRecord> = later.by_ref().take(max).collect();
        let truncated = later.next().is_some();
        let parts = page
            .iter()
            .map(|p| Part {
                part_number: Some(p.part),
                size: Some(p.size as i64),
                e_tag: Some(ETag::Strong(p.etag.clone())),
                last_modified: Some(crate::ops::timestamp(p.modified_ms)),
                ..Part::default()
            })
            .collect();
        let output = ListPartsOutput {
            bucket: Some(bucket.clone()),
            key: Some(key.clone()),
            upload_id: Some(id.clone()),
            is_truncated: Some(truncated),
            max_parts: Some(max as i32),
            part_number_marker: input.part_number_marker,
            next_part_number_marker: page.last().map(|p| p.part),
            parts: Some(parts),
            ..ListPartsOutput::default()
        };
        Ok(S3Response::new(output))
    }

    pub(crate) async fn list_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        let input = req.input;
        let bucket = &input.bucket;
        self.bucket_layout(bucket).await?;
        let prefix = input.prefix.clone().unwrap_or_default();
        let dir = format!("{UPLOADS_PREFIX}{bucket}/");
        let files = self.client.list(&dir).await.map_err(internal)?;
        let mut uploads = Vec::new();
        for file in files.iter().filter(|f| f.path.ends_with("/upload")) {
            let id = file.path[dir.len()..].trim_end_matches("/upload");
            let Some(bytes) = self.read_record(&file.path).await.map_err(internal)? else {
                continue;
            };
            let record: UploadRecord = decode(&bytes, &file.path)?;
            if record.key.starts_with(&prefix) {
                uploads.push(MultipartUpload {
                    key: Some(record.key),
                    upload_id: Some(id.to_string()),
                    initiated: Some(crate::ops::timestamp(record.initiated_ms)),
                    ..MultipartUpload::default()
                });
            }
        }
        uploads.sort_by(|a, b| (&a.key, &a.upload_id).cmp(&(&b.key, &b.upload_id)));
        uploads.truncate(input.max_uploads.unwrap_or(1000).clamp(1, 1000) as usize);
        let output = ListMultipartUploadsOutput {
            bucket: Some(bucket.clone()),
            prefix: input.prefix,
            is_truncated: Some(false),
            uploads: Some(uploads),
            ..ListMultipartUploadsOutput::default()
        };
        Ok(S3Response::new(output))
    }

    /// Renew the pending file of every upload on record, and remove the records of uploads
    /// whose file is gone. Runs every [`RENEW_EVERY`] while the gateway serves.
    pub(crate) async fn sweep_uploads(&self) {
        let records = match self.client.list(UPLOADS_PREFIX).await {
            Ok(files) => files,
            Err(e) => return tracing::warn!("cannot list multipart uploads: {e}"),
        };
        for record in records.iter().filter(|f| f.path.ends_with("/upload")) {
            let Some((bucket, id)) = record.path[UPLOADS_PREFIX.len()..]
                .trim_end_matches("/upload")
                .split_once('/')
            else {
                continue;
            };
            let upload = match self.read_record(&record.path).await {
                Ok(Some(bytes)) => decode::<UploadRecord>(&bytes, &record.path),
                _ => continue,
            };
            let Ok(upload) = upload else { continue };
            let file = File {
                id: upload.file,
                path: names::object_path(bucket, &upload.key),
            };
            match self.client.renew_pending(&file).await {
                Ok(()) => {}
                Err(ClientError::Metadata(
                    ManagerError::NotPending(_) | ManagerError::NotFound(_),
                )) => {
                    tracing::info!(
                        "multipart upload {id} of {bucket}/{}: over; records removed",
                        upload.key
                    );
                    self.remove_upload_files(bucket, id).await;
                }
                Err(e) => tracing::warn!("cannot renew multipart upload {id}: {e}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(part: i32, size: u64, place: Place) -> PartRecord {
        PartRecord {
            version: FORMAT_VERSION,
            part,
            size,
            etag: hex(&Md5::digest(part.to_le_bytes())),
            modified_ms: 0,
            place,
        }
    }

    fn side() -> Place {
        Place::Side { path: "s".into() }
    }

    #[test]
    fn parts_line_up_only_end_to_end_from_one() {
        let p = PART_BYTES_MIN;
        let at = |i: u64| Place::InPlace { offset: i * p };
        let (a, b, c) = (part(1, p, at(0)), part(2, p, at(1)), part(3, 10, side()));
        assert!(lined_up(&[&a, &b, &c]));
        assert!(lined_up(&[&a]));
        assert!(lined_up(&[&c.clone()]) == (c.part == 1));
        // A gap, a part elsewhere, or other sizes: copied.
        assert!(!lined_up(&[&a, &c]));
        assert!(!lined_up(&[&a, &part(2, p, side()), &c]));
        assert!(!lined_up(&[&part(1, p + 1, at(0)), &b, &c]));
        assert!(!lined_up(&[&b, &c]));
    }

    #[test]
    fn completions_are_checked() {
        let p = PART_BYTES_MIN;
        let stored: BTreeMap<i32, PartRecord> = [
            part(1, p, Place::InPlace { offset: 0 }),
            part(2, 10, side()),
            part(3, 10, side()),
        ]
        .into_iter()
        .map(|r| (r.part, r))
        .collect();
        let named = |n: i32, etag: Option<&str>| CompletedPart {
            part_number: Some(n),
            e_tag: etag.map(|e| ETag::Strong(e.to_string())),
            ..CompletedPart::default()
        };
        let good = [named(1, Some(&stored[&1].etag)), named(2, None)];
        assert_eq!(chosen_parts(&good, &stored).unwrap().len(), 2);
        let code =
            |parts: &[CompletedPart]| chosen_parts(parts, &stored).unwrap_err().code().clone();
        assert_eq!(code(&[]), S3ErrorCode::MalformedXML);
        assert_eq!(
            code(&[named(2, None), named(1, None)]),
            S3ErrorCode::InvalidPartOrder
        );
        assert_eq!(
            code(&[named(1, None), named(4, None)]),
            S3ErrorCode::InvalidPart
        );
        assert_eq!(code(&[named(1, Some("00"))]), S3ErrorCode::InvalidPart);
        assert_eq!(
            code(&[named(2, None), named(3, None)]),
            S3ErrorCode::EntityTooSmall
        );
    }

    #[test]
    fn multipart_etag_is_s3s() {
        // S3's rule: MD5 of the concatenated binary MD5s, a dash, the count.
        let a = part(1, 1, side());
        let b = part(2, 1, side());
        let mut md5 = Md5::new();
        md5.update(Md5::digest(1i32.to_le_bytes()));
        md5.update(Md5::digest(2i32.to_le_bytes()));
        assert_eq!(
            multipart_etag(&[&a, &b]).unwrap(),
            format!("{}-2", hex(&md5.finalize()))
        );
        assert!(check_upload_id("../../etc").is_err());
        assert!(check_upload_id(&new_upload_id(7)).is_ok());
    }
}
