//! The S3 operations: s3s parses and authenticates each request and calls these.

use crate::conditions::{self, Conditions, Verdict};
use crate::gateway::{name_err, s3_err, Gateway, SCHEME_HEADER, STRIPE_UNIT_HEADER, WIDTH_HEADER};
use crate::listing::{self, PAGE_ENTRIES_MAX};
use crate::meta::{fallback_etag, hex, BucketConfig, ObjectMeta, FORMAT_VERSION};
use crate::names;
use s3s::dto::*;
use s3s::{s3_error, S3ErrorCode, S3Request, S3Response, S3Result, S3};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tessera_client::{LayoutRequest, OpenFile, Scheme};

/// The layout asked for by a request's headers, over `base`.
pub(crate) fn layout_from_headers(
    headers: &http::HeaderMap,
    base: LayoutRequest,
) -> S3Result<LayoutRequest> {
    let get = |name: &str| -> S3Result<Option<String>> {
        headers
            .get(name)
            .map(|v| v.to_str().map(|s| s.trim().to_string()))
            .transpose()
            .map_err(|_| s3_error!(InvalidArgument, "{name} is not text"))
    };
    let mut layout = base;
    if let Some(scheme) = get(SCHEME_HEADER)? {
        layout.scheme = scheme
            .parse::<Scheme>()
            .map_err(|e| s3_error!(InvalidArgument, "{SCHEME_HEADER}: {e}"))?;
    }
    if let Some(unit) = get(STRIPE_UNIT_HEADER)? {
        layout.stripe_unit = parse_size(&unit)
            .ok_or_else(|| s3_error!(InvalidArgument, "{STRIPE_UNIT_HEADER}: bad size '{unit}'"))?;
    }
    if let Some(width) = get(WIDTH_HEADER)? {
        let width = width
            .parse::<u32>()
            .ok()
            .filter(|w| *w > 0)
            .ok_or_else(|| s3_error!(InvalidArgument, "{WIDTH_HEADER}: bad width '{width}'"))?;
        layout.width = Some(width);
    }
    Ok(layout)
}

/// A size such as `65536`, `64K`, `1M`.
fn parse_size(text: &str) -> Option<u32> {
    let digits = text.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let scale: u64 = match text[digits.len()..].to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        _ => return None,
    };
    u32::try_from(digits.parse::<u64>().ok()?.checked_mul(scale)?).ok()
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

pub(crate) fn timestamp(ms: u64) -> Timestamp {
    Timestamp::from(UNIX_EPOCH + Duration::from_millis(ms))
}

/// Percent-encoding of a key for `encoding-type=url` (everything but unreserved and `/`).
fn url_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// One listing page as S3 objects and prefixes.
struct Listed {
    objects: Vec<Object>,
    prefixes: Vec<CommonPrefix>,
    truncated: bool,
    next: Option<String>,
}

/// What one ListObjects call asks for.
struct ListQuery<'a> {
    bucket: &'a str,
    prefix: &'a str,
    delimiter: Option<&'a str>,
    after: Option<&'a str>,
    max_keys: Option<i32>,
    url: bool,
}

impl Gateway {
    async fn list_page(&self, q: ListQuery<'_>) -> S3Result<Listed> {
        self.bucket_layout(q.bucket).await?;
        let base = names::bucket_prefix(q.bucket);
        let files = self
            .client
            .list(&format!("{base}{}", q.prefix))
            .await
            .map_err(|e| s3_err(e, S3ErrorCode::NoSuchBucket))?;
        let keys: Vec<&str> = files.iter().map(|f| &f.path[base.len()..]).collect();
        let max = q.max_keys.unwrap_or(1000).clamp(0, PAGE_ENTRIES_MAX as i32) as usize;
        if max == 0 {
            let none = Listed {
                objects: vec![],
                prefixes: vec![],
                truncated: false,
                next: None,
            };
            return Ok(none);
        }
        let page = listing::page(&keys, q.prefix, q.delimiter, q.after, max);
        let encode = |s: &str| if q.url { url_encode(s) } else { s.to_string() };
        // The ETags come from the objects' metadata files, read a few at a time.
        let mut objects = Vec::with_capacity(page.objects.len());
        for batch in page.objects.chunks(16) {
            let metas = batch
                .iter()
                .map(|&i| self.object_meta(q.bucket, keys[i], files[i].id));
            let metas = futures::future::join_all(metas).await;
            for (&i, meta) in batch.iter().zip(metas) {
                objects.push(Object {
                    key: Some(encode(keys[i])),
                    size: Some(files[i].size as i64),
                    e_tag: Some(etag_of(&meta, files[i].id)),
                    last_modified: meta.map(|m| timestamp(m.modified_ms)),
                    storage_class: Some(ObjectStorageClass::from_static(
                        ObjectStorageClass::STANDARD,
                    )),
                    ..Object::default()
                });
            }
        }
        let prefixes = page
            .common_prefixes
            .iter()
            .map(|p| CommonPrefix {
                prefix: Some(encode(p)),
            })
            .collect();
        Ok(Listed {
            objects,
            prefixes,
            truncated: page.truncated,
            next: page.next_marker,
        })
    }

