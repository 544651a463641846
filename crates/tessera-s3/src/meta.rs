//! What the gateway stores beside the data: a bucket's layout defaults (in its marker file)
//! and an object's metadata (ETag, time, content type, user metadata), each a small JSON
//! file carrying a format version.
//!
//! Format version 1:
//! - bucket marker `.s3/buckets/B`: `{"version":1,"scheme":"hybrid","stripe_unit":65536,
//!   "width":null}`; an empty marker (a create whose config write was cut off) means the
//!   gateway's defaults.
//! - object metadata `.s3/meta/B/KEY`: `{"version":1,"file":ID,"etag":"…","modified_ms":…,
//!   "content_type":…,"metadata":{…}}`. `file` is the id of the object's file it describes:
//!   the data and its metadata are committed one after the other, so after a crash between the
//!   two the metadata may describe an older file; it is then ignored (the ETag falls back to one
//!   made from the file id, see [`fallback_etag`]).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use tessera_client::{LayoutRequest, Scheme};

/// The format version written.
pub const FORMAT_VERSION: u32 = 1;

/// Why a stored gateway record cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    /// Not JSON of the expected shape.
    #[error("malformed gateway record: {0}")]
    Malformed(#[from] serde_json::Error),
    /// Written by a newer gateway.
    #[error("gateway record of format version {0}; this gateway reads version {FORMAT_VERSION}")]
    Version(u32),
    /// A scheme name that is not one.
    #[error("unknown scheme '{0}'")]
    Scheme(String),
}

/// A bucket's layout defaults for new objects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketConfig {
    /// Format version.
    pub version: u32,
    /// Scheme name (`raid0`, `raid1`, `raid4`, `raid5`, `hybrid`).
    pub scheme: String,
    /// Stripe unit in bytes.
    pub stripe_unit: u32,
    /// Servers to stripe over; `None`: all up when the object is put.
    pub width: Option<u32>,
}

impl BucketConfig {
    /// The config of a layout request.
    pub fn of(layout: &LayoutRequest) -> BucketConfig {
        BucketConfig {
            version: FORMAT_VERSION,
            scheme: layout.scheme.to_string(),
            stripe_unit: layout.stripe_unit,
            width: layout.width,
        }
    }

    /// The layout request it stands for.
    pub fn layout(&self) -> Result<LayoutRequest, MetaError> {
        let scheme: Scheme = self
            .scheme
            .parse()
            .map_err(|_| MetaError::Scheme(self.scheme.clone()))?;
        Ok(LayoutRequest {
            scheme,
            stripe_unit: self.stripe_unit,
            width: self.width,
        })
    }

    /// Decode a marker's bytes.
    pub fn decode(bytes: &[u8]) -> Result<BucketConfig, MetaError> {
        let config: BucketConfig = serde_json::from_slice(bytes)?;
        check_version(config.version)?;
        Ok(config)
    }
}

/// An object's metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectMeta {
    /// Format version.
    pub version: u32,
    /// Id of the file these metadata describe.
    pub file: u64,
    /// The ETag, without quotes (the MD5 of the bytes in hex for a single-part object).
    pub etag: String,
    /// When it was put, in milliseconds since the Unix epoch.
    pub modified_ms: u64,
    /// Content-Type given at the put.
    pub content_type: Option<String>,
    /// User metadata (`x-amz-meta-*`).
    pub metadata: BTreeMap<String, String>,
}

impl ObjectMeta {
    /// Decode a metadata file's bytes.
    pub fn decode(bytes: &[u8]) -> Result<ObjectMeta, MetaError> {
        let meta: ObjectMeta = serde_json::from_slice(bytes)?;
        check_version(meta.version)?;
        Ok(meta)
    }
}

fn check_version(version: u32) -> Result<(), MetaError> {
    if version == FORMAT_VERSION {
        Ok(())
    } else {
        Err(MetaError::Version(version))
    }
}

/// The ETag of an object without (matching) metadata: made from its file id, in the
/// multipart form (`-1`) so that no client takes it for the MD5 of the bytes.
pub fn fallback_etag(file: u64) -> String {
    format!("{file:032x}-1")
}

/// Lowercase hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_other_versions() {
        let layout = LayoutRequest {
            scheme: Scheme::Raid5,
            stripe_unit: 4096,
            width: Some(3),
        };
        let config = BucketConfig::of(&layout);
        let bytes = serde_json::to_vec(&config).unwrap();
        assert_eq!(
            BucketConfig::decode(&bytes).unwrap().layout().unwrap(),
            layout
        );
        let newer = String::from_utf8(bytes)
            .unwrap()
            .replace("\"version\":1", "\"version\":2");
        assert!(matches!(
            BucketConfig::decode(newer.as_bytes()),
            Err(MetaError::Version(2))
        ));
        assert!(BucketConfig::decode(b"{\"version\":1").is_err());
        let meta = ObjectMeta {
            version: 1,
            file: 7,
            etag: hex(&[0xab, 0x01]),
            modified_ms: 1,
            content_type: None,
            metadata: BTreeMap::from([("k".into(), "v".into())]),
        };
        let bytes = serde_json::to_vec(&meta).unwrap();
        assert_eq!(ObjectMeta::decode(&bytes).unwrap(), meta);
        assert_eq!(meta.etag, "ab01");
        assert_eq!(fallback_etag(255).len(), 34);
    }
}
