//! Where buckets and objects live in Tessera's namespace, and which names are refused.
//!
//! The manager's namespace is flat: a path is any string without NUL. The gateway maps
//!
//! - object `KEY` of bucket `B` to the file `B/KEY` (so `tessera ls B/` lists a bucket and
//!   `tessera get B/KEY` reads an object as it was put);
//! - bucket `B` to a marker file `.s3/buckets/B`, holding the bucket's layout defaults
//!   ([`crate::meta::BucketConfig`]). A bucket name never starts with a dot, so no bucket's
//!   objects can fall under `.s3/`; and the marker is not under `B/`, so it is never listed as
//!   an object nor counted when deciding whether a bucket is empty;
//! - the metadata of object `KEY` (ETag, time, user metadata) to `.s3/meta/B/KEY`
//!   ([`crate::meta::ObjectMeta`]).

/// Longest key S3 allows, in bytes.
pub const KEY_BYTES_MAX: usize = 1024;
/// Where bucket markers live.
pub const BUCKETS_PREFIX: &str = ".s3/buckets/";
/// Where object metadata lives.
pub const META_PREFIX: &str = ".s3/meta/";

/// Why a bucket name or key is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The bucket name breaks S3's rules (3-63 of `a-z0-9.-`, starting and ending with a
    /// letter or digit).
    #[error("invalid bucket name '{0}': 3 to 63 of a-z, 0-9, '.' and '-', starting and ending with a letter or digit")]
    Bucket(String),
    /// The key is empty.
    #[error("the key is empty")]
    EmptyKey,
    /// The key is longer than [`KEY_BYTES_MAX`].
    #[error("the key is {0} bytes long; at most {KEY_BYTES_MAX} are allowed")]
    KeyTooLong(usize),
    /// The key holds a NUL byte.
    #[error("the key contains a NUL byte")]
    Nul,
    /// A `/`-separated segment of the key is `.` or `..`: refused so that every key stays a
    /// plain path inside its bucket's directory (for a POSIX view of the same namespace).
    #[error("the key has a '.' or '..' segment")]
    DotSegment,
}

/// Check a bucket name against S3's rules.
pub fn check_bucket(name: &str) -> Result<(), NameError> {
    let bytes = name.as_bytes();
    let allowed = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'.' || *b == b'-';
    let edge = |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    let ok = (3..=63).contains(&bytes.len())
        && bytes.iter().all(allowed)
        && edge(bytes.first())
        && edge(bytes.last())
        && !name.contains("..");
    if ok {
        Ok(())
    } else {
        Err(NameError::Bucket(name.to_string()))
    }
}

/// Check an object key.
pub fn check_key(key: &str) -> Result<(), NameError> {
    if key.is_empty() {
        return Err(NameError::EmptyKey);
    }
    if key.len() > KEY_BYTES_MAX {
        return Err(NameError::KeyTooLong(key.len()));
    }
    if key.contains('\0') {
        return Err(NameError::Nul);
    }
    if key
        .split('/')
        .any(|segment| segment == "." || segment == "..")
    {
        return Err(NameError::DotSegment);
    }
    Ok(())
}

/// The file holding object `key` of `bucket`.
pub fn object_path(bucket: &str, key: &str) -> String {
    format!("{bucket}/{key}")
}

/// The prefix of every object of `bucket`.
pub fn bucket_prefix(bucket: &str) -> String {
    format!("{bucket}/")
}

/// The marker file of `bucket`.
pub fn marker_path(bucket: &str) -> String {
    format!("{BUCKETS_PREFIX}{bucket}")
}

/// The metadata file of object `key` of `bucket`.
pub fn meta_path(bucket: &str, key: &str) -> String {
    format!("{META_PREFIX}{bucket}/{key}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_names() {
        for good in ["abc", "my-bucket.1", "0aa", &"a".repeat(63)] {
            assert_eq!(check_bucket(good), Ok(()), "{good}");
        }
        for bad in [
            "ab",
            ".s3",
            "Abc",
            "a_b",
            "abc-",
            "-abc",
            "a..b",
            "",
            &"a".repeat(64),
        ] {
            assert!(check_bucket(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn keys() {
        for good in ["a", "a/b/c", "dir/", "a..b", ".hidden", "x/.y/z", "ü/ß"] {
            assert_eq!(check_key(good), Ok(()), "{good}");
        }
        assert_eq!(check_key(""), Err(NameError::EmptyKey));
        assert_eq!(check_key("a\0b"), Err(NameError::Nul));
        for bad in ["..", "../x", "a/../b", "a/..", "./a", "a/./b"] {
            assert_eq!(check_key(bad), Err(NameError::DotSegment), "{bad}");
        }
        assert_eq!(check_key(&"k".repeat(1024)), Ok(()));
        assert_eq!(
            check_key(&"k".repeat(1025)),
            Err(NameError::KeyTooLong(1025))
        );
    }

    #[test]
    fn paths_do_not_collide() {
        // No bucket's objects can fall under the gateway's own prefixes.
        assert!(check_bucket(".s3").is_err());
        assert_eq!(object_path("b1b", "k/x"), "b1b/k/x");
        assert_eq!(marker_path("b1b"), ".s3/buckets/b1b");
        assert_eq!(meta_path("b1b", "k/x"), ".s3/meta/b1b/k/x");
        assert!(!marker_path("b1b").starts_with(&bucket_prefix("b1b")));
    }
}