    /// The object's file open for transfers (one manager round trip: its size and layout
    /// come with it), or `NoSuchKey` (`NoSuchBucket` if the bucket is missing).
    async fn object_open(&self, bucket: &str, key: &str) -> S3Result<OpenFile> {
        names::check_bucket(bucket).map_err(name_err)?;
        names::check_key(key).map_err(name_err)?;
        match self
            .client
            .open_file(&names::object_path(bucket, key))
            .await
        {
            Ok(open) => Ok(open),
            Err(e) => {
                let err = s3_err(e, S3ErrorCode::NoSuchKey);
                if *err.code() == S3ErrorCode::NoSuchKey {
                    self.bucket_layout(bucket).await?;
                }
                Err(err)
            }
        }
    }
}

/// A GET's or HEAD's conditions against the object: `304` or `412` when they do not hold.
fn check_conditions(when: Conditions<'_>, meta: &Option<ObjectMeta>, file: u64) -> S3Result<()> {
    let etag = etag_of(meta, file);
    match conditions::evaluate(when, etag.value(), meta.as_ref().map(|m| m.modified_ms)) {
        Verdict::Proceed => Ok(()),
        Verdict::NotModified => Err(s3_error!(NotModified, "not modified")),
        Verdict::Failed => Err(s3_error!(PreconditionFailed, "a condition does not hold")),
    }
}

fn etag_of(meta: &Option<ObjectMeta>, file: u64) -> ETag {
    ETag::Strong(
        meta.as_ref()
            .map_or_else(|| fallback_etag(file), |m| m.etag.clone()),
    )
}

#[async_trait::async_trait]
impl S3 for Gateway {
    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        let bucket = &req.input.bucket;
        names::check_bucket(bucket).map_err(name_err)?;
        let layout = layout_from_headers(&req.headers, self.defaults.clone())?;
        let marker = names::marker_path(bucket);
        let file = match self.client.create(&marker, layout.clone()).await {
            Ok(file) => file,
            Err(tessera_client::ClientError::Metadata(tessera_wire::ManagerError::Exists(_))) => {
                return Err(s3_error!(
                    BucketAlreadyOwnedByYou,
                    "bucket '{bucket}' exists"
                ));
            }
            Err(e) => return Err(s3_err(e, S3ErrorCode::InternalError)),
        };
        let config = serde_json::to_vec(&BucketConfig::of(&layout)).expect("serializable");
        // Cut off here, the marker stays empty and the bucket takes the gateway's defaults.
        let written = async {
            self.client.write_at(&file, 0, &config).await?;
            self.client.sync(&file).await
        };
        written
            .await
            .map_err(|e| s3_err(e, S3ErrorCode::InternalError))?;
        let output = CreateBucketOutput {
            location: Some(format!("/{bucket}")),
        };
        Ok(S3Response::new(output))
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        self.bucket_layout(&req.input.bucket).await?;
        Ok(S3Response::new(HeadBucketOutput::default()))
    }

    async fn list_buckets(
        &self,
        _req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        let markers = self
            .client
            .list(names::BUCKETS_PREFIX)
            .await
            .map_err(|e| s3_err(e, S3ErrorCode::InternalError))?;
        let buckets = markers
            .iter()
            .map(|m| Bucket {
                name: Some(m.path[names::BUCKETS_PREFIX.len()..].to_string()),
                ..Bucket::default()
            })
            .collect();
        let output = ListBucketsOutput {
            buckets: Some(buckets),
            ..ListBucketsOutput::default()
        };
        Ok(S3Response::new(output))
    }

    async fn delete_bucket(
        &self,
        req: S3Request<DeleteBucketInput>,
    ) -> S3Result<S3Response<DeleteBucketOutput>> {
        let bucket = &req.input.bucket;
        self.bucket_layout(bucket).await?;
        let objects = self
            .client
            .list(&names::bucket_prefix(bucket))
            .await
            .map_err(|e| s3_err(e, S3ErrorCode::InternalError))?;
        if !objects.is_empty() {
            return Err(s3_error!(
                BucketNotEmpty,
                "bucket '{bucket}' holds {} objects",
                objects.len()
            ));
        }
        self.client
            .remove(&names::marker_path(bucket))
            .await
            .map_err(|e| s3_err(e, S3ErrorCode::NoSuchBucket))?;
        // Metadata left behind by puts cut off between their two commits.
        let meta_prefix = names::meta_path(bucket, "");
        if let Ok(leftovers) = self.client.list(&meta_prefix).await {
            for file in leftovers {
                let _ = self.client.remove(&file.path).await;
            }
        }
        Ok(S3Response::new(DeleteBucketOutput {}))
    }

    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let input = req.input;
        let (bucket, key) = (&input.bucket, &input.key);
        names::check_key(key).map_err(name_err)?;
        let layout = layout_from_headers(&req.headers, self.bucket_layout(bucket).await?)?;
        self.check_put_conditions(bucket, key, &input.if_match, &input.if_none_match)
            .await?;
        let path = names::object_path(bucket, key);
        let internal = |e| s3_err(e, S3ErrorCode::InternalError);
        // Written as a new, unnamed file and given the key only once all of it is durable: a
        // put that fails or is cut off leaves the object it replaces whole.
        let (pending, open) = self
            .client
            .create_pending_open(&path, layout.clone())
            .await
            .map_err(internal)?;
        // Synced as it is written: its commit syncs it, and would otherwise wait for all of
        // its bytes to reach the disk after the last one arrived.
        let mut open = open.sync_ahead();
        let body = input.body;
        let md5 = self
            .fill_pending(&pending, &mut open, async |open: &mut OpenFile| {
                let (size, md5) = self.write_body_at(open, 0, body).await?;
                check_body(
                    size,
                    &md5,
                    input.content_length,
                    input.content_md5.as_deref(),
                )?;
                Ok(md5)
            })
            .await?;
        let meta = ObjectMeta {
            version: FORMAT_VERSION,
            file: pending.file.id,
            etag: hex(&md5),
            modified_ms: now_ms(),
            content_type: input.content_type.clone(),
            metadata: input
                .metadata
                .clone()
                .unwrap_or_default()
                .into_iter()
                .collect(),
        };
        // Checked again just before the commit (a put racing this one may still win between
        // the check and the commit: the conditions narrow the window, they do not lock).
        let still = self
            .check_put_conditions(bucket, key, &input.if_match, &input.if_none_match)
            .await;
        if let Err(e) = still {
            let _ = self.client.abandon_pending(&pending).await;
            return Err(e);
        }
        self.commit_object((bucket, key), layout, (&pending, Some(&open)), &meta)
            .await?;
        let etag = meta.etag;
        let output = PutObjectOutput {
            e_tag: Some(ETag::Strong(etag)),
            ..PutObjectOutput::default()
        };
        Ok(S3Response::new(output))
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let input = req.input;
        let open = self.object_open(&input.bucket, &input.key).await?;
        let (file, size) = (open.file().clone(), open.size());
        let range = match &input.range {
            Some(range) => Some(range.check(size).map_err(|_| {
                s3_error!(
                    InvalidRange,
                    "the range is not satisfiable for {size} bytes"
                )
            })?),
            None => None,
        };
        let (start, end) = range.as_ref().map_or((0, size), |r| (r.start, r.end));
        let meta = self.object_meta(&input.bucket, &input.key, file.id).await;
        let when = Conditions {
            if_match: input.if_match.as_ref(),
            if_none_match: input.if_none_match.as_ref(),
            if_modified_since: input.if_modified_since.as_ref(),
            if_unmodified_since: input.if_unmodified_since.as_ref(),
        };
        check_conditions(when, &meta, file.id)?;
        let output = GetObjectOutput {
            e_tag: Some(etag_of(&meta, file.id)),
            content_length: Some((end - start) as i64),
            content_range: range.map(|r| format!("bytes {}-{}/{size}", r.start, r.end - 1)),
            accept_ranges: Some("bytes".into()),
            last_modified: meta.as_ref().map(|m| timestamp(m.modified_ms)),
            content_type: meta.as_ref().and_then(|m| m.content_type.clone()),
            metadata: meta.map(|m| m.metadata.into_iter().collect()),
            body: Some(self.read_body(open, start, end)),
            ..GetObjectOutput::default()
        };
        Ok(S3Response::new(output))
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let input = req.input;
        let open = self.object_open(&input.bucket, &input.key).await?;
        let (file, size) = (open.file(), open.size());
        let meta = self.object_meta(&input.bucket, &input.key, file.id).await;
        let when = Conditions {
            if_match: input.if_match.as_ref(),
            if_none_match: input.if_none_match.as_ref(),
            if_modified_since: input.if_modified_since.as_ref(),
            if_unmodified_since: input.if_unmodified_since.as_ref(),
        };
        check_conditions(when, &meta, file.id)?;
        let output = HeadObjectOutput {
            e_tag: Some(etag_of(&meta, file.id)),
            content_length: Some(size as i64),
            accept_ranges: Some("bytes".into()),
            last_modified: meta.as_ref().map(|m| timestamp(m.modified_ms)),
            content_type: meta.as_ref().and_then(|m| m.content_type.clone()),
            metadata: meta.map(|m| m.metadata.into_iter().collect()),
            ..HeadObjectOutput::default()
        };
        Ok(S3Response::new(output))
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        let (bucket, key) = (&req.input.bucket, &req.input.key);
        names::check_key(key).map_err(name_err)?;
        self.bucket_layout(bucket).await?;
        // S3 answers a delete of a missing key with success too.
        for path in [
            names::object_path(bucket, key),
            names::meta_path(bucket, key),
        ] {
            match self.client.remove(&path).await {
                Ok(())
                | Err(tessera_client::ClientError::Metadata(
                    tessera_wire::ManagerError::NotFound(_),
                )) => {}
                Err(e) => return Err(s3_err(e, S3ErrorCode::InternalError)),
            }
        }
        Ok(S3Response::new(DeleteObjectOutput::default()))
    }

    async fn copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        self.copy_object_impl(req).await
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        self.create_multipart(req).await
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        Gateway::upload_part(self, req).await
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        self.complete_multipart(req).await
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        self.abort_multipart(req).await
    }

    async fn list_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        self.list_parts_of(req).await
    }

    async fn list_multipart_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        self.list_uploads(req).await
    }

    async fn list_objects(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        let input = req.input;
        let prefix = input.prefix.clone().unwrap_or_default();
        let url = input
            .encoding_type
            .as_ref()
            .is_some_and(|e| e.as_str() == EncodingType::URL);
        let listed = self
            .list_page(ListQuery {
                bucket: &input.bucket,
                prefix: &prefix,
                delimiter: input.delimiter.as_deref(),
                after: input.marker.as_deref(),
                max_keys: input.max_keys,
                url,
            })
            .await?;
        // NextMarker is only sent with a delimiter (without one, clients use the last key).
        let next_marker = listed.next.filter(|_| input.delimiter.is_some());
        let output = ListObjectsOutput {
            name: Some(input.bucket),
            prefix: Some(prefix),
            marker: input.marker,
            max_keys: Some(input.max_keys.unwrap_or(1000)),
            is_truncated: Some(listed.truncated),
            contents: Some(listed.objects),
            common_prefixes: Some(listed.prefixes),
            delimiter: input.delimiter,
            next_marker,
            encoding_type: input.encoding_type.filter(|_| url),
            ..ListObjectsOutput::default()
        };
        Ok(S3Response::new(output))
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        let input = req.input;
        let prefix = input.prefix.clone().unwrap_or_default();
        let url = input
            .encoding_type
            .as_ref()
            .is_some_and(|e| e.as_str() == EncodingType::URL);
        // The continuation token is the last entry of the page before, in hex.
        let after = match &input.continuation_token {
            Some(token) => Some(unhex(token).ok_or_else(|| {
                s3_error!(
                    InvalidArgument,
                    "the continuation token is not one this gateway gave"
                )
            })?),
            None => input.start_after.clone(),
        };
        let listed = self
            .list_page(ListQuery {
                bucket: &input.bucket,
                prefix: &prefix,
                delimiter: input.delimiter.as_deref(),
                after: after.as_deref(),
                max_keys: input.max_keys,
                url,
            })
            .await?;
        let output = ListObjectsV2Output {
            name: Some(input.bucket),
            prefix: Some(prefix),
            max_keys: Some(input.max_keys.unwrap_or(1000)),
            key_count: Some((listed.objects.len() + listed.prefixes.len()) as i32),
            continuation_token: input.continuation_token,
            is_truncated: Some(listed.truncated),
            next_continuation_token: listed.next.map(|n| hex(n.as_bytes())),
            contents: Some(listed.objects),
            common_prefixes: Some(listed.prefixes),
            delimiter: input.delimiter,
            encoding_type: input.encoding_type.filter(|_| url),
            start_after: input.start_after,
            ..ListObjectsV2Output::default()
        };
        Ok(S3Response::new(output))
    }
}

/// The body's length and MD5 against the request's Content-Length and Content-MD5.
pub(crate) fn check_body(
    size: u64,
    md5: &[u8; 16],
    length: Option<i64>,
    content_md5: Option<&str>,
) -> S3Result<()> {
    if let Some(length) = length {
        if length != size as i64 {
            return Err(s3_error!(
                IncompleteBody,
                "the body has {size} bytes; Content-Length said {length}"
            ));
        }
    }
    if let Some(given) = content_md5 {
        let ours = base64_simd::STANDARD.encode_to_string(md5);
        if given.trim() != ours {
            return Err(s3_error!(
                BadDigest,
                "Content-MD5 {given} does not match the body's {ours}"
            ));
        }
    }
    Ok(())
}

fn unhex(text: &str) -> Option<String> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_tokens() {
        assert_eq!(parse_size("65536"), Some(65536));
        assert_eq!(parse_size("64K"), Some(65536));
        assert_eq!(parse_size("1m"), Some(1 << 20));
        assert_eq!(parse_size("8G"), None);
        assert_eq!(parse_size("99999999999"), None);
        assert_eq!(parse_size("K"), None);
        assert_eq!(unhex(&hex("a/b ü".as_bytes())).as_deref(), Some("a/b ü"));
        assert_eq!(unhex("zz"), None);
        assert_eq!(unhex("abc"), None);
        assert_eq!(url_encode("a b/ü"), "a%20b/%C3%BC");
    }

    #[test]
    fn layout_headers_override_and_refuse_nonsense() {
        let base = LayoutRequest {
            scheme: Scheme::Hybrid,
            stripe_unit: 65536,
            width: None,
        };
        let mut headers = http::HeaderMap::new();
        headers.insert(SCHEME_HEADER, "raid5".parse().unwrap());
        headers.insert(STRIPE_UNIT_HEADER, "16K".parse().unwrap());
        headers.insert(WIDTH_HEADER, "3".parse().unwrap());
        let layout = layout_from_headers(&headers, base.clone()).unwrap();
        assert_eq!(
            layout,
            LayoutRequest {
                scheme: Scheme::Raid5,
                stripe_unit: 16384,
                width: Some(3)
            }
        );
        headers.insert(WIDTH_HEADER, "0".parse().unwrap());
        let err = layout_from_headers(&headers, base.clone()).unwrap_err();
        assert_eq!(*err.code(), S3ErrorCode::InvalidArgument);
        headers.insert(WIDTH_HEADER, "2".parse().unwrap());
        headers.insert(SCHEME_HEADER, "raid9".parse().unwrap());
        let err = layout_from_headers(&headers, base).unwrap_err();
        assert_eq!(*err.code(), S3ErrorCode::InvalidArgument);
    }

    #[test]
    fn body_checks() {
        use md5::Digest;
        let md5: [u8; 16] = md5::Md5::digest(b"abc").into();
        assert!(check_body(3, &md5, Some(3), Some("kAFQmDzST7DWlj99KOF/cg==")).is_ok());
        let short = check_body(2, &md5, Some(3), None).unwrap_err();
        assert_eq!(*short.code(), S3ErrorCode::IncompleteBody);
        let bad = check_body(3, &md5, None, Some("AAAAAAAAAAAAAAAAAAAAAA==")).unwrap_err();
        assert_eq!(*bad.code(), S3ErrorCode::BadDigest);
    }
}
